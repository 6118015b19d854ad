"""Compile a Triton kernel for Hopper (sm_90a) without a GPU, with the hints a real launch gives it.

``reference.triton.hopper._aot`` does this for the Gluon kernels; the Triton kernels take the same route
(``triton.compile`` for ``GPUTarget(*_device.SM90_TARGET)``) with the 16-divisibility hints a launch gives its pointers,
strides and lengths (without them the compile is another kernel: a 64-row cascade tile then spills).
``hopper._aot.resource_usage`` then reads registers, spills, shared memory and the count of wgmma (``HGMMA``),
mma.sync (``HMMA``) and TMA (``UTMALDG``) instructions from the cubin; the result's ``asm["ptx"]`` shows
``griddepcontrol`` for programmatic dependent launch. ``decode.compile_sm90`` and ``cascade.compile_sm90`` use it.
Run in a process with ``TRITON_INTERPRET=0`` (``tests/test_triton_serving.py`` starts one).
"""
from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ._device import SM90_TARGET

HOPPER = GPUTarget(*SM90_TARGET)


def compile_with_hints(kernel, types: dict, constexprs: dict, divisible: list, num_warps: int, num_stages: int):
    """``triton.compile`` of ``kernel`` for sm_90a: ``types`` maps arguments to signature types (default
    ``i32``), ``constexprs`` their values, ``divisible`` names the arguments hinted divisible by 16."""
    names = kernel.arg_names
    sig = {n: ("constexpr" if n in constexprs else types.get(n, "i32")) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ASTSource(kernel, sig, {(names.index(k),): v for k, v in constexprs.items()}, attrs)
    return triton.compile(src, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages})
