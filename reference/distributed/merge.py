"""``merge_states`` on torch tensors: the rule that makes attention over a sharded sequence exact.

For one query row and two disjoint key sets A, B with partial results ``(o_A, lse_A)`` and ``(o_B, lse_B)``
(the recursive-attention rule of ``reference.numpy.merge``; FlashInfer, MLSys 2025):

    lse = log(exp(lse_A) + exp(lse_B)),     o = exp(lse_A - lse) o_A + exp(lse_B - lse) o_B.

Ring attention applies it once per ring step: the running state of a rank's queries absorbs the state of the
K/V chunk that is visiting. ``lse = -inf`` marks an empty key set (weight 0, its ``o`` row ignored, never NaN).
"""
from __future__ import annotations

import torch


def acc_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (partial states are always merged in at least fp32)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def merge_states_torch(o_a, lse_a, o_b, lse_b):
    """Attention over the union of two disjoint key sets from the attention over each (module docstring).

    Args:
        o_a, o_b: ``(..., N, d)`` partial outputs (same shape; any float dtype).
        lse_a, lse_b: ``(..., N)`` natural-log log-sum-exps; ``-inf`` where the key set was empty.

    Returns:
        ``(o, lse)`` in float32 (float64 if any input is float64); rows empty on both sides give 0 and -inf.
    """
    for name, t in (("o_a", o_a), ("lse_a", lse_a), ("o_b", o_b), ("lse_b", lse_b)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point torch.Tensor, got {type(t).__name__}")
    if o_a.shape != o_b.shape or lse_a.shape != o_a.shape[:-1] or lse_b.shape != o_a.shape[:-1]:
        raise ValueError(f"expected o_a, o_b of one shape (..., N, d) and lse_a, lse_b of shape (..., N); got "
                         f"o_a {tuple(o_a.shape)}, lse_a {tuple(lse_a.shape)}, o_b {tuple(o_b.shape)}, "
                         f"lse_b {tuple(lse_b.shape)}")
    acc = acc_dtype(o_a, lse_a, o_b, lse_b)
    la, lb = lse_a.to(acc), lse_b.to(acc)
    lse = torch.logaddexp(la, lb)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # no exp(-inf - -inf) = NaN
    w_a = torch.where(torch.isfinite(la), torch.exp(la - safe), torch.zeros_like(la)).unsqueeze(-1)
    w_b = torch.where(torch.isfinite(lb), torch.exp(lb - safe), torch.zeros_like(lb)).unsqueeze(-1)
    zero = torch.zeros((), dtype=acc, device=o_a.device)
    o = (torch.where(w_a > 0, w_a * o_a.to(acc), zero) + torch.where(w_b > 0, w_b * o_b.to(acc), zero))
    return o, lse


def merge_into(o_acc: torch.Tensor, lse_acc: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """In-place :func:`merge_states_torch` for the ring's running state: ``(o_acc, lse_acc) <- merge(...)``.

    Two passes over the big ``o`` tensors (``o_acc *= w_a``; ``o_acc += w_b * o_b``) instead of one per
    elementwise step: this runs once per kernel call of every ring step. It relies on what every local step
    and the zero-initialised accumulator guarantee: a row with ``lse = -inf`` has ``o = 0`` (not garbage).
    ``o_acc``/``lse_acc`` may be views (row slices) of the accumulators; they are float32 or float64.
    """
    lse_new = torch.logaddexp(lse_acc, lse_b.to(lse_acc.dtype))
    safe = torch.where(torch.isfinite(lse_new), lse_new, torch.zeros_like(lse_new))  # no -inf - -inf
    o_acc.mul_(torch.exp(lse_acc - safe).unsqueeze(-1))
    o_acc.addcmul_(o_b, torch.exp(lse_b.to(lse_acc.dtype) - safe).unsqueeze(-1))
    lse_acc.copy_(lse_new)
