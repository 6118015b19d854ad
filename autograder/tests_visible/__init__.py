"""``make check``: the course's visible checks as pytest tests, run on the student's own notebook (adapter.py)."""
