"""Stage 1: three ways to compute a softmax, and the (m, l) statistics that make softmax composable.

    softmax(x)_i = e^{x_i} / sum_j e^{x_j}

* ``naive_softmax``  -- the formula as written. float16 tops out at 65504 < e^12 (~162755), so any logit above
  ~11.09 overflows ``exp`` to ``inf`` and the row becomes ``inf / inf = nan``. It deliberately computes in the
  input dtype so a student *sees* that (NumPy also prints an overflow RuntimeWarning).
* ``safe_softmax``   -- the max trick of the seeds: with m(x) = max_i x_i, f(x) = e^{x - m(x)},
  l(x) = sum_i f(x)_i, softmax(x) = f(x) / l(x). Every exponent is <= 0, so nothing overflows.
* ``online_softmax`` -- one streaming pass over the row, block by block, keeping a running max m and a running
  sum l (the "online normaliser" of Milakov & Gimelshein, 2018), then one normalisation pass that re-reads x.
  Blocks are combined with the seeds' rule

      m = max(m1, m2),   l = e^{m1 - m} l1 + e^{m2 - m} l2,

  which is ``merge_softmax_stats``. The same rule, applied to a running output as well, is FlashAttention.

Rows that are entirely ``-inf`` (e.g. a fully masked attention row) have no meaningful softmax. ``safe_softmax``
and ``online_softmax`` define their output as all zeros (and ``softmax_stats`` gives m = -inf, l = 0) instead of
the NaN that ``-inf - (-inf)`` would produce. ``naive_softmax`` gives NaN there (0/0), on purpose.
"""
from __future__ import annotations

import numbers

import numpy as np

from ._validate import as_float_array, check_positive_int, compute_dtype

__all__ = ["naive_softmax", "safe_softmax", "online_softmax", "softmax_stats", "merge_softmax_stats"]


def _check_axis(axis, ndim: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis must be an integer, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis must be in [{-ndim}, {ndim - 1}] for an array of rank {ndim}, got {axis}")
    return int(axis) % ndim


def _finite_or_zero(m: np.ndarray) -> np.ndarray:
    """Replace a max of -inf (empty or fully masked row) by 0 so that ``x - m`` stays -inf, never NaN."""
    return np.where(m == -np.inf, 0.0, m).astype(m.dtype, copy=False)


def naive_softmax(x, axis=-1):
    """``exp(x) / sum(exp(x))`` in the input dtype, with NO max subtraction.

    This is the textbook formula and it is numerically broken on purpose: in float16, ``exp`` overflows for
    x > ~11.09 (65504 < e^12), giving ``inf`` and then ``inf / inf = nan``. A row of all ``-inf`` gives
    ``0 / 0 = nan``. Use ``safe_softmax`` for anything real.
    """
    x = as_float_array(x, "x")
    axis = _check_axis(axis, x.ndim)
    e = np.exp(x)  # stays in x.dtype: float16 overflows right here
    return e / np.sum(e, axis=axis, keepdims=True, dtype=x.dtype)


def safe_softmax(x, axis=-1):
    """Softmax with the max trick (seeds: m(x) = max x_i, f = e^{x - m}, l = sum f, softmax = f / l).

    Accumulates in at least float32 and returns the input dtype. A row that is all ``-inf`` gives zeros.
    """
    x = as_float_array(x, "x")
    axis = _check_axis(axis, x.ndim)
    xc = x.astype(compute_dtype(x), copy=False)
    m = np.max(xc, axis=axis, keepdims=True, initial=-np.inf)
    f = np.exp(xc - _finite_or_zero(m))
    l = np.sum(f, axis=axis, keepdims=True)
    return (f / np.where(l == 0, 1, l)).astype(x.dtype, copy=False)


def _stats(xc: np.ndarray):
    """(m, l) of the last axis of an already-validated compute-dtype array (no copies of x)."""
    m = np.max(xc, axis=-1, initial=-np.inf)
    l = np.sum(np.exp(xc - _finite_or_zero(m)[..., None]), axis=-1)
    return m, l


def softmax_stats(x):
    """Return ``(m, l)`` of the last axis: m = max_i x_i and l = sum_i e^{x_i - m} (seeds' m(x) and l(x)).

    Both have shape ``x.shape[:-1]`` and dtype at least float32. An all ``-inf`` (or empty) row gives
    ``m = -inf, l = 0``. ``m + log(l)`` is the row's log-sum-exp.
    """
    x = as_float_array(x, "x")
    return _stats(x.astype(compute_dtype(x), copy=False))


def _merge(m1, l1, m2, l2):
    m = np.maximum(m1, m2)
    ms = _finite_or_zero(m)  # both parts empty: m = -inf, and e^{-inf - 0} = 0 keeps l = 0
    return m, np.exp(m1 - ms) * l1 + np.exp(m2 - ms) * l2


def merge_softmax_stats(m1, l1, m2, l2):
    """Combine the statistics of two parts of a row (seeds): m = max(m1, m2), l = e^{m1-m} l1 + e^{m2-m} l2.

    All four arrays must have the same shape (nothing is broadcast). A part with ``m = -inf, l = 0`` (empty or
    fully masked) contributes nothing; if both are such, the result is ``m = -inf, l = 0``, never NaN.
    """
    arrs = [as_float_array(a, name, min_ndim=0) for a, name in ((m1, "m1"), (l1, "l1"), (m2, "m2"), (l2, "l2"))]
    shape = arrs[0].shape
    for a, name in zip(arrs[1:], ("l1", "m2", "l2")):
        if a.shape != shape:
            raise ValueError(f"{name} must have the same shape as m1 {shape}, got {a.shape}")
    ct = compute_dtype(*arrs)
    m1, l1, m2, l2 = (a.astype(ct, copy=False) for a in arrs)
    return _merge(m1, l1, m2, l2)


def online_softmax(x, block_size=128):
    """Softmax over the last axis with the online normaliser (Milakov & Gimelshein, 2018).

    Pass 1 streams over the row ONCE, ``block_size`` elements at a time, keeping only a running (m, l) per
    row: each block's (m_b, l_b) is folded in with ``l = e^{m - m_new} l + e^{m_b - m_new} l_b``. Pass 2
    re-reads x once to write ``e^{x - m} / l``. Equal to ``safe_softmax(x)`` up to rounding; a row of all
    ``-inf`` gives zeros. Accumulates in at least float32, returns the input dtype.
    """
    x = as_float_array(x, "x")
    block_size = check_positive_int(block_size, "block_size")
    ct = compute_dtype(x)
    n = x.shape[-1]
    m = np.full(x.shape[:-1], -np.inf, dtype=ct)
    l = np.zeros(x.shape[:-1], dtype=ct)
    for start in range(0, n, block_size):  # pass 1: one read of x
        mb, lb = _stats(x[..., start:start + block_size].astype(ct, copy=False))
        m, l = _merge(m, l, mb, lb)
    out = np.exp(x.astype(ct, copy=False) - _finite_or_zero(m)[..., None])  # pass 2: re-read x
    out /= np.where(l == 0, 1, l)[..., None]
    return out.astype(x.dtype, copy=False)
