"""A tiny pre-norm decoder layer to show why a KV cache exists (prefill vs decode).

``x -> x + Attn(RMSNorm(x)) -> h + MLP(RMSNorm(h))`` with causal multi-head attention (GQA allowed) and a
SiLU MLP; random weights from a seed, no positional encoding (it would not change the argument). Three ways
to run it over a sequence:

* ``forward_full(x)``: recompute everything for the whole sequence (what generation without a cache does at
  every step: K and V of all previous tokens are projected again);
* ``prefill(x)``: the same computation over a prompt, storing K and V in a :class:`KVCache`;
* ``decode_step(x_t)``: one new token; projects only its own q, k, v, appends k, v to the cache and attends
  the single query over the cache with :func:`reference.numpy.decoding.flash_decoding`.

Because row ``i`` of causal attention depends only on keys ``<= i``, prefill + decode steps give the same
outputs as ``forward_full`` on the whole sequence. :func:`cache_savings` counts the work saved.
"""
from __future__ import annotations

import numpy as np

from ._validate import as_float_array, check_float_dtype, check_gqa, check_positive_int
from .decoding import KVCache, flash_decoding

__all__ = ["TinyDecoderLayer", "cache_savings"]


def _causal_attention(q, k, v):
    """Causal attention ``q (Hq, T, d)``, ``k, v (Hkv, T, d)``; the course's reference if present."""
    try:
        from .attention import attention          # lazy: the stage-1 module may be written after this one
    except ImportError:
        attention = None
    if attention is not None:
        return attention(q, k, v, causal=True)
    group = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
    t_q, t_k = s.shape[-2:]
    s = np.where(np.tril(np.ones((t_q, t_k), dtype=bool), t_k - t_q), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v



def _check_heads(d_model: int, n_heads: int, n_kv_heads: int) -> None:
    """``d_model`` splits into ``n_heads`` heads, and the query heads share the kv heads evenly (GQA)."""
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
    check_gqa(n_heads, n_kv_heads, "n_heads", "n_kv_heads")

class TinyDecoderLayer:
    """One decoder layer with random weights and its own :class:`KVCache`.

    Args:
        d_model: model width; must equal ``n_heads * head_dim``.
        n_heads, n_kv_heads: query and key/value heads (``n_heads % n_kv_heads == 0``; GQA/MQA allowed).
        d_ff: MLP hidden width.
        max_len: KV cache capacity in tokens.
        seed: weight seed.
        dtype: float32 or float64 (float64 for the exactness test).
    """

    def __init__(self, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, max_len=128, seed=0, dtype=np.float64):
        self.d_model = check_positive_int(d_model, "d_model")
        self.n_heads = check_positive_int(n_heads, "n_heads")
        self.n_kv_heads = check_positive_int(n_kv_heads, "n_kv_heads")
        check_positive_int(d_ff, "d_ff")
        _check_heads(d_model, n_heads, n_kv_heads)
        self.head_dim = d_model // n_heads
        self.dtype = check_float_dtype(dtype)
        r = np.random.default_rng(seed)
        dk = n_kv_heads * self.head_dim

        def w(i, o):
            return (r.standard_normal((i, o)) / np.sqrt(i)).astype(self.dtype)

        self.w_q, self.w_k, self.w_v, self.w_o = w(d_model, d_model), w(d_model, dk), w(d_model, dk), w(d_model, d_model)
        self.w_up, self.w_down = w(d_model, d_ff), w(d_ff, d_model)
        self.g_attn = (1 + 0.1 * r.standard_normal(d_model)).astype(self.dtype)
        self.g_mlp = (1 + 0.1 * r.standard_normal(d_model)).astype(self.dtype)
        self.cache = KVCache(max_len, n_kv_heads, self.head_dim, dtype=self.dtype)
        self.kv_tokens_projected = 0        # instrumentation: how many tokens' K,V were computed

    # ---- pieces ---------------------------------------------------------------------------------------
    @staticmethod
    def _rmsnorm(x, g, eps=1e-6):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def _heads(self, y, n):                  # (T, n*hd) -> (n, T, hd)
        return y.reshape(y.shape[0], n, self.head_dim).transpose(1, 0, 2)

    def _qkv(self, x):
        h = self._rmsnorm(x, self.g_attn)
        self.kv_tokens_projected += x.shape[0]
        return (self._heads(h @ self.w_q, self.n_heads), self._heads(h @ self.w_k, self.n_kv_heads),
                self._heads(h @ self.w_v, self.n_kv_heads))

    def _finish(self, x, attn):               # attn (Hq, T, hd) -> residual + MLP
        h = x + attn.transpose(1, 0, 2).reshape(x.shape[0], self.d_model) @ self.w_o
        u = self._rmsnorm(h, self.g_mlp) @ self.w_up
        return h + (u / (1 + np.exp(-u))) @ self.w_down

    def _check_x(self, x, name, ndim):
        x = as_float_array(x, name)
        if x.ndim != ndim or x.shape[-1] != self.d_model:
            want = "(T, d_model)" if ndim == 2 else "(d_model,)"
            raise ValueError(f"{name} must have shape {want} with d_model={self.d_model}, got {x.shape}")
        return x.astype(self.dtype)

    # ---- the three modes ------------------------------------------------------------------------------
    def forward_full(self, x):
        """All ``T`` outputs, recomputing K, V and causal attention for every token (no cache)."""
        x = self._check_x(x, "x", 2)
        q, k, v = self._qkv(x)
        return self._finish(x, _causal_attention(q, k, v))

    def prefill(self, x):
        """Process a prompt ``x (T, d_model)``: same outputs as :meth:`forward_full`, K/V stored in the cache."""
        x = self._check_x(x, "x", 2)
        self.cache.reset()
        q, k, v = self._qkv(x)
        self.cache.append(k, v)
        return self._finish(x, _causal_attention(q, k, v))

    def decode_step(self, x_t):
        """One new token ``x_t (d_model,)``: project only it, append its K/V, attend over the cache."""
        x = self._check_x(x_t, "x_t", 1)[None, :]
        q, k, v = self._qkv(x)                # q (Hq, 1, hd), k/v (Hkv, 1, hd)
        self.cache.append(k, v)
        # Nq = 1 sees every cached key (bottom-right causal rule), so no mask: Flash-Decoding over the cache.
        o, _ = flash_decoding(q[None, :, 0, :], self.cache.k[None], self.cache.v[None], num_splits=4)
        return self._finish(x, o[0][:, None, :])[0]


def cache_savings(prompt_len, new_tokens, d_model, n_heads, n_kv_heads):
    """Count the work of generating ``new_tokens`` after a prompt, with and without a KV cache.

    Without a cache, step ``s`` (sequence length ``t = prompt_len + s``) reruns the layer on all ``t`` tokens:
    it projects K and V of ``t`` tokens and computes causal attention over ``t`` rows; with a cache it
    projects one token and computes one attention row over ``t`` keys. Counted over the ``new_tokens`` decode
    steps (the prefill is the same either way):

    * K,V projections: ``sum_t t`` tokens (quadratic in length) vs ``new_tokens`` (linear);
    * K,V projection FLOPs: ``2 * d_model * 2 * Hkv * head_dim`` per token;
    * attention FLOPs (QK^T and PV, ``2 * 2 * head_dim`` per query-key pair per head): ``~t^2/2`` pairs per
      step without a cache (causal) vs ``t`` with it.

    Returns a dict of integers with keys ``kv_tokens_no_cache``, ``kv_tokens_cache``, ``kv_flops_no_cache``,
    ``kv_flops_cache``, ``attn_flops_no_cache``, ``attn_flops_cache``.
    """
    p = check_positive_int(prompt_len, "prompt_len")
    n = check_positive_int(new_tokens, "new_tokens")
    d_model = check_positive_int(d_model, "d_model")
    n_heads = check_positive_int(n_heads, "n_heads")
    n_kv_heads = check_positive_int(n_kv_heads, "n_kv_heads")
    _check_heads(d_model, n_heads, n_kv_heads)
    hd = d_model // n_heads
    lengths = np.arange(p + 1, p + n + 1, dtype=np.int64)            # sequence length at each decode step
    kv_per_token = 2 * d_model * 2 * n_kv_heads * hd
    pair = 2 * 2 * hd * n_heads
    causal_pairs = lengths * (lengths + 1) // 2
    return {
        "kv_tokens_no_cache": int(lengths.sum()),
        "kv_tokens_cache": n,
        "kv_flops_no_cache": int(lengths.sum()) * kv_per_token,
        "kv_flops_cache": n * kv_per_token,
        "attn_flops_no_cache": int(causal_pairs.sum()) * pair,
        "attn_flops_cache": int(lengths.sum()) * pair,
    }
