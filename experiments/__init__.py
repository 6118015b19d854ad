"""Measured experiments kept runnable apart from the course code: they may import ``reference``, never the
other way round (tests/test_layout.py). ``gluon_schedules``: the Gluon forward's ablations (lecture 06)."""
