"""Compile the Gluon forward kernels for sm_90a on CPU and record what the GPU would run (lecture 6, section 10).

    TRITON_INTERPRET=0 CUDA_VISIBLE_DEVICES= python3 -m benchmarks.course.gluon_aot        # all variants -> JSON
    TRITON_INTERPRET=0 CUDA_VISIBLE_DEVICES= python3 -m benchmarks.course.gluon_aot --one pingpong --config 128,128,3,4

No GPU is needed: Triton's compiler and the ``ptxas``/``cuobjdump`` shipped in its wheel build the cubin
(``reference.triton.hopper._aot``). The production kernel (``pingpong_persistent``) is compiled by
``reference.triton.hopper.flash_gluon.compile_forward``, the ablations (overlap only, warp specialisation without
the turns, one CTA per tile) by ``experiments.gluon_schedules.compile_forward``. Per variant:
``resource_usage(barriers=True)``: registers per thread, stack, shared bytes, SASS opcode counts (``HGMMA``
matrix instructions, ``UTMALDG`` TMA loads, ``LDL``/``STL`` spills, ``SYNCS.PHASECHK`` mbarrier waits,
``SYNCS.ARRIVE..A1T0`` mbarrier arrivals, ``WARPGROUP.DEPBAR`` wgmma waits) and the PTX counts they come from
(``mbarrier.try_wait.parity``, ``mbarrier.arrive``, ``wgmma.wait_group N``); for the production kernel and its
key-loop options (``KEY_LOOPS``) also ``pv_waits``. Compiling every variant takes
one to three minutes on two cores, too long for a lecture cell, so the results are committed to
``benchmarks/results/sm90a-gluon-aot.json`` (with the Triton version) and the lecture compiles one live.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks import RESULTS, ROOT

OUT = RESULTS / "sm90a-gluon-aot.json"

#: name -> (schedule, config or None for the default, causal, persistent); ("pingpong", persistent) = production
VARIANTS = {
    "overlap": ("overlap", None, False, False),
    "overlap_4warps": ("overlap", (64, 128, 2, 4), False, False),
    "specialized": ("specialized", None, False, False),
    "pingpong": ("pingpong", None, False, False),
    "pingpong_causal": ("pingpong", None, True, False),
    "pingpong_stages3": ("pingpong", (128, 128, 3, 4), False, False),
    "specialized_persistent": ("specialized", None, False, True),
    "pingpong_persistent": ("pingpong", None, False, True),
    "pingpong_persistent_stages3": ("pingpong", (128, 128, 3, 4), False, True),
}
#: the production kernel's key-loop options (``flash_gluon.attend_overlapped``'s ``FENCE`` / ``PEELED``): name ->
#: (key_loop, causal); the rows also get ``pv_waits`` (``_aot.wgmma_wait_order``: the exps ptxas put before each key
#: loop's ``P V`` wait), as does ``pingpong_persistent`` (the default: fence at d = 128; ``_off``: both options off)
KEY_LOOPS = {
    "pingpong_persistent_off": ({"peeled": False, "fence": False}, False),
    "pingpong_persistent_peeled": ({"peeled": True, "fence": False}, False),
    "pingpong_persistent_fence": ({"peeled": False, "fence": True}, False),
    "pingpong_persistent_peeled_fence": ({"peeled": True, "fence": True}, False),
    "pingpong_persistent_causal_off": ({"peeled": False, "fence": False}, True),
    "pingpong_persistent_causal_fence": ({"peeled": False, "fence": True}, True),
}


def compile_variant(schedule: str, config, causal: bool, persistent: bool, d: int = 128, key_loop=None):
    """The compiled kernel: the production one for ``("pingpong", persistent=True)`` (``key_loop``: its options,
    None for the default), else the ablation."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("run with TRITON_INTERPRET=0 (the compiler rejects interpreter objects)")
    from reference.triton.configs import GluonForwardConfig
    config = None if config is None else GluonForwardConfig.from_tuple(config)  # the tables' (BM, BN, STAGES, warps)
    if schedule == "pingpong" and persistent:
        from reference.triton.hopper.flash_gluon import compile_forward
        return compile_forward(d, causal, config, key_loop=key_loop)
    from experiments.gluon_schedules import compile_forward
    return compile_forward(schedule, d, causal, config, persistent=persistent)


def usage(schedule: str, config, causal: bool, persistent: bool, d: int = 128, key_loop=None, waits=False) -> dict:
    """``resource_usage(barriers=True)`` of a variant; ``waits``: also ``pv_waits``, the exps before each key
    loop's ``P V`` wait (``_aot.wgmma_wait_order``)."""
    from reference.triton.hopper._aot import resource_usage, wgmma_wait_order
    compiled = compile_variant(schedule, config, causal, persistent, d, key_loop)
    out = resource_usage(compiled, barriers=True)
    if waits:
        out["pv_waits"] = [w["exps_before_pv_wait"] for w in wgmma_wait_order(compiled)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", default=None, help="compile one schedule and print its JSON line (no file written)")
    ap.add_argument("--config", default=None, help="BLOCK_M,BLOCK_N,STAGES,num_warps (with --one)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--out", default=str(OUT), help="results file (all variants)")
    args = ap.parse_args(argv)
    if args.one:
        cfg = tuple(int(x) for x in args.config.split(",")) if args.config else None
        print(json.dumps(usage(args.one, cfg, args.causal, args.persistent)))
        return 0
    import triton
    rows = {}
    for name, (schedule, cfg, causal, persistent) in VARIANTS.items():
        rows[name] = dict(schedule=schedule, config=cfg, causal=causal, persistent=persistent, d=128,
                          **usage(schedule, cfg, causal, persistent, waits=name == "pingpong_persistent"))
        print(name, rows[name], file=sys.stderr, flush=True)
    for name, (loop, causal) in KEY_LOOPS.items():
        rows[name] = dict(schedule="pingpong", config=None, causal=causal, persistent=True, d=128, key_loop=loop,
                          **usage("pingpong", None, causal, True, key_loop=loop, waits=True))
        print(name, rows[name], file=sys.stderr, flush=True)
    out = os.path.abspath(args.out)
    with open(out, "w") as f:
        f.write(json.dumps({"target": "sm_90a", "triton": triton.__version__, "variants": rows}, indent=1) + "\n")
    print(f"wrote {os.path.relpath(out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
