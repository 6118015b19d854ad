"""Compile the wing's kernels for sm_90a without a GPU and print their resource usage, one JSON line each.

    TRITON_INTERPRET=0 python -m reference.triton.hopper.aot_report [fwd|bwd|fp8|fp8g|persistent|all] [--d 128] [--causal]
        [--peeled | --no-peeled] [--fence] [--waits]

Registers per thread, stack, shared memory, SASS opcode counts (``_aot.SASS_OPS``: HGMMA, spills as LDL/STL,
TMA loads, ...) and the md5 of the SASS instructions (``_aot.sass_md5``). The same md5 before and after a refactor
says the GPU runs the same code (notes/experiments_removed.md has the table of the move into this wing;
notes/layout.md "Duplicates, fifth pass" the md5s of the shared forward helpers). ``--peeled`` / ``--no-peeled``
compile the bf16 (``fwd``) and FP8 (``fp8g``) Gluon forwards with / without their peeled key loop, ``--fence`` both
with their K release after the softmax (``attend_overlapped``'s / ``attend_fp8``'s ``FENCE``); any of them spells
the key loop out (an option not named is off), none of them compiles the pins;
``--waits`` adds ``_aot.wgmma_wait_order`` (where ptxas put each key loop's P V wait relative to the softmax's
exps) as ``pv_waits``.
"""
from __future__ import annotations

import argparse
import json

from ._aot import resource_usage, sass_md5, wgmma_wait_order


def kernels(which: str, d: int, causal: bool, peeled: bool | None = None, fence: bool = False):
    """``(name, compile thunk)`` pairs for ``which`` (``peeled``: the bf16 and FP8 Gluon forwards' peeled key loop
    on / off; None: their pins ``configs.GLUON_FWD_KEY_LOOP``, ``configs.FP8_GLUON_SCHEDULE``; ``fence``: the bf16
    and FP8 Gluon forwards' ``FENCE``, with ``peeled`` False if None)."""
    from ..configs import FP8_GLUON_SCHEDULE
    from .flash_fp8 import compile_fp8
    from .flash_fp8_gluon import compile_fp8_gluon
    from .flash_gluon import compile_forward
    from .flash_gluon_bwd_ws import compile_backward_ws
    from .flash_persistent import compile_persistent
    out = []
    tag = {None: "", True: " peeled", False: " not peeled"}[peeled] + (" fence" if fence else "")
    if which in ("fwd", "all"):
        out.append((f"fwd d{d} causal={causal}{tag}",
                    lambda: compile_forward(d, causal, key_loop=None if peeled is None and not fence else
                                            {"peeled": bool(peeled), "fence": fence})))
    if which in ("bwd", "all"):
        out.append((f"bwd_ws split d{d} causal={causal}", lambda: compile_backward_ws(d, causal)))
    if which in ("fp8", "all"):
        out.append((f"fp8 (Triton) d{d} causal={causal}", lambda: compile_fp8(d, causal)))
    if which in ("fp8g", "all"):
        sched = None if peeled is None and not fence else dict(FP8_GLUON_SCHEDULE, peeled=bool(peeled), fence=fence)
        out.append((f"fp8 (Gluon ws) d{d} causal={causal}{tag}",
                    lambda: compile_fp8_gluon(d, causal, schedule=sched)))
    if which in ("persistent", "all"):
        out.append((f"persistent (Triton) d{d} causal={causal}", lambda: compile_persistent(d, causal)))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Compile the Hopper wing's kernels for sm_90a; print resource usage")
    ap.add_argument("which", nargs="?", default="fwd", choices=("fwd", "bwd", "fp8", "fp8g", "persistent", "all"))
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--peeled", action=argparse.BooleanOptionalAction, default=None,
                    help="fwd, fp8g: the peeled key loop on / off (default: the pins)")
    ap.add_argument("--fence", action="store_true", help="fwd, fp8g: the K release after the softmax (FENCE)")
    ap.add_argument("--waits", action="store_true", help="add the P V waits vs the exps (_aot.wgmma_wait_order)")
    args = ap.parse_args(argv)
    for name, thunk in kernels(args.which, args.d, args.causal, args.peeled, args.fence):
        compiled = thunk()
        md5, n = sass_md5(compiled)
        extra = {"pv_waits": wgmma_wait_order(compiled)} if args.waits else {}
        print(json.dumps({"kernel": name, "d": args.d, "causal": args.causal, **resource_usage(compiled),
                          "sass_instructions": n, "sass_md5": md5, **extra}), flush=True)


if __name__ == "__main__":
    main()
