"""``python -m autograder selftest``: grade every bundled submission and fail unless each lands in its band.

Bundled: ``autograder/submissions/<aid>/{correct,wrong,cheat}/*`` with ``expected.json`` per folder (file name
-> expectation), the assignments' solution sources (must score 100% of what the device can grade, the
bonus included) and the
generated student notebooks (all stubs: must score 0 without breaking the grader). Expectation keys:

* ``score``: ``[lo, hi]`` percent of max_score, the required tests' points (optional tests are bonus, outside
  it); ``bonus``: ``[lo, hi]`` percent of max_bonus (checked only where bonus tests ran);
* ``fail``: substrings of test names that must score 0; ``may_fail``: substrings of test names that may score
  anything (e.g. a GPU speed test whose timed outputs are re-checked, not run on a CPU); ``others_pass``: every
  other test must pass in full;
  ``pass``: substrings of test names that must pass in full (each must match a test that ran);
* ``flags``: threat ids that must be raised; ``no_flags``: none may be (a crash is not cheating); ``output``:
  texts some failed test's output must contain (a crash's diagnosis; a list of texts: any one of them, e.g. the
  interpreter's and a GPU's words for the same fault); ``zero_tasks``: task ids whose tests must
  all score 0;
* ``case_timeout``: the grading's time limit per case, in seconds, where the spec's is longer (an entry that
  hangs on purpose need not spin for the spec's whole limit);
* ``lose``: task id -> the least percentage of that task's points (of the tests that ran) it must lose (a kernel
  right only within one tile: >= 70%);
* ``min_ratio``: test-name substring -> the least student/reference time ratio its speed test may show (a
  submission that hides work from the timer shows a tiny ratio); the test must have run;
* ``device``: ``"cuda"`` for a GPU-only submission (e.g. side CUDA streams): listed as skipped on CPU.

Cheats that try to leave a process behind run one whose command line carries ``ESCAPE_MARKER``; after
grading, any such process still alive fails the selftest (and is killed): nothing of a submission may
survive its grading.

Speed tests on partial credit depend on machine load, so their missing points count as slack in the score band
and they count as passing for ``others_pass``; a speed test at 0 is a failure like any other.

A wrong or cheating submission that differs from a correct one by a few lines is stored as a *mutant*,
``<name>.mutant.json`` = ``{"base": path from the repo root, "why": text, "edits": [{"old", "new", "count"}]}``,
and written out as ``<name>.py`` under ``build/selftest_mutants/`` before grading (its expectation key is
``<name>.py``). Each ``old`` must occur exactly ``count`` (default 1) times in the base, so a mutant whose base
has changed fails loudly instead of silently testing nothing.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from . import specs
from .sandbox import REPO

HERE = Path(__file__).resolve().parent
SUB = HERE / "submissions"


MUTANTS = Path(REPO) / "build" / "selftest_mutants"
ESCAPE_MARKER = "autograder-escape-test"


def survivors(marker: str = ESCAPE_MARKER) -> list[int]:
    """PIDs of live processes whose command line contains ``marker`` (left behind by a graded submission)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


def materialise_mutant(spec_path: Path, out_dir: Path = MUTANTS) -> Path:
    """Write the submission a ``*.mutant.json`` describes (its base with the edits applied); return its path."""
    spec = json.loads(spec_path.read_text())
    base = Path(REPO) / spec["base"]
    text = base.read_text()
    for e in spec["edits"]:
        n = text.count(e["old"])
        if n != e.get("count", 1):
            raise ValueError(f"{spec_path.name}: edit {e['old']!r} occurs {n} times in {spec['base']}, "
                             f"expected {e.get('count', 1)} (the base changed: update the mutant)")
        text = text.replace(e["old"], e["new"])
    kind = spec_path.parent.name               # wrong | cheat
    header = "".join(f"# {line}\n" for line in [f"Autograder selftest, {kind} on purpose (a mutant of "
                                                 f"{spec['base']}):", *spec["why"].split("\n")])
    name = spec_path.name[: -len(".mutant.json")] + ".py"
    dest = out_dir / spec_path.parent.parent.name / spec_path.parent.name / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(header + text)
    return dest


