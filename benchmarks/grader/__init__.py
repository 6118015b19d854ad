"""Benchmarks: grader (see benchmarks/__init__.py)."""
