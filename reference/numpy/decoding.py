"""Decoding: a contiguous KV cache and Flash-Decoding (split-KV attention for one query token).

Autoregressive generation runs a *prefill* over the prompt, then one *decode* step per new token. A decode
step has a single query row per sequence and head, so FlashAttention's parallelism over query blocks is gone;
Flash-Decoding (Dao et al., 2023; the seeds' "Flash-Decoding parallelizes across keys/values") restores it:

1. split the keys/values into ``num_splits`` chunks,
2. attend each chunk independently, keeping its partial output and log-sum-exp,
3. reduce over all splits with the recursive-attention merge (:func:`reference.numpy.merge.merge_many`).

Layouts follow docs/design.md §3: ``k, v (B, Hkv, N, d)``; query head ``h`` reads kv head ``h // (Hq // Hkv)``.
"""
from __future__ import annotations

import math

import numpy as np

from ._validate import (as_float_array, check_float_dtype, check_positive_int, check_qkv, check_scale, compute_dtype,
                        lse_dtype)
from ._validate import check_seq_lens
from .merge import merge_many

__all__ = ["KVCache", "KVCacheFullError", "flash_decoding", "check_seq_lens"]


class KVCacheFullError(RuntimeError):
    """Raised by :meth:`KVCache.append` when the new tokens do not fit in the pre-allocated capacity."""


class KVCache:
    """A pre-allocated contiguous KV cache ("static" cache: space for ``max_len`` tokens reserved up front).

    Storage is in the attention layout of docs/design.md §3, so the filled part can be handed to attention
    without a copy:

    * ``batch_size=None`` (default): ``k``/``v`` are ``(Hkv, len, d)``; ``append`` takes ``(Hkv, T, d)``.
    * ``batch_size=B``: ``k``/``v`` are ``(B, Hkv, len, d)``; ``append`` takes ``(B, Hkv, T, d)``; all ``B``
      sequences advance together (for ragged batches use ``flash_decoding``'s ``seq_lens`` or the paged cache).

    The token axis is the second-to-last, as in ``(..., Hkv, N, d)``, so ``k``/``v`` are slices of the buffers:
    views, never copies, and read-only (write through :meth:`append` only). Reserving ``max_len`` for every
    request is what wastes memory (internal fragmentation) and motivates ``reference.numpy.paged``.

    Args:
        max_len: capacity in tokens (positive int).
        n_kv_heads: number of key/value heads ``Hkv``.
        head_dim: head dimension ``d``.
        dtype: float16/32/64 storage dtype; appended arrays are cast to it.
        batch_size: ``None`` for one sequence, or the number of sequences.
    """

    def __init__(self, max_len, n_kv_heads, head_dim, dtype=np.float32, batch_size=None):
        self.max_len = check_positive_int(max_len, "max_len")
        self.n_kv_heads = check_positive_int(n_kv_heads, "n_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.dtype = check_float_dtype(dtype)
        self.batch_size = None if batch_size is None else check_positive_int(batch_size, "batch_size")
        lead = () if self.batch_size is None else (self.batch_size,)
        shape = lead + (self.n_kv_heads, self.max_len, self.head_dim)
        self._k = np.zeros(shape, dtype=self.dtype)
        self._v = np.zeros(shape, dtype=self.dtype)
        self._len = 0

    @property
    def layout(self) -> str:
        return "(Hkv, T, d)" if self.batch_size is None else "(B, Hkv, T, d)"

    def _expected_shape(self, t) -> tuple:
        lead = () if self.batch_size is None else (self.batch_size,)
        return lead + (self.n_kv_heads, t, self.head_dim)

    def append(self, k, v) -> None:
        """Write ``T`` new tokens' keys and values after the filled part (a decode step has ``T = 1``)."""
        k = as_float_array(k, "k")
        v = as_float_array(v, "v")
        ndim = 3 if self.batch_size is None else 4
        for name, x in (("k", k), ("v", v)):
            if x.ndim != ndim or x.shape != self._expected_shape(x.shape[-2]):
                raise ValueError(f"{name} must have shape {self.layout} = {self._expected_shape('T')}, "
                                 f"got {x.shape}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape {self.layout}, got k {k.shape} and v {v.shape}")
        t = k.shape[-2]
        if self._len + t > self.max_len:
            raise KVCacheFullError(
                f"KVCache is full: cannot append {t} token(s) to {self._len} cached, capacity max_len="
                f"{self.max_len} ({self.max_len - self._len} free)")
        self._k[..., self._len:self._len + t, :] = k
        self._v[..., self._len:self._len + t, :] = v
        self._len += t

    def _view(self, buf: np.ndarray) -> np.ndarray:
        view = buf[..., :self._len, :]
        view.flags.writeable = False
        return view

    @property
    def k(self) -> np.ndarray:
        """Read-only view of the cached keys, ``(Hkv, len, d)`` or ``(B, Hkv, len, d)``."""
        return self._view(self._k)

    @property
    def v(self) -> np.ndarray:
        """Read-only view of the cached values, same shape as :attr:`k`."""
        return self._view(self._v)

    @property
    def len(self) -> int:
        """Number of cached tokens."""
        return self._len

    def __len__(self) -> int:
        return self._len

    @property
    def free(self) -> int:
        """Tokens that still fit."""
        return self.max_len - self._len

    @property
    def nbytes(self) -> int:
        """Bytes reserved for K and V (the whole capacity, filled or not)."""
        return self._k.nbytes + self._v.nbytes

    def reset(self) -> None:
        """Forget all tokens (the buffers are kept and overwritten by later appends)."""
        self._len = 0

    def __repr__(self) -> str:
        return (f"KVCache(len={self._len}, max_len={self.max_len}, n_kv_heads={self.n_kv_heads}, "
                f"head_dim={self.head_dim}, dtype={self.dtype}, batch_size={self.batch_size})")


def _attend_chunk(qg, k, v, lo: int, hi: int, seq_lens, scale: float, acc):
    """Stage 1 for one split: attention of every query over keys ``[lo, hi)`` that are ``< seq_len``.

    ``qg`` is ``(B, Hkv, G, d)`` (the G query heads sharing a kv head packed as rows: GQA packing), ``k, v``
    are ``(B, Hkv, Nmax, d)``. Returns the chunk's partial ``o (B, Hkv, G, d)`` and ``lse (B, Hkv, G)`` in
    ``acc``; rows whose chunk holds no valid key get ``o = 0``, ``lse = -inf``.
    """
    kc = k[:, :, lo:hi].astype(acc, copy=False)
    vc = v[:, :, lo:hi].astype(acc, copy=False)
    # (K q^T)^T rather than q K^T: with G << L NumPy's batched matmul is far faster this way round.
    s = np.ascontiguousarray((kc @ qg.swapaxes(-1, -2)).swapaxes(-1, -2)) * scale   # (B, Hkv, G, L)
    valid = (lo + np.arange(hi - lo))[None, :] < seq_lens[:, None]      # (B, L)
    s = np.where(valid[:, None, None, :], s, -np.inf)
    m = s.max(axis=-1, initial=-np.inf)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe[..., None])                                   # exp(-inf) = 0 on masked keys
    l = p.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse = np.where(l > 0, m_safe + np.log(l), -np.inf)
    o = (p @ vc) / np.where(l > 0, l, 1.0)[..., None]
    return o, lse


