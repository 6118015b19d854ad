"""The PTX of the primer's kernels (``reference.triton.primer``) compiled for sm_90a (an H100/H200), on any machine.

Triton's compiler needs no GPU to compile for one, but it must run with the interpreter off: under
``TRITON_INTERPRET=1`` the ``@triton.jit`` library functions (``tl.max``, ``tl.sum``) are interpreter objects that
the compiler rejects. So ``ptx(...)`` compiles in a fresh Python process started with ``TRITON_INTERPRET=0``
(``reference.triton``'s compile-only mode), which prints the PTX:

    TRITON_INTERPRET=0 python -m reference.triton.primer_ptx add --constexpr BLOCK=1024 MASKED=1
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

#: argument types of each primer kernel's non-constexpr arguments, as the launcher spells them
SIGNATURES = {
    "add": ("add_kernel", {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}),
    "softmax": ("softmax_row_kernel", {"x_ptr": "*fp16", "y_ptr": "*fp16", "n_cols": "i32", "stride_x": "i32",
                                       "stride_y": "i32"}),
    "matmul": ("matmul_kernel", {**{p: "*fp16" for p in ("a_ptr", "b_ptr", "c_ptr")},
                                 **{n: "i32" for n in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk",
                                                       "stride_bn", "stride_cm", "stride_cn")}}),
}


def _compile(name: str, constexprs: dict, num_warps: int, num_stages: int, aligned: bool = False) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from reference.triton import primer
    kernel_name, sig = SIGNATURES[name]
    kernel = getattr(primer, kernel_name)
    full = {n: ("constexpr" if n in constexprs else sig[n]) for n in kernel.arg_names}
    src = ASTSource(kernel, full, {(kernel.arg_names.index(k),): v for k, v in constexprs.items()})
    if aligned:  # what a launch sees when every pointer and int argument is a multiple of 16 (it checks)
        for i, n in enumerate(kernel.arg_names):
            if n in sig:
                src.attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    return compiled.asm["ptx"]


def ptx(name: str, constexprs: dict, num_warps: int = 4, num_stages: int = 3, aligned: bool = False,
        timeout: float = 300) -> str:
    """The PTX of primer kernel ``name`` (a key of ``SIGNATURES``) for sm_90a, compiled in a fresh process.

    ``aligned``: compile as a launch does when every pointer and integer argument is divisible by 16 (the JIT
    checks each argument and specialises on it), which lets the compiler use vector loads and stores."""
    if name not in SIGNATURES:
        raise ValueError(f"name must be one of {sorted(SIGNATURES)}, got {name!r}")
    args = [f"{k}={int(v)}" for k, v in constexprs.items()]
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", __name__, name, "--num-warps", str(num_warps), "--num-stages", str(num_stages),
           *(["--aligned"] if aligned else []), "--constexpr", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"compiling {name} for sm_90a failed:\n{res.stderr[-2000:]}")
    return res.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reference.triton.primer_ptx", description=__doc__.splitlines()[0])
    ap.add_argument("name", choices=sorted(SIGNATURES))
    ap.add_argument("--num-warps", type=int, default=4)
    ap.add_argument("--num-stages", type=int, default=3)
    ap.add_argument("--aligned", action="store_true", help="every pointer and int argument divisible by 16")
    ap.add_argument("--constexpr", nargs="*", default=[], help="NAME=INT for each constexpr argument")
    a = ap.parse_args(argv)
    cx = {k: int(v) for k, v in (c.split("=", 1) for c in a.constexpr)}
    sys.stdout.write(_compile(a.name, cx, a.num_warps, a.num_stages, a.aligned))
    return 0


if __name__ == "__main__":
    sys.exit(main())
