"""Compile the wing's kernels for sm_90a without a GPU and print their resource usage, one JSON line each.

    TRITON_INTERPRET=0 python -m reference.triton.hopper.aot_report [fwd|bwd|fp8|fp8g|persistent|all] [--d 128] [--causal]
        [--peeled] [--waits]

Registers per thread, stack, shared memory, SASS opcode counts (``_aot.SASS_OPS``: HGMMA, spills as LDL/STL,
TMA loads, ...) and the md5 of the SASS instructions (``_aot.sass_md5``). The same md5 before and after a refactor
says the GPU runs the same code (notes/experiments_removed.md has the table of the move into this wing;
notes/layout.md "Duplicates, fifth pass" the md5s of the shared forward helpers). ``--peeled`` compiles the FP8
Gluon kernel with its ``peeled`` schedule option; ``--waits`` adds ``_aot.wgmma_wait_order`` (where ptxas put
each key loop's P V wait relative to the softmax's exps) as ``pv_waits``.
"""
from __future__ import annotations

import argparse
import json

from ._aot import resource_usage, sass_md5, wgmma_wait_order


def kernels(which: str, d: int, causal: bool, peeled: bool = False):
    """``(name, compile thunk)`` pairs for ``which`` (``peeled``: the FP8 Gluon kernel's schedule option)."""
    from .flash_fp8 import compile_fp8
    from .flash_fp8_gluon import compile_fp8_gluon
    from .flash_gluon import compile_forward
    from .flash_gluon_bwd_ws import compile_backward_ws
    from .flash_persistent import compile_persistent
    out = []
    if which in ("fwd", "all"):
        out.append((f"fwd d{d} causal={causal}", lambda: compile_forward(d, causal)))
    if which in ("bwd", "all"):
        out.append((f"bwd_ws split d{d} causal={causal}", lambda: compile_backward_ws(d, causal)))
    if which in ("fp8", "all"):
        out.append((f"fp8 (Triton) d{d} causal={causal}", lambda: compile_fp8(d, causal)))
    if which in ("fp8g", "all"):
        sched = {"turns": False, "merged": False, "peeled": True} if peeled else None
        out.append((f"fp8 (Gluon ws) d{d} causal={causal}" + (" peeled" if peeled else ""),
                    lambda: compile_fp8_gluon(d, causal, schedule=sched)))
    if which in ("persistent", "all"):
        out.append((f"persistent (Triton) d{d} causal={causal}", lambda: compile_persistent(d, causal)))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Compile the Hopper wing's kernels for sm_90a; print resource usage")
    ap.add_argument("which", nargs="?", default="fwd", choices=("fwd", "bwd", "fp8", "fp8g", "persistent", "all"))
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--peeled", action="store_true", help="fp8g: the peeled key loop (schedule option)")
    ap.add_argument("--waits", action="store_true", help="add the P V waits vs the exps (_aot.wgmma_wait_order)")
    args = ap.parse_args(argv)
    for name, thunk in kernels(args.which, args.d, args.causal, args.peeled):
        compiled = thunk()
        md5, n = sass_md5(compiled)
        extra = {"pv_waits": wgmma_wait_order(compiled)} if args.waits else {}
        print(json.dumps({"kernel": name, "d": args.d, "causal": args.causal, **resource_usage(compiled),
                          "sass_instructions": n, "sass_md5": md5, **extra}), flush=True)


if __name__ == "__main__":
    main()
