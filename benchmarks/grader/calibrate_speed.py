"""Calibrate the autograder's GPU speed tests: how much does the graded time ratio of a submission move between
runs, and does a solution at the reference's speed always get full points while a slow one loses them?

For each subject (the a3/a3b/a4/a5 solution sources and the bundled slow submissions, ``s_*.mutant.json`` in
``autograder/submissions/<assignment>/wrong/``) the script starts ``--gradings`` fresh graders (fresh sandboxed
children: new compilation, new autotuning) and in each runs every speed test of the assignment ``--repeats``
times with ``--reps`` timed reps per case (instead of the spec's count, so that fewer reps can be simulated
afterwards by subsampling). It records every timed call (student and reference, per case and rep), the graded
ratio and score of each run, and, for the spec's own rep count, the ratio a run would have graded with any
``reps`` of the recorded ones (all contiguous windows). A diagnostic part times single calls in this process
(synchronised, like the grader) and GPU time (``triton.testing.do_bench``) of the solution, the reference with
and without its device-syncing input checks, and the assignment's given input check alone, on the speed cases.

    python3 -m benchmarks.grader.calibrate_speed --out $OUT/speed_calibration.json            # on a GPU
    python3 -m benchmarks.grader.calibrate_speed --smoke --out /tmp/cal.json --only a5        # plumbing test on CPU

``--smoke`` runs on the CPU with tiny cases (Triton interpreter): it checks the plumbing, not the numbers.
The JSON is rewritten after every subject, so a run cut short still leaves what it measured. Thresholds and
rep counts chosen from these numbers are in ``notes/speed_calibration.md``.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import linecache
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from autograder import specs as specs_mod
from autograder.engine import Grader, pick_time
from autograder.selftest import materialise_mutant
from autograder.submission import load_cells
from benchmarks import ROOT

ASSIGNMENTS = ("a5_paged", "a4_decoding", "a3_triton", "a3b_triton_backward")

# --smoke: tiny speed cases so the whole pipeline runs in the Triton interpreter on a CPU
SMOKE_CASES = {
    "a3.softmax": [dict(shape=(8, 100), dtype="float32")],
    "a3.flash_attention_forward_basic": [dict(B=1, Hq=2, Hkv=2, Nq=40, Nk=40, d=16, dtype="float32")],
    "a3.flash_attention_forward": [dict(B=1, Hq=2, Hkv=2, Nq=40, Nk=40, d=16, dtype="float32", causal=True)],
    "a3b.flash_attention_backward": [dict(B=1, Hq=2, Hkv=1, Nq=40, Nk=40, d=16, dtype="float32", causal=True,
                                          timing_only=True)],
    "a4.flash_decode": [dict(B=1, Hq=4, Hkv=2, N=100, d=16, dtype="float32", torch=True)],
    "a5.paged_decode": [dict(Hq=4, Hkv=2, d=16, dtype="float32", block_size=16, lens=[50, 9], torch=True)],
}


def subjects(aid):
    """[(label, path)]: the solution source, then the bundled slow submissions of the assignment."""
    out = [("solution", ROOT / "assignments" / aid / f"{aid}_solution.py")]
    for p in sorted((ROOT / "autograder" / "submissions" / aid / "wrong").glob("s_*.mutant.json")):
        out.append((p.name[: -len(".mutant.json")], materialise_mutant(p)))
    return out


def speed_tests(spec, smoke):
    """The spec's speed tests; under ``smoke`` with tiny cases and runnable on the CPU."""
    tests = [t for t in spec.tests if t.kind == "speed" and t.gpu_only]
    if smoke:
        tests = [dataclasses.replace(t, gpu_only=False, hidden=lambda r, c=SMOKE_CASES[t.task]: list(c))
                 for t in tests]
    return tests


def one_grading(aid, path, device, repeats, reps, smoke):
    """One fresh grader: every speed test ``repeats`` times with ``reps`` timed reps per case."""
    g = Grader(aid, device)
    g.cells, g.results, g.dead_tasks, g._flooded = load_cells(path), [], {}, set()
    calls = []
    timed = g._timed

    def recording_timed(sb, task, header, arrays, fetch, on_trap=None, **kw):
        h, a, wall, child = timed(sb, task, header, arrays, fetch, on_trap, **kw)
        host = child.get("host") if isinstance(child, dict) else child
        calls.append({"who": "reference" if sb is g.ref_sandbox else "student", "wall": wall, "child": host,
                      "device": child.get("device") if isinstance(child, dict) else None,
                      "t": pick_time(wall, host) if wall is not None else None})
        return h, a, wall, child

    g._timed = recording_timed
    runs = []
    try:
        for test in speed_tests(g.spec, smoke):
            spec_reps = test.reps
            test = dataclasses.replace(test, reps=reps)
            task = g.spec.tasks[test.task]
            for r in range(repeats):
                calls.clear()
                t0 = time.monotonic()
                res = g.run_test(test, task)
                runs.append({"test": test.name, "repeat": r, "spec_reps": spec_reps, "reps": reps,
                             "speed_full": test.speed_full, "speed_zero": test.speed_zero,
                             "points": test.points, "score": res.score, "status": res.status,
                             "ratio": res.extra.get("ratio"), "output": res.output,
                             "cases": res.extra.get("speed", []), "calls": _by_case(list(calls), reps),
                             "seconds": round(time.monotonic() - t0, 2)})
    finally:
        for sb in (g.sandbox, g.ref_sandbox):
            if sb is not None:
                sb.stop()
    return runs


