"""``merge_states`` as one fused Triton pass over row slices of the ring's running state (GPU).

Per row (FlashInfer's merge rule, ``reference.distributed.merge``): ``m = max(lse_a, lse_b)``,
``e_x = exp(lse_x - m)`` (0 for ``-inf``), ``lse = m + log(e_a + e_b)``, ``o = (e_a o_a + e_b o_b) / (e_a + e_b)``;
rows empty on both sides keep ``o = 0``, ``lse = -inf``. ``merge_into`` writes this as five torch passes over
the ``o`` tensors (two of them over fp32 ``o_acc``: ~18 bytes moved per element with a bf16 ``o_b``); this
kernel reads each side once and writes once: 6 bytes per element with a bf16 state, 10 with fp32. The ``o``
arguments are ``(B, H, R, d)`` row slices of ``(B, H, N, d)`` tensors (strided heads, unit last stride), the
``lse`` ones ``(B, H, R)`` slices with unit row stride; arithmetic in fp32, one rounding into ``o_acc``.
"""
from __future__ import annotations

import torch

from reference.triton import _device  # noqa: F401  (interpreter or GPU, chosen before the kernel is defined)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

#: rows per program (x d columns): 64 x 128 bf16 elements = 16 KiB per side, memory-bound
MERGE_BLOCK_R = 64


@triton.jit
def _merge_rows_kernel(O, LSE, OB, LSEB, R, H,
                       s_ob, s_oh, s_or, s_lb, s_lh, t_ob, t_oh, t_or, t_lb, t_lh,
                       D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_r = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    la = tl.load(LSE + b * s_lb + h * s_lh + rows, mask=row_ok, other=float("-inf")).to(tl.float32)
    lb = tl.load(LSEB + b * t_lb + h * t_lh + rows, mask=row_ok, other=float("-inf")).to(tl.float32)
    m = tl.maximum(la, lb)
    m_safe = tl.where(m == float("-inf"), 0.0, m)          # no -inf - -inf
    ea = tl.exp(la - m_safe)
    eb = tl.exp(lb - m_safe)
    tot = ea + eb
    seen = tot > 0.0
    tot_safe = tl.where(seen, tot, 1.0)
    lse = tl.where(seen, m_safe + tl.log(tot_safe), float("-inf"))
    wa = ea / tot_safe
    wb = eb / tot_safe
    cols = tl.arange(0, BLOCK_D)
    mask = row_ok[:, None] & (cols[None, :] < D)
    pa = O + b * s_ob + h * s_oh + rows[:, None].to(tl.int64) * s_or + cols[None, :]
    pb = OB + b * t_ob + h * t_oh + rows[:, None].to(tl.int64) * t_or + cols[None, :]
    oa = tl.load(pa, mask=mask, other=0.0).to(tl.float32)
    ob = tl.load(pb, mask=mask, other=0.0).to(tl.float32)
    o = tl.where(wa[:, None] > 0, wa[:, None] * oa, 0.0) + tl.where(wb[:, None] > 0, wb[:, None] * ob, 0.0)
    tl.store(pa, o.to(O.dtype.element_ty), mask=mask)
    tl.store(LSE + b * s_lb + h * s_lh + rows, lse, mask=row_ok)


def triton_mergeable(o_acc, lse_acc, o_b, lse_b) -> bool:
    """Shapes and strides the kernel handles: 4-D ``o`` with unit last stride, 3-D ``lse`` with unit row stride."""
    return (o_acc.dim() == 4 and o_b.shape == o_acc.shape and lse_acc.shape == o_acc.shape[:3]
            and lse_b.shape == lse_acc.shape and o_acc.stride(3) == 1 and o_b.stride(3) == 1
            and lse_acc.stride(2) == 1 and lse_b.stride(2) == 1 and lse_acc.dtype == torch.float32
            and o_acc.device == o_b.device == lse_acc.device == lse_b.device)


def merge_rows_triton(o_acc, lse_acc, o_b, lse_b, block_r: int = MERGE_BLOCK_R) -> None:
    """In-place ``(o_acc, lse_acc) <- merge((o_acc, lse_acc), (o_b, lse_b))`` in one pass (module docstring)."""
    if not triton_mergeable(o_acc, lse_acc, o_b, lse_b):
        raise ValueError(f"merge_rows_triton needs o (B, H, R, d) with unit last stride and lse (B, H, R) float32 "
                         f"with unit row stride on one device; got o_acc {tuple(o_acc.shape)} "
                         f"{tuple(o_acc.stride())}, o_b {tuple(o_b.shape)}, lse_acc {tuple(lse_acc.shape)} "
                         f"{lse_acc.dtype}, lse_b {tuple(lse_b.shape)}")
    B, H, R, d = o_acc.shape
    if R == 0 or B * H == 0:
        return
    lse_b = lse_b.to(torch.float32)
    grid = (triton.cdiv(R, block_r), B * H)
    _merge_rows_kernel[grid](o_acc, lse_acc, o_b, lse_b, R, H,
                             o_acc.stride(0), o_acc.stride(1), o_acc.stride(2), lse_acc.stride(0), lse_acc.stride(1),
                             o_b.stride(0), o_b.stride(1), o_b.stride(2), lse_b.stride(0), lse_b.stride(1),
                             D=d, BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(d), num_warps=4)
