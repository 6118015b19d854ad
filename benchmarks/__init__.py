"""The course's benchmarks, a package: run each as ``python -m benchmarks.<job>.<script>`` from the repository root.

``course/``: the numbers the README, docs/results.md and the lectures quote; ``tuning/``: the sweeps that chose
the pinned configurations; ``grader/``: autograder timing and speed calibration; ``_common.py``: device tag,
timing, errors, copy bandwidth, SDPA baselines (needs torch); ``quoted_numbers.py``: every quoted number, derived
from ``results/`` (``<gpu>-<benchmark>.json`` and plots, one per benchmark and GPU; earlier runs live in git).
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root
RESULTS = ROOT / "benchmarks" / "results"
