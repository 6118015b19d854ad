"""Compile the Gluon forward kernels for sm_90a on CPU and record what the GPU would run (lecture 6, section 10).

    TRITON_INTERPRET=0 CUDA_VISIBLE_DEVICES= python benchmarks/gluon_aot.py          # all variants -> JSON
    TRITON_INTERPRET=0 CUDA_VISIBLE_DEVICES= python benchmarks/gluon_aot.py --one pingpong --config 128,128,3,4

No GPU is needed: Triton's compiler and the ``ptxas``/``cuobjdump`` shipped in its wheel build the cubin
(``reference.triton._aot``). Per variant: registers per thread, stack, shared bytes, SASS opcode counts
(``HGMMA`` matrix instructions, ``UTMALDG`` TMA loads, ``LDL``/``STL`` spills, ``SYNCS.PHASECHK`` mbarrier waits,
``SYNCS.ARRIVE..A1T0`` mbarrier arrivals, ``WARPGROUP.DEPBAR`` wgmma waits) and the PTX counts they come from
(``mbarrier.try_wait.parity``, ``mbarrier.arrive``, ``wgmma.wait_group N``). Compiling every variant takes
about a minute on two cores, too long for a lecture cell, so the results are committed to
``benchmarks/results/sm90a-gluon-aot.json`` (with the Triton version) and the lecture compiles one live.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "sm90a-gluon-aot.json"

#: name -> (schedule, config or None for the default, causal, persistent)
VARIANTS = {
    "overlap": ("overlap", None, False, False),
    "overlap_4warps": ("overlap", (64, 128, 2, 4), False, False),
    "specialized": ("specialized", None, False, False),
    "pingpong": ("pingpong", None, False, False),
    "pingpong_causal": ("pingpong", None, True, False),
    "pingpong_stages3": ("pingpong", (128, 128, 3, 4), False, False),
    "specialized_persistent": ("specialized", None, False, True),
    "pingpong_persistent": ("pingpong", None, False, True),
}
SASS_PREFIXES = ("SYNCS.PHASECHK", "SYNCS.ARRIVE.TRANS64.A1T0", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE")
PTX_PATTERNS = {"ptx_mbarrier_wait": r"mbarrier\.try_wait\.parity", "ptx_mbarrier_arrive": r"mbarrier\.arrive\.shared",
                "ptx_mbarrier_expect_tx": r"mbarrier\.arrive\.expect_tx", "ptx_wgmma_wait_0": r"wgmma\.wait_group\.sync\.aligned 0;",
                "ptx_wgmma_wait_1": r"wgmma\.wait_group\.sync\.aligned 1;"}


def _sass(cubin: bytes) -> str:
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        Path(path).write_bytes(cubin)
        return subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout


def usage(compiled) -> dict:
    """``reference.triton._aot.resource_usage`` plus the barrier and wgmma-wait counts (SASS and PTX)."""
    from reference.triton._aot import resource_usage
    out = resource_usage(compiled)
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", _sass(compiled.asm["cubin"]))
    for prefix in SASS_PREFIXES:
        out[prefix] = sum(1 for o in ops if o.startswith(prefix))
    ptx = compiled.asm["ptx"]
    for key, pat in PTX_PATTERNS.items():
        out[key] = len(re.findall(pat, ptx))
    return out


def compile_variant(schedule, config, causal, persistent) -> dict:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("run with TRITON_INTERPRET=0 (the compiler rejects interpreter objects)")
    from reference.triton.flash_gluon import compile_forward
    return usage(compile_forward(schedule, 128, causal, config, persistent=persistent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", default=None, help="compile one schedule and print its JSON line (no file written)")
    ap.add_argument("--config", default=None, help="BLOCK_M,BLOCK_N,STAGES,num_warps (with --one)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--persistent", action="store_true")
    args = ap.parse_args(argv)
    if args.one:
        cfg = tuple(int(x) for x in args.config.split(",")) if args.config else None
        print(json.dumps(compile_variant(args.one, cfg, args.causal, args.persistent)))
        return 0
    import triton
    rows = {}
    for name, (schedule, cfg, causal, persistent) in VARIANTS.items():
        rows[name] = dict(schedule=schedule, config=cfg, causal=causal, persistent=persistent, d=128,
                          **compile_variant(schedule, cfg, causal, persistent))
        print(name, rows[name], file=sys.stderr)
    OUT.write_text(json.dumps({"target": "sm_90a", "triton": triton.__version__, "variants": rows}, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
