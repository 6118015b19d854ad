"""Fused row softmax in Triton: ``softmax(x)`` over the last axis, any row length, fp16/bf16/fp32.

Unfused, ``softmax`` is three passes over memory (max, sum of exponentials, normalise), each reading the row
from HBM. Fused, a program loads a block of rows into registers ONCE, computes the max, the exponentials,
their sum and the quotient on chip (in fp32, with the max subtracted: the "safe" softmax), and writes ONCE:
2 bytes moved per element in each direction for bf16, the minimum -- so the kernel should run at copy speed.

A row longer than ``MAX_SINGLE`` elements does not fit in registers; it is then handled in two passes over
column blocks: the first keeps a running max and a rescaled running sum (the *online* softmax, Milakov &
Gimelshein 2018; the same recurrence as FA2 Algorithm 1, line 9), the second writes ``exp(x - m) / l``. That
reads the row twice (3 memory passes instead of 2) but never stores anything extra.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import check_positive_int, check_tensor
from ._kernel_helpers import LOG2E

#: longest row (elements, a power of two) held in registers by one program; longer rows use the online path
MAX_SINGLE = 32768
#: column block of the online (long-row) path
ONLINE_BLOCK = 8192
#: elements one program handles in the single-block path (rows are packed until a program has this many)
ELEMS_PER_PROGRAM = 4096


@triton.jit
def _softmax_rows(X, Y, stride_x, stride_y, n_rows, n_cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Single pass: ``BLOCK_R`` whole rows per program, one read and one write of each element."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    # rows past the end re-read the last row (never stored), so no all -inf row makes NaN in dead lanes
    rows64 = tl.minimum(rows, n_rows - 1).to(tl.int64)
    col_ok = (cols < n_cols)[None, :]
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=col_ok, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 1)  # safe softmax: subtract the row max so exp never overflows
    e = tl.math.exp2((x - m[:, None]) * LOG2E)
    y = e / tl.sum(e, 1)[:, None]
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty),
             mask=(rows < n_rows)[:, None] & col_ok)


@triton.jit
def _online_stats_block(x, m, s):
    """One step of the online softmax: fold block ``x`` into the running max ``m`` and sum ``s``."""
    m_new = tl.maximum(m, tl.max(x, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that are all -inf so far: avoid inf - inf
    s = s * tl.math.exp2((m - m_use) * LOG2E) \
        + tl.sum(tl.math.exp2((x - m_use[:, None]) * LOG2E), 1)
    return m_new, s


@triton.jit
def _softmax_rows_online(X, Y, stride_x, stride_y, n_rows, n_cols,
                         BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Two passes over column blocks: running (max, sum), then the normalised output."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    rows64 = rows.to(tl.int64)
    row_ok = (rows < n_rows)[:, None]
    x_row = X + rows64[:, None] * stride_x
    y_row = Y + rows64[:, None] * stride_y
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_R], tl.float32)
    # pass 1: online max and sum
    for c0 in range(0, n_cols, BLOCK_C):
        c = c0 + cols
        x = tl.load(x_row + c[None, :], mask=row_ok & (c < n_cols)[None, :], other=float("-inf")).to(tl.float32)
        m, s = _online_stats_block(x, m, s)
    # pass 2: y = exp(x - m) / s
    inv = 1.0 / s
    for c0 in range(0, n_cols, BLOCK_C):
        c = c0 + cols
        mask = row_ok & (c < n_cols)[None, :]
        x = tl.load(x_row + c[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.math.exp2((x - m[:, None]) * LOG2E) * inv[:, None]
        tl.store(y_row + c[None, :], y.to(Y.dtype.element_ty), mask=mask)


#: elements per warp (ELEMS_PER_WARP / 32 values per thread), clamped to 4..32 warps; 2048 was the best or
#: within 3% of the best of {512, 1024, 2048} at every N in 1k..32k on an H200 (notes/triton_attention.md)
ELEMS_PER_WARP = 2048


def _num_warps(elems: int) -> int:
    return max(4, min(32, elems // ELEMS_PER_WARP))


def launch_params(n_rows: int, n_cols: int, limit: int = MAX_SINGLE) -> tuple:
    """``(online, BLOCK_R, BLOCK_C, num_warps)`` of a launch: rows of up to ``limit`` columns in one block
    (``ELEMS_PER_PROGRAM`` elements per program), longer rows by the online path in ``ONLINE_BLOCK`` columns.
    Rows live in registers; shared memory only holds the cross-warp reductions (``_device.smem_softmax``), so
    these fit every GPU from sm_75 on (``tests/test_any_gpu.py``)."""
    block_c = triton.next_power_of_2(n_cols)
    if block_c <= limit:
        block_r = max(1, min(ELEMS_PER_PROGRAM // block_c, triton.next_power_of_2(n_rows)))
        return False, block_r, block_c, _num_warps(block_r * block_c)
    block_c = min(ONLINE_BLOCK, limit)
    return True, 1, block_c, _num_warps(block_c)


def softmax(x, *, max_single: int | None = None):
    """Softmax over the last axis of ``x`` (any shape, fp16/bf16/fp32, on ``reference.triton.DEVICE``).

    Returns a new contiguous tensor of ``x``'s shape and dtype; math is fp32 with the row max subtracted, so
    large logits do not overflow. A row that is all ``-inf`` gives NaN, as ``torch.softmax`` does.
    ``max_single`` (keyword-only, a power of two) overrides ``MAX_SINGLE``: rows longer than it take the online path.
    """
    check_tensor(x, "x")
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dimension (softmax runs over the last axis), got a 0-d tensor")
    limit = MAX_SINGLE if max_single is None else check_positive_int(max_single, "max_single")
    if limit & (limit - 1):
        raise ValueError(f"max_single must be a positive power of two, got {max_single}")
    n_cols = x.shape[-1]
    if x.numel() == 0:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    x2 = x.reshape(-1, n_cols)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    n_rows = x2.shape[0]
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    online, block_r, block_c, num_warps = launch_params(n_rows, n_cols, limit)
    if not online:
        _softmax_rows[(triton.cdiv(n_rows, block_r),)](
            x2, y, x2.stride(0), y.stride(0), n_rows, n_cols, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=num_warps)
    else:
        _softmax_rows_online[(n_rows,)](
            x2, y, x2.stride(0), y.stride(0), n_rows, n_cols, BLOCK_R=1, BLOCK_C=block_c, num_warps=num_warps)
    return y.view(x.shape)


__all__ = ["softmax", "MAX_SINGLE"]
