"""What the op audit (autograder/audit.py) costs a timed call, and whether it moves a speed ratio.

The grader audits every graded and timed call of a Triton part, in the student's child and in the reference
child alike. Here both sides of each GPU speed test (a3's forward, a4's flash_decode, a5's paged_decode: the
solution's function as the grader's child runs it, compiled from `<cell N>` sources, and the spec's reference)
are timed in one process, call by call (host clock, device synchronised, as `runner.execute` does), with the
audit off and on. Prints us per call and the student/reference ratio both ways; `--out` writes the JSON.

    python3 -m benchmarks.grader.bench_audit_overhead --out benchmarks/results/h100-audit-overhead.json
"""
from __future__ import annotations

import argparse
import importlib
import json
import linecache
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

from autograder import specs
from autograder.audit import LaunchHook, OpAudit
from autograder.given import given_functions
from autograder.runner import call_to_wire, materialise
from autograder.submission import load_cells
from benchmarks import ROOT

CASES = [("a3_triton", "a3.flash_attention_forward_basic"), ("a4_decoding", "a4.flash_decode"),
         ("a5_paged", "a5.paged_decode")]


def _solution(aid):
    sys.modules["autograder.check"] = types.SimpleNamespace(check=lambda *a, **k: True)
    cells = load_cells(ROOT / "assignments" / aid / f"{aid}_solution.py")
    ns = {"__name__": "__main__"}
    for c in cells:
        fname = f"<cell {c.index}>"          # registered as the grader's child does (Triton's @jit reads it)
        linecache.cache[fname] = (len(c.source), None, c.source.splitlines(True), fname)
        exec(compile(c.source, fname, "exec"), ns)  # noqa: S102
    return ns, given_functions(cells)


def _time(fn, args, kwargs, audit, reps):
    ts = []
    for i in range(reps + 3):
        torch.cuda.synchronize()
        if audit is not None:
            audit.begin(list(args) + list(kwargs.values()))
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
        if audit is not None:
            audit.end()
        if i >= 3:
            ts.append(t)
    return statistics.median(ts)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    LaunchHook.install()
    rows = []
    for aid, tid in CASES:
        spec = specs.load(aid)
        task = spec.tasks[tid]
        ns, given = _solution(aid)
        mod, _, name = task.reference.partition(":")
        ref = getattr(importlib.import_module(mod), name)
        test = next(t for t in spec.tests if t.task == tid and t.kind == "speed")
        for params in test.hidden_cases(np.random.default_rng(0)):
            call = task.build(params, np.random.default_rng(1))
            header, arrays = call_to_wire(call, gen_seeds={k: 7 + i for i, (k, _) in enumerate(call.arrays())})
            a, kw = materialise(header, arrays, "cuda")
            row = {"assignment": aid, "task": tid, "case": {k: v for k, v in params.items() if k != "lens"}}
            for who, fn in (("student", ns[task.name]), ("reference", ref)):
                audit = OpAudit(given if who == "student" else None)
                LaunchHook.audit = None
                off = _time(fn, a, kw, None, args.reps)
                LaunchHook.audit = audit
                on = _time(fn, a, kw, audit, args.reps)
                LaunchHook.audit = None
                row[who] = {"off_us": off * 1e6, "on_us": on * 1e6}
            row["ratio_off"] = row["student"]["off_us"] / row["reference"]["off_us"]
            row["ratio_on"] = row["student"]["on_us"] / row["reference"]["on_us"]
            rows.append(row)
            print(f"{tid:34s} {str(row['case'])[:60]:60s} student {row['student']['off_us']:7.0f} -> "
                  f"{row['student']['on_us']:7.0f} us, reference {row['reference']['off_us']:7.0f} -> "
                  f"{row['reference']['on_us']:7.0f} us, ratio {row['ratio_off']:.2f} -> {row['ratio_on']:.2f}",
                  flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
