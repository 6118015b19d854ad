"""FP8 attention error with and without incoherent processing (a random Hadamard rotation).

One of the simulations of Tri Dao's FlashAttention-3 talk ("Optimizing Attention for Modern Hardware") that
``reference.simulators`` holds. Nothing here runs on a GPU: each function turns one slide into arithmetic or a
simulation that can be checked.

* FP8 with incoherent processing (slide 24): ``fp8_incoherent_experiment`` quantises Q, K (and V) to float8
  e4m3 with per-tensor scaling and measures the error of ``S = Q K^T`` and of the attention output against
  float64, with and without first multiplying Q and K by ``J = diag(random +-1) H / sqrt(d)`` (Sylvester
  Hadamard). ``S = (Q J)(K J)^T`` because ``J J^T = I``.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .._args import check_nonneg_real, check_positive_int, check_rng

__all__ = ["sylvester_hadamard", "random_hadamard", "quantize_fp8", "outlier_qkv", "fp8_incoherent_experiment",
           "aligned_error"]


def sylvester_hadamard(d):
    """The ``d x d`` Sylvester Hadamard matrix divided by ``sqrt(d)`` (orthogonal); ``d`` a power of two."""
    d = check_positive_int(d, "d")
    if d & (d - 1):
        raise ValueError(f"d must be a power of two for a Sylvester Hadamard matrix, got {d}")
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(d)


def random_hadamard(d, rng):
    """``J = diag(s) H / sqrt(d)`` with random signs ``s``: a random orthogonal matrix cheap to apply (FA3 3.3)."""
    check_rng(rng)
    h = sylvester_hadamard(d)
    signs = rng.choice(np.array([-1.0, 1.0]), size=h.shape[0])
    return signs[:, None] * h


def quantize_fp8(x):
    """Round ``x`` to float8 e4m3 with one per-tensor scale (amax -> 448) and return it dequantised, float64.

    Uses ``torch.float8_e4m3fn`` (3 mantissa bits: relative spacing 1/8, max 448) for the rounding itself.
    """
    import torch

    x = np.asarray(x, dtype=np.float64)
    amax = float(np.abs(x).max()) if x.size else 0.0
    if amax == 0.0 or not math.isfinite(amax):
        raise ValueError(f"x must be finite and not all zero to choose an fp8 scale, got amax={amax}")
    scale = 448.0 / amax
    q = torch.from_numpy(x * scale).to(torch.float8_e4m3fn).to(torch.float64).numpy()
    return q / scale


def outlier_qkv(rng, shape, outlier_frac=1e-3, outlier_std=10.0):
    """``N(0, 1)`` entries plus, for a fraction ``outlier_frac`` of entries, an independent ``N(0, outlier_std^2)``.

    The FA3 paper's numerical-error setup (section 4.3): outliers simulate the large activations of real LLMs.
    """
    check_rng(rng)
    if isinstance(outlier_frac, bool) or not isinstance(outlier_frac, numbers.Real):
        raise TypeError(f"outlier_frac must be a number in [0, 1], got {outlier_frac!r}")
    if not (0.0 <= outlier_frac <= 1.0):
        raise ValueError(f"outlier_frac must be in [0, 1], got {outlier_frac}")
    x = rng.standard_normal(shape)
    mask = rng.random(shape) < outlier_frac
    return x + mask * rng.standard_normal(shape) * check_nonneg_real(outlier_std, "outlier_std")


def _attention_out(s, v, d):
    """``softmax(s / sqrt(d)) @ v`` in float64, the row sums divided out after the product (``n x d`` divisions,
    not ``n x n``), the ``n x n`` temporaries reused in place: at ``n = 4096`` each is 128 MB."""
    p = np.divide(s, math.sqrt(d))
    p -= p.max(axis=-1, keepdims=True)
    np.exp(p, out=p)
    return (p @ v) / p.sum(axis=-1, keepdims=True)


def _rms(a):
    a = np.ravel(a)
    return float(np.sqrt(np.dot(a, a) / a.size))         # no n x n temporary for the squares


def fp8_incoherent_experiment(rng, n=1024, d=128, n_heads=2, outlier_frac=1e-3, outlier_std=10.0):
    """Quantisation error of FP8 attention with and without a random Hadamard rotation of Q and K.

    For ``n_heads`` independent heads of ``outlier_qkv`` data (``n x d``), compares to float64:
    ``S = Q K^T`` against ``fp8(Q) fp8(K)^T`` ("plain") and ``fp8(Q J) fp8(K J)^T`` ("hadamard"), and the
    attention output ``softmax(S / sqrt(d)) V`` against the same with the FP8 scores and ``fp8(V)`` (softmax
    itself in float64, as FA3 keeps it in FP32). Returns a dict of RMS errors, their ratios, and
    ``rotation_err``: the largest ``|(QJ)(KJ)^T - QK^T|`` in float64 (rounding only).
    """
    check_rng(rng)
    n, d, n_heads = check_positive_int(n, "n"), check_positive_int(d, "d"), check_positive_int(n_heads, "n_heads")
    err = {"s_plain": [], "s_hadamard": [], "o_plain": [], "o_hadamard": [], "s_rms": [], "o_rms": []}
    rot = 0.0
    for _ in range(n_heads):
        q, k, v = (outlier_qkv(rng, (n, d), outlier_frac, outlier_std) for _ in range(3))
        j = random_hadamard(d, rng)
        qj, kj = q @ j, k @ j
        s = q @ k.T
        o = _attention_out(s, v, d)
        v8 = quantize_fp8(v)
        s_plain = quantize_fp8(q) @ quantize_fp8(k).T
        s_had = quantize_fp8(qj) @ quantize_fp8(kj).T
        diff = qj @ kj.T
        diff -= s
        rot = max(rot, float(np.abs(diff, out=diff).max()))
        del diff
        for name, s8 in (("plain", s_plain), ("hadamard", s_had)):
            err["o_" + name].append(_rms(_attention_out(s8, v8, d) - o))
            s8 -= s                                  # its error, in place (the scores are not read again)
            err["s_" + name].append(_rms(s8))
        err["s_rms"].append(_rms(s))
        err["o_rms"].append(_rms(o))
    out = {key: float(np.sqrt(np.mean(np.square(vals)))) for key, vals in err.items()}
    out["s_ratio"] = out["s_plain"] / out["s_hadamard"]
    out["o_ratio"] = out["o_plain"] / out["o_hadamard"]
    out["rotation_err"] = rot
    return out


def aligned_error(s_true, s_approx):
    """Split the error ``E = s_approx - s_true`` of each score row into a part along the row itself and the rest.

    Per row, ``beta = <E, S> / <S, S>`` is a relative "temperature" error (the row's logits all scaled by
    ``1 + beta``); returns ``(rms of beta * S, rms of the remainder, max |beta|)``. Quantising an outlier
    coordinate of ``q`` with relative error ``eps`` scales that coordinate's whole contribution to the row by
    ``1 + eps``, which is mostly this aligned part; a rotation spreads the outlier over ``d`` coordinates whose
    independent roundings largely cancel along the row.
    """
    s_true, s_approx = np.asarray(s_true, dtype=np.float64), np.asarray(s_approx, dtype=np.float64)
    if s_true.shape != s_approx.shape or s_true.ndim < 1:
        raise ValueError(f"s_approx must have the shape of s_true {s_true.shape}, got {s_approx.shape}")
    e = s_approx - s_true
    denom = np.sum(s_true * s_true, axis=-1, keepdims=True)
    beta = np.sum(e * s_true, axis=-1, keepdims=True) / np.where(denom == 0, 1, denom)
    along = beta * s_true
    return _rms(along), _rms(e - along), float(np.abs(beta).max())
