"""CPU-side cost of one timed speed-test rep of the autograder (docs/design.md §6): the protocol, not the kernel.

A synthetic speed test times ``clip(a, lo, hi)`` (NumPy, trivially cheap) on three float32 arrays of ``--numel``
elements each (default 8.4M = one a3 bf16 tensor B=4, H=16, N=2048, d=64; the old wire sent bf16 as float32,
so these bytes match what used to travel). Whatever time a rep takes beyond the two ~10 ms calls is grading
overhead: building inputs, shipping them, hashing, shipping outputs back, judging.

    python -m benchmarks.grader.bench_timed_protocol                  # this checkout's autograder
    git archive 7ee8660 autograder | tar -x -C /tmp/oldag      # the autograder before seeded timed reps
    python -m benchmarks.grader.bench_timed_protocol --root /tmp/oldag

On CPU the new protocol's children draw the inputs with NumPy (~30 ms per 8.4M array) and copy/compare them
for the inputs-unchanged check; on a GPU both are device kernels (well under 1 ms).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import ROOT


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT), help="folder holding autograder/")
    ap.add_argument("--numel", type=int, default=4 * 16 * 2048 * 64)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if Path(args.root).resolve() != ROOT and not os.environ.get("BENCH_TIMED_PROTOCOL_CHILD"):
        # another checkout's autograder: run this script again with that folder first on the import path
        env = {**os.environ, "BENCH_TIMED_PROTOCOL_CHILD": "1",
               "PYTHONPATH": os.pathsep.join([args.root, str(ROOT), os.environ.get("PYTHONPATH", "")])}
        sys.exit(subprocess.run([sys.executable, "-m", "benchmarks.grader.bench_timed_protocol", *sys.argv[1:]],
                                cwd=args.root, env=env).returncode)
    import numpy as np
    from autograder.engine import Grader
    from autograder.specs._base import Call, Task, Test
    from autograder.specs._gen import arr, out
    from autograder.submission import Cell

    def build(p, rng):
        xs = [rng.standard_normal(p["numel"]).astype(np.float32) for _ in range(3)]
        c = Call([arr(x) for x in xs], {}, [out("o", "float32")])
        c.arg_names = ["a", "lo", "hi"]
        return c

    task = Task("bench.clip", "clip", build, lambda call: [], reference="numpy:clip", case_timeout=120)
    test = Test("bench.clip: speed", "bench.clip", 1, [], lambda r: [dict(numel=args.numel)], kind="speed",
                reps=args.reps, speed_full=100.0, speed_zero=200.0)
    g = Grader("a2_flash_numpy", device="cpu", seed=1)
    g.spec.tasks = {task.id: task}
    g.results, g.dead_tasks, g._flooded = [], {}, set()
    g.cells = [Cell(0, "import numpy as np\n\ndef clip(a, lo, hi):\n    return np.clip(a, lo, hi)\n")]
    try:
        g.student()
        g.reference(task)
        t0 = time.perf_counter()
        r = g.run_test(test, task)
        total = time.perf_counter() - t0
    finally:
        for sb in (g.sandbox, g.ref_sandbox):
            if sb is not None:
                sb.stop()
    sp = r.extra.get("speed", [{}])[0]
    calls = sp.get("student_s", 0) + sp.get("reference_s", 0)
    res = {"root": args.root, "numel": args.numel, "reps": args.reps + 1, "status": r.status, "output": r.output,
           "total_s": round(total, 3), "per_rep_s": round(total / (args.reps + 1), 3),
           "timed_calls_per_rep_s": round(calls, 4),
           "overhead_per_rep_s": round(total / (args.reps + 1) - calls, 3)}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
