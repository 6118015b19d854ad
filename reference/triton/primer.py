"""The Triton primer's kernels (lecture 05a): a vector add, a fused softmax of one row per program, a tiled matmul.

Each is the smallest kernel that shows one idea: a program id and a block of offsets (``add``); a mask for the
ragged tail and ``other=`` for the lanes it switches off (``add``, ``softmax_rows``); a reduction along a block
held in registers (``softmax_rows``); a loop over ``K`` tiles feeding ``tl.dot`` with a float32 accumulator, and
the launch options ``num_warps`` / ``num_stages`` that ``triton.autotune`` chooses among (``matmul``). They run in
the interpreter on CPU tensors (``reference.triton`` switches it on without a GPU) and compiled on a GPU;
``benchmarks/course/bench_primer.py`` times them on a GPU and ``reference.triton.primer_ptx`` compiles them for
sm_90a on any machine.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import INTERPRET

#: launch options ``matmul_autotuned`` chooses among, keyed on the problem shape (the lecture prints them)
MATMUL_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in ((128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 32, 4, 2))
]


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, MASKED: tl.constexpr = True):
    """``out[i] = x[i] + y[i]``: program ``p`` owns elements ``[p * BLOCK, (p + 1) * BLOCK)``.

    ``MASKED=False`` drops the mask: right only when ``BLOCK`` divides ``n``; otherwise the last program reads
    and writes past the end (the lecture shows what that overwrites, and what the mask compiles to)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASKED:
        inside = offs < n
        x = tl.load(x_ptr + offs, mask=inside)
        y = tl.load(y_ptr + offs, mask=inside)
        tl.store(out_ptr + offs, x + y, mask=inside)
    else:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


def add(x: torch.Tensor, y: torch.Tensor, block: int = 1024, out: torch.Tensor | None = None,
        masked: bool = True) -> torch.Tensor:
    """``x + y`` for 1-d tensors of one dtype and length, by ``add_kernel`` with ``cdiv(n, block)`` programs."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.dim() != 1 or x.shape != y.shape \
            or x.dtype != y.dtype:
        raise ValueError(f"x and y must be 1-d tensors of one shape and dtype, got {tuple(getattr(x, 'shape', ()))} "
                         f"{getattr(x, 'dtype', type(x))} and {tuple(getattr(y, 'shape', ()))} "
                         f"{getattr(y, 'dtype', type(y))}")
    if not (isinstance(block, int) and block > 0 and block & (block - 1) == 0):
        raise ValueError(f"block must be a power of two (tl.arange needs one), got {block!r}")
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block, MASKED=masked)
    return out


@triton.jit
def softmax_row_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    """One program per row, the whole row in one block: load once, max, exp, sum, divide, store once.

    Lanes past ``n_cols`` load ``-inf`` (``other=``), so they add ``exp(-inf) = 0`` to the sum and never win
    the max; the store's mask keeps them out of ``y``."""
    row = tl.program_id(0).to(tl.int64)             # int64: row * stride can pass 2**31 on large inputs
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * stride_y + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=inside)


def softmax_rows(x: torch.Tensor, num_warps: int = 4) -> torch.Tensor:
    """Softmax over the last axis of a 2-d tensor whose rows fit in one block (at most 16384 columns)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16,
                                                                          torch.float32):
        raise ValueError(f"x must be a 2-d float16/bfloat16/float32 tensor, got {getattr(x, 'shape', type(x))}")
    if not 1 <= x.shape[1] <= 16384:
        raise ValueError(f"x must have 1 to 16384 columns (one block per row), got {x.shape[1]}")
    x = x if x.stride(1) == 1 else x.contiguous()
    y = torch.empty_like(x)
    softmax_row_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), y.stride(0),
                                      BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=num_warps)
    return y


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``C = A B``: program ``(i, j)`` owns the ``BLOCK_M x BLOCK_N`` tile of ``C`` at block row ``i``, column
    ``j``, and accumulates ``A[i, k] B[k, j]`` over ``cdiv(K, BLOCK_K)`` tiles of ``K`` in float32 registers
    (the tiled matmul of lecture 2; ``tl.dot`` runs each tile product on the tensor cores)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)   # zeros add nothing to the sum
        b = tl.load(b_ptr + kk[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


matmul_autotuned = triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"])(matmul_kernel)


def _check_matmul(a, b):
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != 2 or b.dim() != 2 \
            or a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(f"a (M, K) and b (K, N) must be 2-d tensors of one dtype with matching K, got "
                         f"{tuple(getattr(a, 'shape', ()))} and {tuple(getattr(b, 'shape', ()))}")


def matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = 64, block_n: int = 64, block_k: int = 32,
           num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """``a @ b`` by ``matmul_kernel`` with the given tiles and launch options (every tile size >= 16:
    ``tl.dot``'s smallest)."""
    _check_matmul(a, b)
    if min(block_m, block_n, block_k) < 16:
        raise ValueError(f"every block must be >= 16 (tl.dot), got {block_m}, {block_n}, {block_k}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    matmul_kernel[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps,
                        num_stages=num_stages)
    return c


def matmul_tuned(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, triton.Config]:
    """``(a @ b, the config the autotuner chose)``: on a GPU the first call per ``(M, N, K)`` times every one of
    ``MATMUL_CONFIGS`` and keeps the fastest; the interpreter cannot time, so there the first config is used."""
    _check_matmul(a, b)
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    if INTERPRET:
        cfg = MATMUL_CONFIGS[0]
        return matmul(a, b, cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"], cfg.num_warps,
                      cfg.num_stages), cfg
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))  # noqa: E731
    matmul_autotuned[grid](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride())
    return c, matmul_autotuned.best_config
