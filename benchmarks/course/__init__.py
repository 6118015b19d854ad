"""Benchmarks: course (see benchmarks/__init__.py)."""
