"""Command line: ``python -m autograder grade|grade-all|selftest|gradescope`` (docs/design.md §6).

Exit status: 0 whenever grading completed (whatever the score); non-zero only when the grader itself failed
(bad arguments, an internal error, or in grade-all a submission whose grader process failed).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from . import specs

EXAMPLE = Path(__file__).resolve().parent / "examples" / "a1_attention_example.ipynb"


def _parser():
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("grade", help="grade one submission (.ipynb or .py)")
    g.add_argument("assignment", nargs="?", help=f"one of {', '.join(specs.ASSIGNMENTS)} (or a1..a5)")
    g.add_argument("submission", nargs="?", help="student notebook or .py module")
    g.add_argument("--example", action="store_true", help="grade the bundled example notebook (a1)")
    g.add_argument("--json", help="write the result JSON here")
    g.add_argument("--gradescope", help="also write Gradescope's results.json here")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g.add_argument("--quiet", action="store_true", help="no table (for grade-all)")
    g.add_argument("-v", "--verbose", action="store_true", help="notes in full, not cut to the terminal's width")
    g.add_argument("--test", action="append", metavar="NAME",
                   help="grade only the tests whose name contains NAME (repeatable; with --seed: the same cases)")
    g.add_argument("--seed", type=int, help=argparse.SUPPRESS)     # reproducing a run while debugging the grader

    a = sub.add_parser("grade-all", help="grade a folder of submissions in parallel")
    a.add_argument("assignment")
    a.add_argument("dir")
    a.add_argument("-j", "--jobs", type=int, default=2)
    a.add_argument("--csv", default="grades.csv")
    a.add_argument("--out", help="folder for the per-submission JSONs (default: grades/<assignment>)")
    a.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")

    s = sub.add_parser("selftest", help="grade the bundled correct/wrong/cheating submissions")
    s.add_argument("--only", nargs="*", help="assignments to include (default: all)")
    s.add_argument("-j", "--jobs", type=int, default=2)
    s.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    s.add_argument("--out", help="folder for the JSONs (default: build/selftest)")
    s.add_argument("--match", nargs="*", help="only submissions whose label contains one of these")

    z = sub.add_parser("gradescope", help="build a Gradescope autograder zip")
    z.add_argument("assignment")
    z.add_argument("-o", "--output", required=True)
    return p


def cmd_grade(args) -> int:
    from .engine import Grader, detect_device
    from .report import table, to_gradescope, write_json
    if args.example:
        args.assignment, args.submission = "a1_attention", str(EXAMPLE)
    if not args.assignment or not args.submission:
        print("grade: give ASSIGNMENT and SUBMISSION (or --example)", file=sys.stderr)
        return 2
    aid = specs.resolve(args.assignment)
    if not os.path.exists(args.submission):
        print(f"grade: submission {args.submission} does not exist", file=sys.stderr)
        return 2
    device = detect_device(args.device)
    log = None
    if not args.quiet:
        print(f"grading {args.submission} for {aid} on {device} ...", flush=True)
        log = _progress(len(specs.load(aid).tests))
    result = Grader(aid, device, seed=args.seed, log=log, only=args.test).grade(args.submission)
    if args.json:
        write_json(result, args.json)
    if args.gradescope:
        write_json(to_gradescope(result), args.gradescope)
    if not args.quiet:
        print(table(result, verbose=args.verbose))
    return 0


def _progress(total):
    """Progress on one line of a terminal, rewritten per test (the table lists each test once, at the end);
    nothing when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return None
    done = [0]

    def log(r):
        done[0] += 1
        cols = max(20, shutil.get_terminal_size().columns - 1)
        line = f"[{done[0]}/{total}] {r.status:7s} {r.name}"[:cols]
        print(f"\r{line.ljust(cols)}", end="\r" if done[0] < total else "\r" + " " * cols + "\r",
              file=sys.stderr, flush=True)
    return log


def cmd_grade_all(args) -> int:
    from .grade_all import find_submissions, grade_many, summary, write_csv
    from .engine import detect_device
    aid = specs.resolve(args.assignment)
    # every path is the caller's (relative to the folder grade-all was started in), never the repository's
    paths = find_submissions(os.path.abspath(args.dir))
    out = os.path.abspath(args.out or os.path.join("grades", aid))
    csv_path = os.path.abspath(args.csv)
    device = detect_device(args.device)
    results = grade_many(aid, paths, out, args.jobs, device)
    rows = write_csv(results, csv_path)
    print(summary(rows))
    print(f"CSV: {csv_path}; JSONs: {out}/")
    return 1 if any(r["status"] == "grader-error" for r in rows) else 0


def cmd_selftest(args) -> int:
    from .selftest import run
    return run(args.only, args.jobs, args.device, args.out, match=args.match)


def cmd_gradescope(args) -> int:
    from .gradescope import build_zip
    path = build_zip(args.assignment, args.output)
    print(f"wrote {path} (upload it as the Gradescope autograder for {specs.resolve(args.assignment)})")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"grade": cmd_grade, "grade-all": cmd_grade_all, "selftest": cmd_selftest,
                "gradescope": cmd_gradescope}[args.cmd](args)
    except ValueError as exc:
        print(f"{args.cmd}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
