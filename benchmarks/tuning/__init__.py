"""Benchmarks: tuning (see benchmarks/__init__.py)."""
