"""Compile a Gluon kernel for Hopper (sm_90a) ahead of time, without a GPU, and read its resource usage.

The Triton interpreter cannot run Gluon kernels, but Triton's compiler and the ``ptxas``/``cuobjdump`` bundled with
the wheel work on any machine. So a CPU-only machine (CI, a laptop) can still check that a Gluon kernel compiles
for the H100/H200 and see what the GPU would run: registers per thread, spills (``LDL``/``STL`` instructions in
the SASS), shared memory, and how many Hopper matrix instructions (``HGMMA``) and TMA loads (``UTMALDG``) it has.

Run it in a process started with ``TRITON_INTERPRET=0`` (``reference.triton``'s compile-only mode on a machine
without CUDA): under the interpreter, the ``@triton.jit`` helpers that Gluon code calls (``gl.max``, ``gl.sum``)
are interpreter objects that the compiler rejects. ``python -m reference.triton._aot`` does this for the forward:

    TRITON_INTERPRET=0 python -m reference.triton._aot [pingpong|specialized|overlap] [--d 128] [--causal] [--persistent]
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

HOPPER = GPUTarget("cuda", 90, 32)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
#: SASS opcodes counted by ``resource_usage`` (HMMA would be the pre-Hopper mma.sync path)
SASS_OPS = ("HGMMA", "HMMA", "LDL", "STL", "UTMALDG", "BAR.SYNC", "MUFU.EX2", "USETMAXREG")


def descriptor_signature(rows: int, cols: int, dtype: str = "bf16") -> str:
    """Signature string of a host ``TensorDescriptor`` argument with block ``[rows, cols]``, as the launcher
    mangles it."""
    gl_dtype = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp32": gl.float32}[dtype]
    layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gl_dtype)
    return f"tensordesc<{dtype}[{rows}, {cols}],{layout!r}>"


def compile_gluon(kernel, signature: dict, constexprs: dict, num_warps: int, maxnreg: int | None = None):
    """``triton.compile`` of a ``@gluon.jit`` kernel for sm_90a; ``signature`` maps every non-constexpr argument."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_gluon: TRITON_INTERPRET=1 is set in this process, so Triton's @jit helpers are "
                           "interpreter objects the compiler rejects; run with TRITON_INTERPRET=0 (compile-only)")
    names = kernel.arg_names
    sig = dict(signature)
    for name in constexprs:
        sig[name] = "constexpr"
    missing = [n for n in names if n not in sig]
    if missing:
        raise ValueError(f"compile_gluon: no signature or constexpr value for {missing}")
    src = GluonASTSource(kernel, {n: sig[n] for n in names}, {(names.index(k),): v for k, v in constexprs.items()})
    options = {"num_warps": num_warps}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=HOPPER, options=options)


def resource_usage(compiled) -> dict:
    """Registers, stack, shared memory and SASS opcode counts of a compiled kernel, from its cubin."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        res = subprocess.run([os.path.join(_BIN, "cuobjdump"), "--dump-resource-usage", path],
                             capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-sass", path],
                              capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", res))
    out = {"registers": int(fields.get("REG", -1)), "stack": int(fields.get("STACK", -1)),
           "shared_bytes": int(compiled.metadata.shared)}
    opcodes = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    for op in SASS_OPS:
        out[op] = sum(1 for o in opcodes if o == op or o.startswith(op + "."))
    return out


def main(argv=None) -> None:
    import argparse
    import json
    from .flash_gluon import SCHEDULES, compile_forward
    ap = argparse.ArgumentParser(description="Compile a Gluon forward kernel for sm_90a; print its resource usage")
    ap.add_argument("schedule", nargs="?", default="pingpong", choices=SCHEDULES)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--config", default=None, help="BLOCK_M,BLOCK_N,STAGES,num_warps")
    ap.add_argument("--persistent", action="store_true", help="the persistent warp-specialised kernel")
    args = ap.parse_args(argv)
    cfg = tuple(int(x) for x in args.config.split(",")) if args.config else None
    usage = resource_usage(compile_forward(args.schedule, args.d, args.causal, cfg, persistent=args.persistent))
    print(json.dumps({"schedule": args.schedule, "d": args.d, "causal": args.causal, "config": cfg,
                      "persistent": args.persistent, **usage}))


if __name__ == "__main__":
    main()