def collect(only=None):
    """[(assignment, path, expectation, label)]"""
    items = []
    for aid in specs.ASSIGNMENTS:
        if only and aid not in only and aid.split("_")[0] not in only:
            continue
        for kind in ("correct", "wrong", "cheat"):
            folder = SUB / aid / kind
            exp_file = folder / "expected.json"
            exp = json.loads(exp_file.read_text()) if exp_file.exists() else {}
            default = exp.get("_default", {"correct": {"score": [100, 100]}, "wrong": {},
                                           "cheat": {"score": [0, 10]}}.get(kind, {}))
            if folder.is_dir():
                for p in sorted(folder.iterdir()):
                    if p.name.endswith(".mutant.json"):
                        m = materialise_mutant(p)
                        items.append((aid, m, exp.get(m.name, default), f"{aid}/{kind}/{p.name}"))
                    elif p.suffix in (".py", ".ipynb") and not p.name.startswith("_"):
                        items.append((aid, p, exp.get(p.name, default), f"{aid}/{kind}/{p.name}"))
        sol = Path(REPO) / "assignments" / aid / f"{aid}_solution.py"
        if sol.exists():
            items.append((aid, sol, {"score": [100, 100], "bonus": [100, 100], "others_pass": True},
                          f"{aid}/solution source"))
        nb = Path(REPO) / "assignments" / aid / f"{aid}.ipynb"
        if nb.exists():
            items.append((aid, nb, {"score": [0, 0], "bonus": [0, 0]}, f"{aid}/student notebook (stubs)"))
    return items


def graded_tests(aid, exp) -> list[str] | None:
    """The names of the tests to grade for an entry with expectation ``exp`` (None: all of them).

    Optional (bonus) tests are graded only where the expectation looks at them: a ``bonus`` band, or a
    ``fail``/``pass``/``min_ratio`` pattern that matches them. Elsewhere their result is checked by nothing
    (``others_pass`` aside, which would only say that a mutant of another part leaves the bonus part alone),
    and a3's FP8 part costs about 3.5 s of interpreter CPU per grading. Each test draws its
    cases from its own stream of the seed, so leaving one out changes no other test's cases."""
    spec = specs.load(aid)
    named = [*exp.get("fail", []), *exp.get("pass", []), *exp.get("min_ratio", {})]
    keep = [t.name for t in spec.tests
            if not t.optional or "bonus" in exp or any(pat in t.name for pat in named)]
    return None if len(keep) == len(spec.tests) else keep


@contextlib.contextmanager
def shared_compile_verdicts():
    """The gradings started inside share their sm_90a compile verdicts through a temporary folder (or the one the
    caller named in ``host_policy.CACHE_ENV``). Only for the bundled submissions: a verdict is found by the key a
    grading child reports for its kernel."""
    from .host_policy import CACHE_ENV
    if os.environ.get(CACHE_ENV):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="autograder-compiled-") as folder:
        os.environ[CACHE_ENV] = folder
        try:
            yield
        finally:
            os.environ.pop(CACHE_ENV, None)


