"""Compile a Triton kernel for Hopper (sm_90a) without a GPU, with the hints a real launch gives it.

``reference.triton.hopper._aot`` does this for the Gluon kernels; the Triton kernels take the same route
(``triton.compile`` for ``GPUTarget(*_device.SM90_TARGET)``) with the 16-divisibility hints a launch gives its pointers,
strides and lengths (without them the compile is another kernel: a 64-row cascade tile then spills).
``hopper._aot.resource_usage`` then reads registers, spills, shared memory and the count of wgmma (``HGMMA``),
mma.sync (``HMMA``) and TMA (``UTMALDG``) instructions from the cubin; the result's ``asm["ptx"]`` shows
``griddepcontrol`` for programmatic dependent launch. ``compile_decode`` (the teaching decode kernel) and ``cascade.compile_sm90`` use it.
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


def compile_decode(block_n: int = 64, num_warps: int = 4, num_stages: int = 4, use_tma: bool = False,
                   group: int = 4, d: int = 128, num_splits_gt1: bool = True, merge_rows: int = 128, paged: bool = False,
                   page: int = 16, kernel=None, constexprs: dict | None = None, pointers: dict | None = None):
    """``decode.split_kv_kernel`` (stage 1 of split-KV decode) compiled for sm_90a on any machine: bf16, GQA group
    ``group``, head dim ``d``, a contiguous cache (``paged``: ``page``-token pages, per-sequence lengths), several
    splits merged in the kernel (``num_splits_gt1``; ``merge_rows`` as ``DecodeConfig``'s) or one split writing the
    output. ``kernel`` / ``constexprs`` / ``pointers``: another kernel with stage 1's arguments and these extra
    constexpr values and pointer types (``experiments.decode_variants``)."""
    from .decode import split_kv_kernel
    k = split_kv_kernel if kernel is None else kernel
    ptrs = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "SeqLens": "*i32", "BlockTables": "*i32" if paged else "*bf16",
            "Out": "*bf16", "OPart": "*fp32", "LsePart": "*fp32", "Counters": "*i32", **(pointers or {})}
    desc = f"tensordesc<bf16[{block_n},{d}]>" if use_tma else "*bf16"
    types = {**ptrs, "DescK": desc, "DescV": desc, "qk_scale": "fp32"}
    merge_m = max(2, triton.next_power_of_2(group))
    const = dict(HEAD_DIM=d, BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, HAS_SEQLENS=paged,
                 PAGED=paged, PAGE_SIZE=page if paged else 1, DIRECT_OUT=not num_splits_gt1, IEEE_DOT=False,
                 FUSED=num_splits_gt1, MERGE_M=merge_m, MERGE_CHUNK_S=max(1, merge_rows // merge_m), USE_TMA=use_tma,
                 **(constexprs or {}))
    div = list(ptrs) + [n for n in k.arg_names if n.startswith("stride")] + ["n_max"]
    return compile_with_hints(k, types, const, div, num_warps, num_stages)
