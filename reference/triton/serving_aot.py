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
                   pdl: bool = False, group: int = 4, d: int = 128, num_splits_gt1: bool = True,
                   merge_rows: int = 128, merge_group: int = 0, dynamic_chunk: int = 0):
    """``decode.split_kv_kernel`` (stage 1 of split-KV decode) compiled for sm_90a on any machine: contiguous bf16
    cache, GQA group ``group``, head dim ``d``, several splits merged in the kernel (``num_splits_gt1``;
    ``merge_rows`` / ``merge_group`` / ``dynamic_chunk`` as ``DecodeConfig``'s) or one split writing the output."""
    from .decode import split_kv_kernel as k
    ptrs = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "SeqLens": "*i32", "BlockTables": "*bf16", "Out": "*bf16",
            "OPart": "*fp32", "LsePart": "*fp32", "Counters": "*i32"}
    two = bool(merge_group) and num_splits_gt1
    if two:
        ptrs.update(OPart2="*fp32", LsePart2="*fp32")
    dyn = dynamic_chunk if num_splits_gt1 else 0
    if dyn:
        ptrs.update(ChunkCounters="*i32")
    desc = f"tensordesc<bf16[{block_n},{d}]>" if use_tma else "*bf16"
    types = {**ptrs, "DescK": desc, "DescV": desc, "qk_scale": "fp32"}
    merge_m = max(2, triton.next_power_of_2(group))
    const = dict(HEAD_DIM=d, BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, HAS_SEQLENS=False,
                 PAGED=False, PAGE_SIZE=1, DIRECT_OUT=not num_splits_gt1, IEEE_DOT=False, FUSED=num_splits_gt1,
                 MERGE_M=merge_m, MERGE_CHUNK_S=max(1, merge_rows // merge_m), USE_TMA=use_tma, PDL=pdl,
                 MERGE_GROUP=merge_group if two else 0, CHUNK_BLOCKS=dyn)
    if not two:
        const.update(OPart2=None, LsePart2=None)
    if not dyn:
        const.update(ChunkCounters=None)
    div = list(ptrs) + [n for n in k.arg_names if n.startswith("stride")] + ["n_max"]
    return compile_with_hints(k, types, const, div, num_warps, num_stages)
