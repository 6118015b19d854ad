"""Grade attention-course submissions in a sandbox (python -m autograder COMMAND ...).

Commands:
  grade       grade one submission (a student's .ipynb or a .py module) and print the score table
  grade-all   grade every submission in a folder, in parallel, into a roster CSV and one JSON each
  selftest    grade the bundled correct, wrong and cheating submissions; fails if any gets the wrong score
  gradescope  build a Gradescope autograder zip (setup.sh, run_autograder) for one assignment

Examples:
  python -m autograder grade a2_flash_numpy alice.ipynb --json alice.json
  python -m autograder grade --example                   # the bundled a1 example notebook
  python -m autograder grade-all a2 submissions/ -j 4 --csv grades.csv
  python -m autograder selftest -j 2
  python -m autograder gradescope a3_triton -o a3.zip

Each submission runs in its own sandboxed process; hidden cases come from a secret seed and are judged in the
grader, never in the submission's process (the threat model is in docs/design.md §6). GPU speed tests run only
with a CUDA device; elsewhere they are reported as "not run" and left out of the maximum score.

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

_RAW = argparse.RawDescriptionHelpFormatter
EXAMPLE = Path(__file__).resolve().parent / "examples" / "a1_attention_example.ipynb"


_DEVICES = ("auto", "cpu", "cuda")


def _command(sub, name, help, description, *examples):
    """One subcommand's parser; its epilog lists ``examples`` (arguments after ``python -m autograder``)."""
    epilog = ("example:" if len(examples) == 1 else "examples:") + "".join(
        f"\n  python -m autograder {e}" for e in examples)
    return sub.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=_RAW)


def _add_assignment(p, **kw):
    p.add_argument("assignment", help=f"one of {', '.join(specs.ASSIGNMENTS)} (or a short id: a1, a3b, ...)", **kw)


def _add_jobs(p):
    p.add_argument("-j", "--jobs", type=int, default=2, help="submissions graded at the same time (default 2)")


def _add_device(p, default="auto", help="where kernels and speed tests run (auto: cuda when a GPU is present)"):
    p.add_argument("--device", choices=_DEVICES, default=default, help=help)


