"""The read ceiling of a decode step: how fast ONE kernel launch can merely stream a decode's K/V bytes.

A split-KV decode at batch 1 reads its K/V cache once, in one launch of a single wave of programs. What such a
launch can reach is less than the copy bandwidth of a long copy: the wave ramps up (programs start, first
loads wait a full memory latency) and drains (programs finish at different times), and in a CUDA graph every
launch pays its start. ``read_ceiling_ms`` times a kernel that does nothing but stream the same bytes with the
same partition as ``flash_decode`` (one program per (sequence, kv head, split), key blocks of ``block_n`` rows;
pointer loads, or TMA boxes on Hopper) with the same timing as the decode rows (``_common.graph_ms``), so a
decode kernel's fraction of copy can be read against what a launch of these bytes reaches at all
(notes/serving_perf.md, "Decode at 32k and the one-launch cascade").
"""
from __future__ import annotations

import torch

import reference.triton  # noqa: F401  (first: on a machine without CUDA it selects the interpreter before triton loads)
import triton
import triton.language as tl

from benchmarks import _common


@triton.jit
def _stream_kernel(K, V, Out, DescK, DescV, n_max, keys_per_split, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   USE_TMA: tl.constexpr):
    """Sum keys ``[s * keys_per_split, (s + 1) * keys_per_split)`` of K and V of row group ``program_id(1)``."""
    s = tl.program_id(0)
    bh = tl.program_id(1)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = s * keys_per_split
    for n0 in range(lo, lo + keys_per_split, BLOCK_N):
        if USE_TMA:
            k = DescK.load([bh * n_max + n0, 0])
            v = DescV.load([bh * n_max + n0, 0])
        else:
            rows = (bh * n_max + n0 + offs_n).to(tl.int64) * HEAD_DIM
            k = tl.load(K + rows[:, None] + offs_d[None, :])
            v = tl.load(V + rows[:, None] + offs_d[None, :])
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(Out + bh * tl.num_programs(0) + s, tl.sum(tl.sum(acc, 1), 0))


def read_ceiling_ms(kv_sets, splits: int, use_tma: bool, block_n: int = 64, num_stages: int = 4,
                    smoke: bool = False) -> float:
    """GPU ms per launch (``_common.graph_ms`` over ``kv_sets``, a list of contiguous ``(k, v)`` of shape
    ``(B, Hkv, N, d)``) of the stream kernel with ``splits`` programs per (sequence, kv head); its sums are
    checked against torch first (``AssertionError`` otherwise). ``use_tma`` needs a Hopper GPU."""
    B, H, N, d = kv_sets[0][0].shape
    if N % (splits * block_n):
        raise ValueError(f"N={N} must be a multiple of splits * block_n = {splits * block_n}")
    out = torch.empty(B * H * splits, device=kv_sets[0][0].device, dtype=torch.float32)

    def launcher(k, v):
        from triton.tools.tensor_descriptor import TensorDescriptor
        descs = ([TensorDescriptor(x, [x.numel() // d, d], [d, 1], [block_n, d]) for x in (k, v)] if use_tma
                 else [k, v])
        return lambda: _stream_kernel[(splits, B * H)](k, v, out, *descs, N, N // splits, BLOCK_N=block_n,
                                                       HEAD_DIM=d, USE_TMA=use_tma, num_warps=4,
                                                       num_stages=num_stages)
    fns = [launcher(k, v) for k, v in kv_sets]
    fns[0]()
    k, v = kv_sets[0]
    ref = (k.float() + v.float()).view(B * H, splits, -1).sum(-1).flatten()
    err = float((out - ref).abs().max() / ref.abs().max())
    assert err < 1e-3, f"stream kernel sums off by {err:.2e}"
    return _common.graph_ms(fns, smoke=smoke)