def _by_case(calls, reps):
    """Timed calls grouped per case: ``[{"student": [t...], "reference": [t...]}]`` without the warm-up rep."""
    per = 2 * (reps + 1)
    cases = []
    for i in range(0, len(calls), per):
        chunk = calls[i:i + per]
        st = [c["t"] for c in chunk[2:] if c["who"] == "student"]
        rt = [c["t"] for c in chunk[2:] if c["who"] == "reference"]
        cases.append({"student": st, "reference": rt})
    return cases


def windowed_ratios(run, n):
    """The graded ratio (geometric mean over cases of median student / median reference) that a run would
    give with ``n`` reps, for every window of ``n`` consecutive recorded reps."""
    cases = [c for c in run["calls"] if len(c["student"]) >= n and len(c["reference"]) >= n]
    if not cases or len(cases) != len(run["calls"]):
        return []
    reps = min(len(c["student"]) for c in cases)
    out = []
    for s in range(reps - n + 1):
        logs = [math.log(statistics.median(c["student"][s:s + n]) / statistics.median(c["reference"][s:s + n]))
                for c in cases]
        out.append(math.exp(sum(logs) / len(logs)))
    return out


def summarise(runs):
    """Per test: graded ratios and scores over runs, and the ratio spread for the spec's rep count."""
    out = {}
    for run in runs:
        s = out.setdefault(run["test"], {"ratios": [], "scores": [], "points": run["points"],
                                         "speed_full": run["speed_full"], "speed_zero": run["speed_zero"],
                                         "spec_reps": run["spec_reps"], "windows": {}})
        if run["ratio"] is not None:
            s["ratios"].append(round(run["ratio"], 4))
        s["scores"].append(run["score"])
        for n in sorted({run["spec_reps"], 3, 5, 8, run["reps"]}):
            if n <= run["reps"]:
                s["windows"].setdefault(str(n), []).extend(round(x, 4) for x in windowed_ratios(run, n))
    for s in out.values():
        for key in ["ratios"] + [f"windows.{n}" for n in s["windows"]]:
            vals = s["ratios"] if key == "ratios" else s["windows"][key.split(".")[1]]
            if vals:
                s.setdefault("spread", {})[key] = {"min": min(vals), "median": statistics.median(vals),
                                                   "max": max(vals), "n": len(vals)}
    return out


# ---------------------------------------------------------------------------------------------------------------
# diagnostics: single synchronised calls and GPU time, in this process
# ---------------------------------------------------------------------------------------------------------------
GIVEN_CHECKS = {"a4.flash_decode": "check_decode_tensors", "a5.paged_decode": "check_paged_tensors",
                "a3.flash_attention_forward_basic": "check_attention_inputs",
                "a3.flash_attention_forward": "check_attention_inputs"}