def check_expectation(result, exp):
    """List of problems (empty: as expected)."""
    problems = []
    if result.get("grader_error"):
        return [f"grader error: {result['grader_error'][:300]}"]
    tests = [t for t in result["tests"] if t["status"] != "not run"]
    # A speed test on partial credit reflects machine load as much as the code (CI runs the selftest beside
    # other tests on 2 cores): its missing points are slack, and it counts as passing for ``others_pass``.
    # A speed test at 0 (wrong timed output, hidden work, a crash, or >= the zero ratio) is still a failure.
    partial = [t for t in tests if t.get("kind") == "speed" or "speed" in t["name"]]
    partial = [t for t in partial if 0 < t["score"] < t["max_score"]]
    # the score band is over the required tests (result["score"]), the bonus band over the optional ones
    for key, total, optional in (("score", "max_score", False), ("bonus", "max_bonus", True)):
        if optional and (key not in exp or not result.get(total)):
            continue                      # no band, or no bonus test ran here (none in the spec, or not here)
        mx = result.get(total) or 1.0
        slack = sum(t["max_score"] - t["score"] for t in partial if bool(t.get("optional")) == optional)
        got = result.get(key, 0.0)
        pct, pct_hi = 100.0 * got / mx, 100.0 * (got + slack) / mx
        lo, hi = exp.get(key, [0, 100])
        if pct_hi < lo - 1e-6 or pct > hi + 1e-6:
            problems.append(f"{key} {pct:.1f}% outside [{lo}, {hi}]")
    must_fail = exp.get("fail", [])
    for pat in must_fail:
        hit = [t for t in tests if pat in t["name"]]
        if not hit:
            problems.append(f"no test matches {pat!r}")
        for t in hit:
            if t["score"] > 0:
                problems.append(f"{t['name']} should fail but scored {t['score']}")
    for pat in exp.get("pass", []):
        hit = [t for t in tests if pat in t["name"]]
        if not hit:
            problems.append(f"no test matches {pat!r}")
        for t in hit:
            if t["score"] < t["max_score"] - 1e-9:
                problems.append(f"{t['name']} should pass: {t['output'][:160]}")
    if exp.get("others_pass"):
        may_fail = [*must_fail, *exp.get("may_fail", [])]
        for t in tests:
            if (not any(p in t["name"] for p in may_fail) and t["score"] < t["max_score"] - 1e-9
                    and t not in partial):
                problems.append(f"{t['name']} should pass: {t['output'][:160]}")
    for pat, lo_ratio in exp.get("min_ratio", {}).items():
        hit = [t for t in tests if pat in t["name"] and "ratio" in t]
        if not hit:
            problems.append(f"no speed test matching {pat!r} ran (needed for min_ratio)")
        for t in hit:
            if t["ratio"] < lo_ratio:
                problems.append(f"{t['name']}: {t['ratio']:.2f}x the reference time < {lo_ratio} (work hidden "
                                "from the timer?)")
    ids = {f["id"] for f in result.get("flags", [])}
    for f in exp.get("flags", []):
        if f not in ids:
            problems.append(f"flag {f} not raised (got {sorted(ids) or 'none'})")
    if exp.get("no_flags") and ids:
        problems.append(f"no flag expected, got {sorted(ids)} (a crash or a wrong answer is not cheating)")
    for text in exp.get("output", []):
        texts = [text] if isinstance(text, str) else list(text)
        if not any(x in t["output"] for t in tests if t["score"] < t["max_score"] for x in texts):
            problems.append(f"no failed test says {' or '.join(map(repr, texts))}")
    for task, pct in exp.get("lose", {}).items():
        mx = sum(t["max_score"] for t in tests if t["task"] == task)
        got = sum(t["score"] for t in tests if t["task"] == task)
        if mx <= 0:
            problems.append(f"no test of {task} ran (needed for lose)")
        elif got > mx * (1 - pct / 100) + 1e-9:
            problems.append(f"{task} kept {100 * got / mx:.0f}% of its points; it must lose >= {pct}%")
    for task in exp.get("zero_tasks", []):
        sc = sum(t["score"] for t in tests if t["task"] == task)
        if sc > 0:
            problems.append(f"{task} should score 0, got {sc}")
    return problems


