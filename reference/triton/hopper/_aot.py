"""Compile a Gluon kernel for Hopper (sm_90a) ahead of time, without a GPU, and read its resource usage.

The Triton interpreter cannot run Gluon kernels, but Triton's compiler and the ``ptxas``/``cuobjdump`` bundled with
the wheel work on any machine. So a CPU-only machine (CI, a laptop) can still check that a Gluon kernel compiles
for the H100/H200 and see what the GPU would run: registers per thread, spills (``LDL``/``STL`` instructions in
the SASS), shared memory, and how many Hopper matrix instructions (``HGMMA``) and TMA loads (``UTMALDG``) it has.

Run it in a process started with ``TRITON_INTERPRET=0`` (``reference.triton``'s compile-only mode on a machine
without CUDA): under the interpreter, the ``@triton.jit`` helpers that Gluon code calls (``gl.max``, ``gl.sum``)
are interpreter objects that the compiler rejects. The kernel modules call ``compile_gluon`` / ``compile_triton``
(their ``compile_*`` functions); ``python -m reference.triton.hopper.aot_report`` prints the usage of each:

    TRITON_INTERPRET=0 python -m reference.triton.hopper.aot_report [fwd|bwd|fp8|persistent|all] [--d 128] [--causal]
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from .._device import SM90_TARGET

HOPPER = GPUTarget(*SM90_TARGET)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
#: SASS opcodes counted by ``resource_usage`` (QGMMA: the FP8 wgmma; HMMA would be the pre-Hopper mma.sync path)
SASS_OPS = ("HGMMA", "QGMMA", "HMMA", "LDL", "STL", "UTMALDG", "BAR.SYNC", "MUFU.EX2", "USETMAXREG")
#: SASS opcode prefixes ``resource_usage(barriers=True)`` adds: mbarrier waits (a try-wait loop), mbarrier
#: arrivals, wgmma waits
BARRIER_SASS = ("SYNCS.PHASECHK", "SYNCS.ARRIVE.TRANS64.A1T0", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE")
#: PTX instructions ``resource_usage(barriers=True)`` counts (one per source-level call, unlike the SASS loops)
BARRIER_PTX = {"ptx_mbarrier_wait": r"mbarrier\.try_wait\.parity", "ptx_mbarrier_arrive": r"mbarrier\.arrive\.shared",
               "ptx_mbarrier_expect_tx": r"mbarrier\.arrive\.expect_tx",
               "ptx_wgmma_wait_0": r"wgmma\.wait_group\.sync\.aligned 0;",
               "ptx_wgmma_wait_1": r"wgmma\.wait_group\.sync\.aligned 1;"}


def descriptor_signature(rows: int, cols: int, dtype: str = "bf16") -> str:
    """Signature string of a host ``TensorDescriptor`` argument with block ``[rows, cols]``, as the launcher
    mangles it."""
    gl_dtype = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp32": gl.float32, "fp8e4nv": gl.float8e4nv}[dtype]
    layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gl_dtype)
    return f"tensordesc<{dtype}[{rows}, {cols}],{layout!r}>"


def _source(cls, kernel, signature: dict, constexprs: dict, who: str):
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError(f"{who}: TRITON_INTERPRET=1 is set in this process, so Triton's @jit helpers are "
                           "interpreter objects the compiler rejects; run with TRITON_INTERPRET=0 (compile-only)")
    names = kernel.arg_names
    sig = dict(signature)
    for name in constexprs:
        sig[name] = "constexpr"
    missing = [n for n in names if n not in sig]
    if missing:
        raise ValueError(f"{who}: no signature or constexpr value for {missing}")
    return cls(kernel, {n: sig[n] for n in names}, {(names.index(k),): v for k, v in constexprs.items()})


def compile_gluon(kernel, signature: dict, constexprs: dict, num_warps: int, maxnreg: int | None = None):
    """``triton.compile`` of a ``@gluon.jit`` kernel for sm_90a; ``signature`` maps every non-constexpr argument."""
    src = _source(GluonASTSource, kernel, signature, constexprs, "compile_gluon")
    options = {"num_warps": num_warps}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=HOPPER, options=options)


def compile_triton(kernel, signature: dict, constexprs: dict, num_warps: int, num_stages: int,
                   divisible: tuple = ()):
    """``triton.compile`` of a ``@triton.jit`` kernel for sm_90a (the FP8 and persistent Triton kernels).
    ``divisible``: argument names the JIT would mark divisible by 16 at a launch (aligned pointers, ints that are
    multiples of 16), so the ahead-of-time compile vectorises the loads and stores as a launch does."""
    src = _source(ASTSource, kernel, signature, constexprs, "compile_triton")
    for name in divisible:
        src.attrs[(kernel.arg_names.index(name),)] = [["tt.divisibility", 16]]
    return triton.compile(src, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages})


def _cuobjdump(compiled, flag: str) -> str:
    """``cuobjdump flag`` of a compiled kernel's cubin (``--dump-resource-usage`` or ``-sass``): its text, once
    per cubin and flag in a process (``-sass`` runs nvdisasm, seconds for a large kernel, and one kernel's SASS is
    read by several checks: ``resource_usage``, ``sass_text``, ``wgmma_wait_order``)."""
    cubin = compiled.asm["cubin"]
    key = (hashlib.sha256(cubin).hexdigest(), flag)
    if key not in _DUMPS:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.cubin")
            with open(path, "wb") as f:
                f.write(cubin)
            out = subprocess.run([os.path.join(_BIN, "cuobjdump"), flag, path],
                                 capture_output=True, text=True, check=True).stdout
        if len(_DUMPS) >= _DUMPS_KEPT:
            _DUMPS.pop(next(iter(_DUMPS)))
        _DUMPS[key] = out
    return _DUMPS[key]


_DUMPS: dict = {}              # (sha256 of a cubin, flag) -> what cuobjdump printed: ``_cuobjdump``
_DUMPS_KEPT = 64


def sass_text(compiled) -> str:
    """``cuobjdump -sass`` of a compiled kernel: one instruction a line with its byte address (``/*0a40*/``)."""
    return _cuobjdump(compiled, "-sass")


def _dump(compiled) -> tuple[str, list[str]]:
    """``cuobjdump``'s resource usage text and the SASS opcodes of a compiled kernel's cubin."""
    res = _cuobjdump(compiled, "--dump-resource-usage")
    sass = _cuobjdump(compiled, "-sass")
    return res, re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)


def sass_md5(compiled) -> tuple[str, int]:
    """``(md5, count)`` of a compiled kernel's SASS instructions (operands included, one line each, as
    ``cuobjdump -sass`` prints them): equal md5s before and after a refactor mean the GPU runs the same code."""
    lines = [line.strip() for line in _cuobjdump(compiled, "-sass").splitlines()
             if re.search(r"/\*[0-9a-f]{4,}\*/", line)]
    return hashlib.md5("\n".join(lines).encode()).hexdigest(), len(lines)


def resource_usage(compiled, barriers: bool = False) -> dict:
    """Registers, stack, shared memory and SASS opcode counts (``SASS_OPS``) of a compiled kernel, from its cubin.

    ``barriers``: also the synchronisation a warp-specialised kernel compiles to, SASS opcodes by prefix
    (``BARRIER_SASS``) and PTX instruction counts (``BARRIER_PTX``: mbarrier waits and arrivals, wgmma waits by
    how many groups they leave in flight); lecture 06 section 10c and a7's compile-only checks read these.
    """
    res, opcodes = _dump(compiled)
    fields = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", res))
    out = {"registers": int(fields.get("REG", -1)), "stack": int(fields.get("STACK", -1)),
           "shared_bytes": int(compiled.metadata.shared)}
    for op in SASS_OPS:
        out[op] = sum(1 for o in opcodes if o == op or o.startswith(op + "."))
    if barriers:
        for prefix in BARRIER_SASS:
            out[prefix] = sum(1 for o in opcodes if o.startswith(prefix))
        for key, pattern in BARRIER_PTX.items():
            out[key] = len(re.findall(pattern, compiled.asm["ptx"]))
    return out


def wgmma_wait_order(compiled) -> list[dict]:
    """Where ptxas put each key loop's two wgmma waits relative to the softmax's exps (FA3 Algorithm 2's
    intra-warpgroup overlap: the softmax of ``S_j`` runs while ``P_{j-1} V_{j-1}`` is on the tensor cores).

    In a forward key loop the wait for ``S_j`` alone is ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` (one group, the
    ``P V``, left in flight) and the wait for ``P_{j-1} V_{j-1}`` the next ``WARPGROUP.DEPBAR.LE gsb0, 0x0``. For
    each ``0x1`` wait (SASS address order): ``{"s_wait", "pv_wait", "first_exp"}`` (byte addresses; the first
    ``MUFU.EX2`` after the ``S`` wait) and ``exps_before_pv_wait``, the ``MUFU.EX2`` between the two waits: the
    exps that can overlap ``P V`` (0 when ptxas hoisted the ``P V`` wait above the softmax)."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);",
                       _cuobjdump(compiled, "-sass"))
    ins = [(int(a, 16), op, rest.strip()) for a, op, rest in lines]
    out = []
    for i, (addr, op, rest) in enumerate(ins):
        if op != "WARPGROUP.DEPBAR.LE" or not rest.endswith("0x1"):
            continue
        pv = next((a for a, o, r in ins[i + 1:] if o == "WARPGROUP.DEPBAR.LE" and r.endswith("0x0")), None)
        exp = next((a for a, o, _ in ins[i + 1:] if o == "MUFU.EX2"), None)
        n = sum(1 for a, o, _ in ins[i + 1:] if o == "MUFU.EX2" and (pv is None or a < pv))
        out.append({"s_wait": addr, "pv_wait": pv, "first_exp": exp, "exps_before_pv_wait": n})
    return out
