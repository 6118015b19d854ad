"""The course's benchmarks, a package: run each as ``python -m benchmarks.<job>.<script>`` from the repository root.

``course/``: the numbers the README, docs/results.md and the lectures quote; ``tuning/``: the sweeps that chose
the pinned configurations; ``grader/``: autograder timing and speed calibration; ``_common.py``: device tag,
timing, errors, copy bandwidth, SDPA baselines (needs torch); ``quoted_numbers.py``: every quoted number, derived
from ``results/`` (``<gpu>-<benchmark>.json`` and plots, one per benchmark and GPU; earlier runs live in git).
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root
RESULTS = ROOT / "benchmarks" / "results"


def results_parser(doc: str):
    """An ``argparse`` parser described by the first line of ``doc`` (a script's ``__doc__``), with ``--out``
    (the results folder, default ``RESULTS``); a script adds its own options to it."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS), help="folder for the results file (default: %(default)s)")
    return ap


def write_json(out, name: str, doc) -> Path:
    """Write ``doc`` as ``out/name`` (JSON, one-space indent, a final newline; ``out`` made if missing); return the
    path."""
    import json
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def run_and_write(doc: str, name: str, run, report=None, argv=None) -> int:
    """The ``main`` of a CPU driver: parse ``--out`` (``results_parser(doc)``), ``res = run()``, write it as
    ``<out>/<name>`` (``write_json``), then ``report(res, out)`` (tables, plots); return the exit status 0."""
    args = results_parser(doc).parse_args(argv)
    res = run()
    path = write_json(args.out, name, res)
    if report is not None:
        report(res, args.out)
    print(f"wrote {path}")
    return 0