def flash_decoding(q, k, v, num_splits=4, seq_lens=None, scale=None):
    """Flash-Decoding: attention of one new query token per sequence over its cached keys, split over keys.

    Stage 1 cuts the key axis ``[0, Nmax)`` into ``num_splits`` chunks of ``ceil(Nmax / num_splits)`` keys and
    attends each (:func:`_attend_chunk`); stage 2 reduces the partial ``(o, lse)`` with
    :func:`reference.numpy.merge.merge_many`. Partial results stay in the accumulation dtype (float32 or wider)
    between the stages, as the GPU kernel keeps them in fp32. A chunk that lies wholly past a sequence's
    ``seq_len`` (or past ``Nmax`` when ``num_splits > Nmax``) is empty: ``o = 0``, ``lse = -inf``, and the
    merge ignores it.

    Only ``q (B, Hq, d)`` is accepted: a decode step has ``Nq = 1``, which by the bottom-right causal rule of
    docs/design.md §3 sees every key, so no mask argument is needed (the same
    signature as ``reference.triton.flash_decode``).

    Args:
        q: ``(B, Hq, d)`` float16/32/64.
        k, v: ``(B, Hkv, Nmax, d)`` with ``Hq % Hkv == 0`` (GQA/MQA).
        num_splits: positive int, number of key chunks (``1`` is plain attention; ``> Nmax`` is allowed).
        seq_lens: ``(B,)`` integers in ``[0, Nmax]``; keys at positions ``>= seq_lens[b]`` are ignored. ``None``
            means every sequence has ``Nmax`` keys. A length of 0 gives ``o = 0`` and ``lse = -inf``.
        scale: softmax scale, default ``1/sqrt(d)``.

    Returns:
        ``(o, lse)``: ``o (B, Hq, d)`` in the promoted input dtype, ``lse (B, Hq)`` (natural log, float32, or
        float64 for float64 inputs).
    """
    q = as_float_array(q, "q")
    if q.ndim != 3:
        raise ValueError(f"q must have shape (B, Hq, d) (one query token per sequence), got {q.shape}")
    k = as_float_array(k, "k")
    if k.ndim != 4:
        raise ValueError(f"k must have shape (B, Hkv, Nmax, d), got {k.shape}")
    v = as_float_array(v, "v")
    if v.ndim != 4:
        raise ValueError(f"v must have shape (B, Hkv, Nmax, d), got {v.shape}")
    _, k, v, group = check_qkv(q[:, :, None, :], k, v)
    num_splits = check_positive_int(num_splits, "num_splits")
    b, hq, d = q.shape
    hkv, nmax = k.shape[1], k.shape[2]
    scale = check_scale(scale, d)
    lens = np.full(b, nmax, dtype=np.int64) if seq_lens is None else check_seq_lens(seq_lens, b, nmax)

    acc = compute_dtype(q, k, v)
    qg = q.astype(acc).reshape(b, hkv, group, d)          # query head h -> kv head h // group
    chunk = math.ceil(nmax / num_splits)
    os, lses = [], []
    for s in range(num_splits):                           # on a GPU: one thread block per (b, head, split)
        lo, hi = min(s * chunk, nmax), min((s + 1) * chunk, nmax)
        o_s, lse_s = _attend_chunk(qg, k, v, lo, hi, lens, scale, acc)
        os.append(o_s)
        lses.append(lse_s)
    o, lse = merge_many(os, lses)                         # stage 2: reduce over all splits
    out_dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    return o.reshape(b, hq, d).astype(out_dtype), lse.reshape(b, hq).astype(lse_dtype(q, k, v))