def _parser():
    head, _, rest = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(prog="python -m autograder", description=head, epilog=rest, formatter_class=_RAW)
    sub = p.add_subparsers(dest="cmd", required=True)

    g = _command(sub, "grade", "grade one submission (.ipynb or .py)",
                 "Grade one submission and print the score table; --json writes the result.",
                 "grade a2_flash_numpy alice.ipynb --json alice.json")
    _add_assignment(g, nargs="?")
    g.add_argument("submission", nargs="?", help="student notebook or .py module")
    g.add_argument("--example", action="store_true", help="grade the bundled example notebook (a1)")
    g.add_argument("--json", help="write the result JSON here")
    g.add_argument("--gradescope", help="also write Gradescope's results.json here")
    _add_device(g)
    g.add_argument("--quiet", action="store_true", help="no table (for grade-all)")
    g.add_argument("-v", "--verbose", action="store_true", help="notes in full, not cut to the terminal's width")
    g.add_argument("--test", action="append", metavar="NAME",
                   help="grade only the tests whose name contains NAME (repeatable; with --seed: the same cases)")
    g.add_argument("--seed", type=int, help="replay an earlier run's cases (its seed is in the result JSON and in the "
                                           "reproduction line under the table)")
    g.add_argument("--case-timeout", type=float, metavar="S",
                   help="stop any case after S seconds, where the spec allows more (a submission known to hang)")

    a = _command(sub, "grade-all", "grade a folder of submissions in parallel",
                 "Grade every .ipynb/.py submission in a folder into a roster CSV (one row per student) and one JSON "
                 "per submission.", "grade-all a2_flash_numpy submissions/ -j 4 --csv grades.csv")
    _add_assignment(a)
    a.add_argument("dir", help="folder of submissions: .ipynb/.py files, or one subfolder per student (an LMS "
                               "download; the file named for the assignment is graded)")
    _add_jobs(a)
    a.add_argument("--csv", default="grades.csv", help="roster CSV to write (default grades.csv)")
    a.add_argument("--out", help="folder for the per-submission JSONs (default: grades/<assignment>)")
    _add_device(a)
    a.add_argument("--gpus", default="all",
                   help="on cuda: the GPUs to grade on, 'all' visible ones (default), a count N, or a list "
                        "such as 0,2; each grading gets one, and speed tests take turns on each GPU")
    a.add_argument("--case-timeout", type=float, metavar="S",
                   help="stop any case after S seconds, where the spec allows more (a roster with a submission known "
                        "to hang)")

    s = _command(sub, "selftest", "grade the bundled correct/wrong/cheating submissions",
                 "Grade the bundled correct, wrong and cheating submissions (and the solution sources and student "
                 "stubs); exit 1 if any lands outside its expected band.",
                 "selftest -j 2", "selftest --only a3 --device cuda")
    s.add_argument("--only", nargs="*", help="assignments to include (default: all)")
    _add_jobs(s)
    _add_device(s, "cpu", "cpu (default) or cuda: GPU-only submissions (side streams, slow kernels) need cuda")
    s.add_argument("--out", help="folder for the JSONs (default: build/selftest)")
    s.add_argument("--match", nargs="*", help="only submissions whose label contains one of these")

    z = _command(sub, "gradescope", "build a Gradescope autograder zip",
                 "Build a Gradescope autograder zip (setup.sh, run_autograder) for one assignment.",
                 "gradescope a2_flash_numpy -o a2.zip")
    _add_assignment(z)
    z.add_argument("-o", "--output", required=True, help="zip file to write")
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
    result = Grader(aid, device, seed=args.seed, log=log, only=args.test,
                    case_timeout=args.case_timeout).grade(args.submission)
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
    from .grade_all import choose_gpus, collect, grade_many, summary, unpicked, visible_gpus, write_csv, \
        write_report
    from .engine import detect_device
    from .report import write_json
    aid = specs.resolve(args.assignment)
    # every path is the caller's (relative to the folder grade-all was started in), never the repository's
    folder = os.path.abspath(args.dir)
    paths, names, problems = collect(folder, aid)
    if not paths and not problems:
        print(f"grade-all: no submissions in {folder}: expected .ipynb/.py files, or one subfolder per student "
              f"holding one (found: {', '.join(sorted(os.listdir(folder))[:20]) or 'an empty folder'})",
              file=sys.stderr)
        return 1
    out = os.path.abspath(args.out or os.path.join("grades", aid))
    csv_path = os.path.abspath(args.csv)
    device = detect_device(args.device)
    gpus = choose_gpus(args.gpus, visible_gpus()) if device == "cuda" else None
    if gpus:
        print(f"grading on GPU(s) {', '.join(gpus)} (one timing lane each), {args.jobs} at a time", flush=True)
    extra = ("--case-timeout", str(args.case_timeout)) if args.case_timeout else ()
    results = grade_many(aid, paths, out, args.jobs, device, names=names, gpus=gpus, extra=extra)
    for name, r in unpicked(aid, problems).items():
        results[name] = r
        names[name] = name
        write_json(r, os.path.join(out, f"{name}.json"))
        write_report(r, os.path.join(out, f"{name}.txt"), name)
        print(f"grade-all: {name}: {problems[name]}", file=sys.stderr)
    rows = write_csv(results, csv_path, names)
    print(summary(rows))
    hist = os.path.join(out, "histogram.png")
    try:
        from .histogram import write_histogram
        write_histogram(rows, hist, aid)
    except ImportError as exc:
        hist = f"not drawn ({exc})"
    print(f"CSV: {csv_path}; JSONs and text reports: {out}/; histogram: {hist}")
    # nothing graded at all (every subfolder without a single submission) is a failure too
    return 1 if not paths or any(r["status"] == "grader-error" for r in rows) else 0


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