def _with_call_args(check, fn):
    """``check`` called with the arguments of a call of ``fn`` that it names (missing ones as None)."""
    names, sig = list(inspect.signature(check).parameters), inspect.signature(fn)

    def run(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return check(*[bound.arguments.get(n) for n in names])
    return run


def diagnose(aid, device, smoke, n_single=30):
    import reference.triton  # noqa: F401  (first: switches Triton to the interpreter when there is no GPU)
    import torch
    import triton.testing

    from autograder.runner import call_to_wire, materialise

    spec = specs_mod.load(aid)
    ns = {"__name__": f"calibrate_{aid}"}
    for c in load_cells(ROOT / "assignments" / aid / f"{aid}_solution.py"):
        fname = f"<{aid}_solution cell {c.index}>"          # registered so that Triton's @jit finds the source
        linecache.cache[fname] = (len(c.source), None, c.source.splitlines(True), fname)
        exec(compile(c.source, fname, "exec"), ns)
    rng = np.random.default_rng(0)
    out = []
    for test in speed_tests(spec, smoke):
        task = spec.tasks[test.task]
        mod, name = task.reference.split(":")
        ref = getattr(__import__(mod, fromlist=[name]), name)
        fns = {"solution": ns[task.name], "reference (as graded)": lambda *a, **k: ref(*a, **k,
                                                                                           **task.reference_kwargs)}
        if task.reference_kwargs:
            fns["reference (default checks)"] = ref
        if GIVEN_CHECKS.get(task.id) in ns:
            fns["given input check alone"] = _with_call_args(ns[GIVEN_CHECKS[task.id]], ns[task.name])
        for params in test.hidden_cases(rng):
            template = task.build(params, rng)
            if template.mode != "call":
                break
            seeds = {key: int(rng.integers(1 << 62)) for key, _ in template.arrays()}
            header, arrays = call_to_wire(template, gen_seeds=seeds)
            args, kwargs = materialise(header, arrays, device)
            row = {"test": test.name, "case": {k: v for k, v in params.items() if k != "torch"}}
            for label, fn in fns.items():
                def call():
                    return fn(*args, **kwargs)
                call()
                single = []
                for _ in range(n_single):
                    torch.cuda.synchronize() if device == "cuda" else None
                    t0 = time.perf_counter()
                    call()
                    torch.cuda.synchronize() if device == "cuda" else None
                    single.append(time.perf_counter() - t0)
                gpu = triton.testing.do_bench(call, warmup=5, rep=50) * 1e-3 if device == "cuda" else None
                row[label] = {"single_median_s": statistics.median(single), "single_min_s": min(single),
                              "single_max_s": max(single), "do_bench_s": gpu}
            out.append(row)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write (rewritten after every subject)")
    ap.add_argument("--only", nargs="*", help="assignments (a3 a3b a4 a5 or full ids); default all four")
    ap.add_argument("--gradings", type=int, default=2, help="fresh graders per solution (slow submissions: 1)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each speed test per grader")
    ap.add_argument("--reps", type=int, default=8, help="timed reps per case in each run")
    ap.add_argument("--budget", type=float, default=1e9, help="start nothing new after this many seconds")
    ap.add_argument("--no-diag", action="store_true", help="skip the in-process diagnostics")
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing test with tiny cases")
    args = ap.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    aids = [a for a in ASSIGNMENTS if not args.only or a in args.only or a.split("_")[0] in args.only]
    t_start = time.monotonic()
    doc = {"device": device, "gpu": None, "host": platform.node(), "argv": sys.argv[1:], "subjects": {},
           "diagnostics": {}, "skipped": []}
    try:
        import torch
        doc["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        doc["torch"] = torch.__version__
    except ImportError:
        pass
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        doc["elapsed_s"] = round(time.monotonic() - t_start, 1)
        out.write_text(json.dumps(doc, indent=1))

    # Round 0: one grading of each solution, the diagnostics, one grading of each slow submission; rounds
    # 1.. : further gradings of the solutions. Under --budget the later rounds are what gets skipped.
    plan = []
    for k in range(max(1, args.gradings)):
        for aid in aids:
            for label, path in subjects(aid):
                if k == 0 or label == "solution":
                    plan.append((aid, label, path, k))
            if k == 0 and not args.no_diag:
                plan.append((aid, "diagnostics", None, k))
    plan.sort(key=lambda p: (p[3], {"solution": 0, "diagnostics": 1}.get(p[1], 2)))
    for aid, label, path, k in plan:
        elapsed = time.monotonic() - t_start
        if elapsed > args.budget:
            doc["skipped"].append(f"{aid}/{label} grading {k} (budget)")
            print(f"[calibrate] {elapsed:.0f}s: skip {aid}/{label} grading {k} (budget)", flush=True)
            continue
        print(f"[calibrate] {elapsed:.0f}s: {aid}/{label} grading {k}", flush=True)
        try:
            if label == "diagnostics":
                doc["diagnostics"][aid] = diagnose(aid, device, args.smoke)
            else:
                entry = doc["subjects"].setdefault(aid, {}).setdefault(label, {"runs": []})
                for run in one_grading(aid, path, device, args.repeats, args.reps, args.smoke):
                    run["grading"] = k
                    entry["runs"].append(run)
                    print(f"    {run['test']}: ratio {run['ratio'] and round(run['ratio'], 3)}, "
                          f"score {run['score']:.2f}/{run['points']} ({run['seconds']}s)", flush=True)
                entry["summary"] = summarise(entry["runs"])
        except Exception as exc:  # noqa: BLE001 -- keep what was measured, record what failed
            doc["skipped"].append(f"{aid}/{label} grading {k}: {type(exc).__name__}: {exc}"[:500])
            print(f"[calibrate] {aid}/{label} failed: {exc!r}", flush=True)
        save()
    save()
    for aid, subs in doc["subjects"].items():
        for label, s in subs.items():
            for test, summ in s["summary"].items():
                sp = summ.get("spread", {}).get("ratios", {})
                print(f"{aid:12s} {label:22s} {test:60s} ratio {sp.get('min')}..{sp.get('max')} "
                      f"scores {summ['scores']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
