"""Merging partial attention results ("recursive attention", stage 4 of the course).

For a query row with scaled scores ``s_i`` over a key index set ``I`` define (FlashInfer, MLSys 2025; the
seeds' "recursive attention" slides)

    s(I) = log sum_{i in I} exp(s_i)                      (the row's lse over I)
    v(I) = sum_{i in I} exp(s_i - s(I)) v_i               (attention output over I)

For a partition ``I = I_1 u ... u I_n`` into disjoint sets

    s(I) = log sum_j exp(s(I_j))
    v(I) = sum_j exp(s(I_j) - s(I)) v(I_j)

so attention is associative and commutative: any split of the keys can be attended piece by piece and the
pieces combined in any order. Flash-Decoding's reduction (stage 2), FlashAttention's online rescaling and
PagedAttention's block-by-block reads are all this rule.

An empty key set has ``s = -inf`` and ``v = 0``; merging it with anything is the identity, and merging two
empty sets gives ``o = 0``, ``lse = -inf`` (never NaN).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ._validate import as_float_array, compute_dtype, lse_dtype

__all__ = ["merge_states", "merge_many"]


def _check_state(o, lse, o_name: str, lse_name: str):
    o = as_float_array(o, o_name, min_ndim=2)
    lse = as_float_array(lse, lse_name, min_ndim=1)
    if lse.shape != o.shape[:-1]:
        raise ValueError(
            f"{lse_name} must have shape (..., N) = {o.shape[:-1]} to match {o_name} of shape (..., N, d) = "
            f"{o.shape}, got {lse.shape}")
    if np.isnan(lse).any() or np.isposinf(lse).any():
        raise ValueError(f"{lse_name} must be finite or -inf (an empty key set); it contains NaN or +inf")
    return o, lse


def merge_states(o_a, lse_a, o_b, lse_b):
    """Attention over the union of two disjoint key sets from the attention over each set.

    Implements the recursive-attention rule for a partition into two parts (module docstring):
    ``lse = logaddexp(lse_a, lse_b)``, ``o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b``.

    Args:
        o_a, o_b: partial outputs, shape ``(..., N, d)`` (same shape; nothing is broadcast).
        lse_a, lse_b: their natural-log log-sum-exps of the scaled scores, shape ``(..., N)``; ``-inf`` marks a
            row whose key set was empty (its ``o`` row is ignored).

    Returns:
        ``(o, lse)``: ``o`` in the promoted dtype of ``o_a``/``o_b``, computed in at least float32; ``lse``
        float64 if any input is float64, else float32. Rows empty on both sides give ``o = 0``, ``lse = -inf``.
    """
    o_a, lse_a = _check_state(o_a, lse_a, "o_a", "lse_a")
    o_b, lse_b = _check_state(o_b, lse_b, "o_b", "lse_b")
    if o_a.shape != o_b.shape:
        raise ValueError(f"o_a and o_b must have the same shape (..., N, d), got {o_a.shape} and {o_b.shape}")
    acc = compute_dtype(o_a, lse_a, o_b, lse_b)
    out_dtype = np.result_type(o_a.dtype, o_b.dtype)
    la, lb = lse_a.astype(acc), lse_b.astype(acc)
    lse = np.logaddexp(la, lb)                       # s(A u B) = log(e^{s(A)} + e^{s(B)})
    finite = np.isfinite(lse)
    safe = np.where(finite, lse, 0.0)               # keeps exp(-inf - -inf) = NaN out of the weights
    w_a = np.where(np.isfinite(la), np.exp(la - safe), 0.0)
    w_b = np.where(np.isfinite(lb), np.exp(lb - safe), 0.0)
    # np.where (not w * o) so a garbage/NaN o row behind lse = -inf cannot leak into the result.
    o = (np.where(w_a[..., None] > 0, w_a[..., None] * o_a.astype(acc), 0.0)
         + np.where(w_b[..., None] > 0, w_b[..., None] * o_b.astype(acc), 0.0))
    return o.astype(out_dtype), lse.astype(lse_dtype(o_a, lse_a, o_b, lse_b))


def merge_many(os: Sequence, lses: Sequence):
    """Merge ``n >= 1`` partial states over pairwise disjoint key sets in one max-shifted pass.

    This is the n-way form of the recursive-attention rule (the reduction of Flash-Decoding, "reduce over all
    splits"): with ``m = max_j lse_j``,

        lse = m + log sum_j exp(lse_j - m),     o = sum_j exp(lse_j - lse) o_j.

    One pass instead of a tree of :func:`merge_states` calls; the result equals any tree order up to rounding
    (associativity and commutativity), which the tests check.

    Args:
        os: a sequence (list/tuple, or an array iterated along axis 0) of outputs, each ``(..., N, d)``.
        lses: the matching sequence of lse arrays, each ``(..., N)``.

    Returns:
        ``(o, lse)`` with the dtype rules of :func:`merge_states`.
    """
    if isinstance(os, np.ndarray) or isinstance(lses, np.ndarray):
        os, lses = list(os), list(lses)
    if not isinstance(os, (list, tuple)) or not isinstance(lses, (list, tuple)):
        raise TypeError(f"os and lses must be sequences (list/tuple) of arrays, got {type(os).__name__} "
                        f"and {type(lses).__name__}")
    if len(os) == 0:
        raise ValueError("os must hold at least one partial output, got an empty sequence")
    if len(os) != len(lses):
        raise ValueError(f"os and lses must have the same length, got {len(os)} outputs and {len(lses)} lses")
    states = [_check_state(o, l, f"os[{j}]", f"lses[{j}]") for j, (o, l) in enumerate(zip(os, lses))]
    shape = states[0][0].shape
    for j, (o, _) in enumerate(states):
        if o.shape != shape:
            raise ValueError(f"every partial output must have the same shape, os[0] is {shape} but os[{j}] is "
                             f"{o.shape}")
    flat = [a for st in states for a in st]
    acc = compute_dtype(*flat)
    out_dtype = np.result_type(*[o.dtype for o, _ in states])
    L = np.stack([l.astype(acc) for _, l in states])              # (n, ..., N)
    m = L.max(axis=0)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    w = np.where(np.isfinite(L), np.exp(L - m_safe), 0.0)          # e^{lse_j - m}, 0 for empty parts
    total = w.sum(axis=0)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, m_safe + np.log(total), -np.inf)
    inv = np.where(total > 0, 1.0 / np.where(total > 0, total, 1.0), 0.0)
    o = np.zeros(shape, dtype=acc)
    for j, (o_j, _) in enumerate(states):
        wj = (w[j] * inv)[..., None]
        o += np.where(wj > 0, wj * o_j.astype(acc), 0.0)
    return o.astype(out_dtype), lse.astype(lse_dtype(*flat))
