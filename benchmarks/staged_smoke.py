"""A CPU smoke run of the staged benchmark runner (``benchmarks/_staged.py``), the stages it runs standing in for
a benchmark's: ``compile_slowly`` (two JIT compilations, each longer than the stage's whole run-time limit, one
of them in a process the stage starts, then a short run: it must pass), ``hang`` (one item done, then stuck:
stopped after the limit, naming the item it was on) and ``crash``. The compilations call Triton's own JIT hooks
(``knobs.runtime.jit_cache_hook`` / ``jit_post_compile_hook``) as a compilation does; no kernel compiles on a CPU.

    python -m benchmarks.staged_smoke --smoke --out DIR     # writes DIR/smoke-staged.json
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from benchmarks._compile_marks import inherited_fds, marked_python
from benchmarks._staged import run_stages
#: the smoke's stages: what each does, and the run-time limit it gets (seconds)
SMOKE_LIMIT = 3.0
SMOKE_COMPILE_S = SMOKE_LIMIT + 1.0  # a compilation longer than the run-time limit must not stop a stage


def _smoke_compile(name: str, seconds: float) -> None:
    """What Triton does around one JIT compilation, hooks included: ``jit_cache_hook``, work, the post hook."""
    from triton import knobs
    from triton.runtime.jit import JitFunctionInfo
    fn = JitFunctionInfo("smoke", name, None)
    knobs.runtime.jit_cache_hook(key=name, repr=name, fn=fn, compile={}, is_manual_warmup=False,
                                 already_compiled=False)
    time.sleep(seconds)
    knobs.runtime.jit_post_compile_hook(key=name, repr=name, fn=fn, compile={}, is_manual_warmup=False,
                                        already_compiled=False)


def _smoke_stage(stage: str):
    if stage == "compile_slowly":      # two long compilations (one in a process it starts), then a short run
        _smoke_compile("kernel_a", SMOKE_COMPILE_S)
        subprocess.run(marked_python("from benchmarks.staged_smoke import _smoke_compile as c; c('kernel_b', "
                                     f"{SMOKE_COMPILE_S})"), check=True, pass_fds=inherited_fds())
        time.sleep(SMOKE_LIMIT / 3)
        return {"ok": True}
    if stage == "hang":                # one item done, then stuck on the second
        print("checking config_a", flush=True)
        print("PARTIAL " + json.dumps({"config": "config_a", "ok": True}), flush=True)
        print("checking config_b", flush=True)
        time.sleep(3600)
    if stage == "crash":
        print("PARTIAL " + json.dumps({"config": "config_a", "ok": True}), flush=True)
        sys.exit(3)
    raise ValueError(f"stage: expected compile_slowly, hang or crash, got {stage!r}")


def main(argv=None) -> None:
    import argparse
    ap = argparse.ArgumentParser(description="CPU smoke run of the staged benchmark runner")
    ap.add_argument("--smoke", action="store_true", help="run the smoke stages (the only mode)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--stage", default=None)
    args = ap.parse_args(argv)
    if args.stage:
        print("RESULT " + json.dumps(_smoke_stage(args.stage)), flush=True)
        return
    if not args.smoke:
        ap.error("--smoke is the only mode")
    os.makedirs(args.out, exist_ok=True)
    res = {"limit_s": SMOKE_LIMIT, "compile_s": SMOKE_COMPILE_S}
    run_stages("benchmarks.staged_smoke", ["compile_slowly", "hang", "crash"], lambda st: SMOKE_LIMIT, res,
               os.path.join(args.out, "smoke-staged.json"))


if __name__ == "__main__":
    main()
