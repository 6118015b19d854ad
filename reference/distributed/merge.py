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


_STATE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def state_dtype_for(q: torch.Tensor, world: int, choice=None) -> torch.dtype:
    """dtype of a rank's running output between ring steps (``RunningState``); ``lse`` is always fp32/fp64.

    ``choice`` (a torch float dtype) wins; by default float64 for float64 inputs, the input's own 16-bit dtype
    for 16-bit inputs on at most ``RING_PINS["half_state_max_world"]`` ranks (``reference.triton.configs``,
    with the error measured against float64 that chose it), float32 otherwise.
    """
    if choice is not None:
        if choice not in _STATE_DTYPES:
            raise TypeError(f"state_dtype must be one of {_STATE_DTYPES} or None, got {choice!r}")
        return choice
    if q.dtype == torch.float64:
        return torch.float64
    if q.dtype in (torch.float16, torch.bfloat16):
        from reference.triton.configs import RING_PINS
        if world <= RING_PINS["half_state_max_world"]:
            return q.dtype
    return torch.float32


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


def _merge_rows_torch(o_acc, lse_acc, o_b, lse_b) -> None:
    """:func:`merge_into` for any accumulator dtype: 16-bit ``o_acc`` is merged in fp32 and rounded once."""
    if o_acc.dtype in (torch.float32, torch.float64):
        merge_into(o_acc, lse_acc, o_b, lse_b)
        return
    o32 = o_acc.float()
    merge_into(o32, lse_acc, o_b, lse_b)
    o_acc.copy_(o32)


def merge_rows_(o_acc: torch.Tensor, lse_acc: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """``(o_acc, lse_acc) <- merge_states((o_acc, lse_acc), (o_b, lse_b))`` in place (module docstring).

    On a GPU one fused Triton pass (``merge_triton``: each element read once from each side and written once,
    against the five passes of :func:`merge_into`); on CPU, float64, or odd strides, :func:`merge_into`.
    ``o_acc`` may be float32 or the input's 16-bit dtype (then merged in fp32 and rounded once).
    """
    if o_acc.is_cuda and o_acc.dtype != torch.float64 and lse_acc.dtype == torch.float32:
        from .merge_triton import merge_rows_triton, triton_mergeable
        if triton_mergeable(o_acc, lse_acc, o_b, lse_b):
            merge_rows_triton(o_acc, lse_acc, o_b, lse_b)
            return
    _merge_rows_torch(o_acc, lse_acc, o_b, lse_b)


class RunningState:
    """A rank's running ``(o, lse)`` over the ring steps: ``(B, H, N, d)`` outputs in ``dtype`` and
    ``(B, H, N)`` log-sum-exps in ``lse_dtype``, starting as "no key seen" (``o = 0``, ``lse = -inf``).

    The first output absorbed is adopted (when it covers every row in ``dtype``: no copy, no merge; otherwise
    copied into a fresh zero / ``-inf`` state), later ones are merged with :func:`merge_rows_`. So the diagonal
    step of the ring costs no merge, and a 16-bit state (the input dtype) keeps the output in the kernel's own
    dtype: each merge computes in fp32 and rounds once (with two ranks exactly one rounding, as the fp32 state).
    Local steps return fresh tensors, so adopting one is safe.
    """

    def __init__(self, shape, dtype, lse_dtype, device):
        self.shape, self.dtype, self.lse_dtype, self.device = tuple(shape), dtype, lse_dtype, device
        self.o = self.lse = None

    def _allocate(self):
        self.o = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.lse = torch.full(self.shape[:3], float("-inf"), dtype=self.lse_dtype, device=self.device)

    def absorb(self, lo: int, hi: int, o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
        """Merge the partial state of rows ``[lo, hi)`` (shapes ``(B, H, hi - lo, d)`` and ``(B, H, hi - lo)``)."""
        if self.o is None:
            if lo == 0 and hi == self.shape[2] and o_b.dtype == self.dtype and o_b.shape == self.shape:
                self.o = o_b if o_b.is_contiguous() else o_b.contiguous()
                self.lse = lse_b.to(self.lse_dtype).contiguous()
                return
            self._allocate()
            self.o[:, :, lo:hi] = o_b
            self.lse[:, :, lo:hi] = lse_b
            return
        merge_rows_(self.o[:, :, lo:hi], self.lse[:, :, lo:hi], o_b, lse_b)

    def result(self):
        """``(o, lse)``: the merged state (zeros / ``-inf`` if nothing was absorbed)."""
        if self.o is None:
            self._allocate()
        return self.o, self.lse