def run(only=None, jobs=2, device="cpu", out_dir=None, verbose=True, match=None) -> int:
    if device == "auto":
        from .engine import detect_device
        device = detect_device("auto")
    items = collect(only)
    if match:
        items = [it for it in items if any(m in it[3] for m in match)]
    skipped = [it for it in items if it[2].get("device", device) != device]
    items = [it for it in items if it not in skipped]
    out_dir = out_dir or os.path.join(REPO, "build", "selftest")
    t0 = time.monotonic()
    by_aid = {}
    for aid, p, exp, label in items:
        by_aid.setdefault(aid, []).append((p, exp, label))
    # one pool over everything keeps every worker busy; JSON names are unique per assignment and folder
    results = {}
    paths = [(aid, p) for aid, lst in by_aid.items() for p, _, _ in lst]
    from concurrent.futures import ThreadPoolExecutor, as_completed
    try:
        from tqdm import tqdm
    except ImportError:                      # the GPU machine may lack it: no progress bar there
        class tqdm:  # noqa: N801
            def __init__(self, **kw):
                pass

            def update(self, n):
                pass

            def close(self):
                pass
    from .grade_all import forking, grade_one
    from .zygote import running
    bar = tqdm(total=len(paths), desc="selftest", unit="sub", disable=not verbose)
    # zygotes (zygote.py): the Triton gradings' children start with torch and Triton imported, the NumPy
    # gradings' with NumPy (no torch zygote where every grading is NumPy: its start imports torch and Triton for
    # nothing); one folder of GPU-target compile verdicts (host_policy.CACHE_ENV): a kernel the zoo's entries
    # share is compiled once
    torch_gradings = any(specs.load(aid).needs_torch for aid in by_aid)
    numpy_gradings = any(not specs.load(aid).needs_torch for aid in by_aid)
    kinds = ("torch", "compile") * torch_gradings + ("numpy",) * numpy_gradings
    with running(device, kinds) as no_zygote, \
            shared_compile_verdicts(), forking(device, len(paths), by_aid) as forks, \
            ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {}
        for aid, lst in by_aid.items():
            for p, exp, _label in lst:
                name = f"{aid}__{p.parent.name}__{p.stem}"
                keep = graded_tests(aid, exp)
                extra = [a for n in keep for a in ("--test", n)] if keep is not None else []
                if exp.get("case_timeout"):
                    extra += ["--case-timeout", str(exp["case_timeout"])]
                futs[pool.submit(grade_one, aid, p, os.path.join(out_dir, name + ".json"), device,
                                 extra=extra, forks=forks)] = (aid, p)
        for fut in as_completed(futs):
            results[futs[fut]] = fut.result()
            bar.update(1)
    bar.close()
    bad = 0
    lines = []
    for aid, lst in by_aid.items():
        for p, exp, label in lst:
            r = results[(aid, p)]
            problems = check_expectation(r, exp)
            pct = 100.0 * r["score"] / r["max_score"] if r.get("max_score") else 0.0
            bonus = f" + {r.get('bonus', 0):g}/{r['max_bonus']:g} bonus" if r.get("max_bonus") else ""
            flags = ",".join(sorted({f["id"] for f in r.get("flags", [])}))
            status = "ok  " if not problems else "FAIL"
            bad += bool(problems)
            lines.append(f"{status} {label:55s} {pct:6.1f}%{bonus}  flags [{flags}]  "
                         f"{r.get('execution_time', 0):.1f}s")
            for prob in problems:
                lines.append(f"       - {prob}")
    left = survivors()
    if left:
        bad += 1
        lines.append(f"FAIL {len(left)} process(es) of graded submissions survived grading: {left} (killed now)")
        for pid in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
    for _aid, _p, exp, label in skipped:
        lines.append(f"skip {label:55s} (needs --device {exp['device']})")
    if verbose:
        print("\n".join(lines))
        print(f"selftest: {len(items) - bad}/{len(items)} as expected in {time.monotonic() - t0:.0f} s "
              f"(device {device}, -j {jobs}, {'zygote' if not no_zygote else no_zygote}"
              f"{', forked graders' if forks is not None else ''}"
              f"{f', {len(skipped)} skipped: other device' if skipped else ''}); JSONs in {out_dir}")
    return 1 if bad else 0
