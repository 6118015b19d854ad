"""What the host policy's guards (autograder/host_policy.py) cost a Triton part's wrapper on this CPU.

The course solutions' wrappers (a3's forward, a4's flash_decode, a5's paged_decode) are compiled three ways --
as written, under the policy, and under the policy inside ``CellCompiler.plain`` (what the unaudited timed reps
run) -- and called with their kernels not launched (``LaunchHook.dry``), so only host code is timed.
Prints microseconds per call as JSON.

    python3 -m benchmarks.grader.bench_host_policy
"""
from __future__ import annotations

import json
import os
import sys
import time
import types

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import reference.triton  # noqa: E402,F401 -- the interpreter switch on a CPU, before any kernel exists
from autograder import host_policy, specs  # noqa: E402
from autograder.audit import LaunchHook  # noqa: E402
from autograder.submission import load_cells  # noqa: E402

CASES = {
    "a3_triton": ("flash_attention_forward", lambda: (torch.randn(1, 4, 128, 64), torch.randn(1, 2, 128, 64),
                                                      torch.randn(1, 2, 128, 64))),
    "a4_decoding": ("flash_decode", lambda: (torch.randn(2, 8, 64), torch.randn(2, 2, 300, 64),
                                             torch.randn(2, 2, 300, 64))),
    "a5_paged": ("paged_decode", lambda: (torch.randn(2, 8, 64), torch.randn(12, 32, 2, 64),
                                          torch.randn(12, 32, 2, 64),
                                          torch.arange(12, dtype=torch.int32).reshape(2, 6),
                                          torch.tensor([150, 77], dtype=torch.int32))),
}


def _load(aid, policy):
    sys.modules["autograder.check"] = types.SimpleNamespace(check=lambda *a, **k: True)
    cells = load_cells(f"assignments/{aid}/{aid}_solution.py")
    ns = {"__name__": "__main__"}
    cc = host_policy.CellCompiler(ns, host_policy.config(specs.load(aid), cells)) if policy else None
    for c in cells:
        name = f"<cell {c.index}>"
        exec(cc.compile(c.index, c.source, name) if cc else compile(c.source, name, "exec"), ns)  # noqa: S102
    return ns, cc


def _us(fn, args, n=500):
    for _ in range(20):
        fn(*args)
    t0 = time.perf_counter()
    for _ in range(n):
        fn(*args)
    return round((time.perf_counter() - t0) / n * 1e6, 1)


def main():
    LaunchHook.install()
    LaunchHook.dry = True
    out = {}
    for aid, (name, make) in CASES.items():
        args = make()
        ns, _ = _load(aid, False)
        row = {"as_written": _us(ns[name], args)}
        ns, cc = _load(aid, True)
        fn = cc.wrap(ns[name], name)
        row["guarded"] = _us(fn, args)
        with cc.plain():
            row["plain"] = _us(fn, args)
        cc.end()
        out[f"{aid}.{name}"] = row
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
