"""reference.numpy.decoding (KVCache, flash_decoding) and the decoder-layer demo, against tests/oracle.py."""
import numpy as np
import pytest

from reference.numpy.decoder_layer import TinyDecoderLayer, cache_savings
from reference.numpy.decoding import KVCache, KVCacheFullError, flash_decoding
from tests.oracle import attention_ref, lse_err, rel_err

TOL = {np.float16: 3e-3, np.float32: 2e-6, np.float64: 1e-13}
DTYPES = [np.float16, np.float32, np.float64]


def decode_oracle(q, k, v, seq_lens, scale=None):
    """Per sequence b: float64 attention of q[b] (Hq, d) over its first seq_lens[b] keys; empty -> (0, -inf)."""
    b, hq, d = q.shape
    o, lse = np.zeros((b, hq, d)), np.full((b, hq), -np.inf)
    for i, n in enumerate(seq_lens):
        if n:
            ro, rl, _ = attention_ref(q[i][:, None, :], k[i][:, :n], v[i][:, :n], scale=scale)
            o[i], lse[i] = ro[:, 0].numpy(), rl[:, 0].numpy()
    return o, lse


def random_decode_case(rng, dtype, hkv=None, group=None):
    b = int(rng.integers(1, 5))
    hkv = int(rng.choice([1, 2, 4])) if hkv is None else hkv
    group = int(rng.choice([1, 2, 4])) if group is None else group
    nmax, d = int(rng.integers(1, 120)), int(rng.choice([8, 16, 64]))
    q = rng.standard_normal((b, hkv * group, d)).astype(dtype)
    k = rng.standard_normal((b, hkv, nmax, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, nmax, d)).astype(dtype)
    lens = rng.integers(0, nmax + 1, size=b)
    lens[0] = nmax
    if b > 1:
        lens[1] = 1
    if b > 2:
        lens[2] = 0
    return q, k, v, lens


# ---- flash_decoding --------------------------------------------------------------------------------------
@pytest.mark.flash_decoding
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hkv,group", [(1, 4), (2, 2), (4, 1), (1, 1)])     # MQA, GQA, MHA, single head
def test_flash_decoding_matches_oracle_ragged(rng, dtype, hkv, group):
    q, k, v, lens = random_decode_case(rng, dtype, hkv, group)
    nmax = k.shape[2]
    ref_o, ref_lse = decode_oracle(q, k, v, lens)
    for splits in sorted({1, 2, 3, 7, nmax, nmax + 5}):
        o, lse = flash_decoding(q, k, v, num_splits=splits, seq_lens=lens)
        assert o.dtype == dtype and o.shape == q.shape
        assert lse.dtype == (np.float64 if dtype == np.float64 else np.float32) and lse.shape == q.shape[:2]
        assert not np.isnan(o).any() and not np.isnan(lse).any()
        assert rel_err(o, ref_o) < TOL[dtype], (splits, lens)
        assert lse_err(lse, ref_lse) < TOL[dtype], (splits, lens)
        empty = lens == 0
        assert np.all(o[empty] == 0) and np.all(np.isneginf(lse[empty]))


@pytest.mark.flash_decoding
def test_flash_decoding_default_seq_lens_and_scale(rng):
    q, k, v, _ = random_decode_case(rng, np.float64)
    scale = float(rng.uniform(0.05, 1.0))
    ref_o, ref_lse = decode_oracle(q, k, v, [k.shape[2]] * q.shape[0], scale=scale)
    o, lse = flash_decoding(q, k, v, scale=scale)
    assert rel_err(o, ref_o) < 1e-13 and lse_err(lse, ref_lse) < 1e-13


@pytest.mark.flash_decoding
def test_flash_decoding_split_count_does_not_change_result(rng):
    q, k, v, lens = random_decode_case(rng, np.float64)
    base = flash_decoding(q, k, v, num_splits=1, seq_lens=lens)
    for splits in rng.integers(2, 200, size=5):
        o, lse = flash_decoding(q, k, v, num_splits=int(splits), seq_lens=lens)
        assert rel_err(o, base[0]) < 1e-13 and lse_err(lse, base[1]) < 1e-13


@pytest.mark.flash_decoding
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_flash_decoding_large_logits(rng, dtype):
    # scores in the hundreds: exp overflows fp16 (and fp32 near 89) without the max shift in every split.
    q, k, v, lens = random_decode_case(rng, dtype)
    scale = 40.0
    ref_o, ref_lse = decode_oracle(q, k, v, lens, scale=scale)
    o, lse = flash_decoding(q, k, v, num_splits=5, seq_lens=lens, scale=scale)
    assert np.isfinite(o).all()
    # float32 scores of magnitude |S| carry an absolute rounding error ~ eps32 * |S|, which exp() turns into a
    # relative error of P (and O) of the same size: the tolerance grows with the largest score.
    s_max = scale * float(np.abs(np.einsum("bhd,bknd->bhkn", q.astype(np.float64), k.astype(np.float64))).max())
    tol = TOL[dtype] * 3 + 4 * np.finfo(np.float32).eps * s_max
    assert rel_err(o, ref_o) < tol and lse_err(lse, ref_lse) < 1e-5


@pytest.mark.flash_decoding
def test_flash_decoding_does_not_mutate_inputs(rng):
    q, k, v, lens = random_decode_case(rng, np.float32)
    copies = [x.copy() for x in (q, k, v, lens)]
    flash_decoding(q, k, v, num_splits=3, seq_lens=lens)
    for a, b in zip((q, k, v, lens), copies):
        assert np.array_equal(a, b)


@pytest.mark.flash_decoding
def test_flash_decoding_bad_input():
    q, k = np.zeros((2, 4, 8)), np.zeros((2, 2, 5, 8))
    with pytest.raises(ValueError, match=r"q must have shape \(B, Hq, d\)"):
        flash_decoding(np.zeros((2, 4, 1, 8)), k, k)
    with pytest.raises(ValueError, match=r"k must have shape \(B, Hkv, Nmax, d\)"):
        flash_decoding(q, np.zeros((2, 5, 8)), k)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        flash_decoding(q, k, np.zeros((2, 2, 6, 8)))
    with pytest.raises(ValueError, match="same head dimension d"):
        flash_decoding(q, np.zeros((2, 2, 5, 4)), np.zeros((2, 2, 5, 4)))
    with pytest.raises(ValueError, match=r"multiple of the kv heads Hkv=3"):
        flash_decoding(q, np.zeros((2, 3, 5, 8)), np.zeros((2, 3, 5, 8)))
    with pytest.raises(ValueError, match="same batch dimensions"):
        flash_decoding(q, np.zeros((3, 2, 5, 8)), np.zeros((3, 2, 5, 8)))
    with pytest.raises(TypeError, match="q must have dtype float16, float32 or float64"):
        flash_decoding(q.astype(np.int64), k, k)
    with pytest.raises(ValueError, match="num_splits must be a positive integer"):
        flash_decoding(q, k, k, num_splits=0)
    with pytest.raises(TypeError, match="num_splits must be a positive integer"):
        flash_decoding(q, k, k, num_splits=2.0)
    with pytest.raises(TypeError, match="seq_lens must hold integers"):
        flash_decoding(q, k, k, seq_lens=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"seq_lens must have shape \(B,\) = \(2,\)"):
        flash_decoding(q, k, k, seq_lens=np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"seq_lens entries must lie in \[0, 5\]"):
        flash_decoding(q, k, k, seq_lens=np.array([1, 6]))
    with pytest.raises(ValueError, match=r"seq_lens entries must lie in \[0, 5\]"):
        flash_decoding(q, k, k, seq_lens=[-1, 2])
    with pytest.raises(TypeError, match="scale must be a real number"):
        flash_decoding(q, k, k, scale="1")


# ---- KVCache -------------------------------------------------------------------------------------------
@pytest.mark.kv_cache
@pytest.mark.parametrize("batch_size", [None, 3])
def test_kv_cache_views_and_contents(rng, batch_size):
    hkv, d, max_len = 2, 8, 40
    cache = KVCache(max_len, hkv, d, dtype=np.float64, batch_size=batch_size)
    lead = () if batch_size is None else (batch_size,)
    ks, vs = [], []
    for t in [5, 1, 1, 12, 0, 7]:
        k, v = rng.standard_normal(lead + (hkv, t, d)), rng.standard_normal(lead + (hkv, t, d))
        cache.append(k, v)
        ks.append(k), vs.append(v)
        assert len(cache) == cache.len == sum(x.shape[-2] for x in ks)
        assert np.array_equal(cache.k, np.concatenate(ks, axis=-2))
        assert np.array_equal(cache.v, np.concatenate(vs, axis=-2))
    assert cache.k.shape == lead + (hkv, 26, d)
    assert np.shares_memory(cache.k, cache.k) and np.shares_memory(cache.v, cache.v)   # views, not copies
    assert not np.shares_memory(cache.k, cache.v)
    view = cache.k
    with pytest.raises(ValueError, match="read-only"):
        view[..., 0, 0] = 1.0
    assert cache.free == max_len - 26 and cache.nbytes == 2 * np.prod(lead + (hkv, max_len, d)) * 8
    cache.reset()
    assert len(cache) == 0 and cache.k.shape == lead + (hkv, 0, d)


@pytest.mark.kv_cache
@pytest.mark.flash_decoding
def test_kv_cache_feeds_flash_decoding(rng):
    hkv, group, d = 2, 3, 16
    cache = KVCache(64, hkv, d, dtype=np.float32, batch_size=2)
    cache.append(rng.standard_normal((2, hkv, 30, d)), rng.standard_normal((2, hkv, 30, d)))
    q = rng.standard_normal((2, hkv * group, d)).astype(np.float32)
    o, lse = flash_decoding(q, cache.k, cache.v, num_splits=4)
    ref_o, ref_lse = decode_oracle(q, cache.k, cache.v, [30, 30])
    assert rel_err(o, ref_o) < 2e-6 and lse_err(lse, ref_lse) < 2e-6


@pytest.mark.kv_cache
def test_kv_cache_overflow_leaves_cache_intact(rng):
    cache = KVCache(10, 1, 4, dtype=np.float32)
    k = rng.standard_normal((1, 8, 4)).astype(np.float32)
    cache.append(k, k)
    with pytest.raises(KVCacheFullError, match=r"cannot append 3 token\(s\) to 8 cached, capacity max_len=10 \(2 free\)"):
        cache.append(np.zeros((1, 3, 4)), np.zeros((1, 3, 4)))
    assert isinstance(KVCacheFullError("x"), RuntimeError)
    assert len(cache) == 8 and np.array_equal(cache.k, k)
    cache.append(k[:, :2], k[:, :2])
    assert len(cache) == 10


@pytest.mark.kv_cache
def test_kv_cache_bad_input():
    with pytest.raises(ValueError, match="max_len must be a positive integer"):
        KVCache(0, 2, 4)
    with pytest.raises(TypeError, match="n_kv_heads must be a positive integer"):
        KVCache(4, 2.5, 4)
    with pytest.raises(TypeError, match="dtype must be float16, float32 or float64"):
        KVCache(4, 2, 4, dtype=np.int32)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        KVCache(4, 2, 4, batch_size=0)
    cache = KVCache(4, 2, 4)
    with pytest.raises(ValueError, match=r"k must have shape \(Hkv, T, d\) = \(2, 'T', 4\)"):
        cache.append(np.zeros((1, 2, 4)), np.zeros((1, 2, 4)))     # (T, Hkv, d) is the wrong layout here
    with pytest.raises(ValueError, match=r"v must have shape"):
        cache.append(np.zeros((2, 1, 4)), np.zeros((2, 1, 3)))
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        cache.append(np.zeros((2, 1, 4)), np.zeros((2, 2, 4)))
    with pytest.raises(TypeError, match="k must have dtype float16, float32 or float64"):
        cache.append(np.zeros((2, 1, 4), dtype=np.int8), np.zeros((2, 1, 4)))
    batched = KVCache(4, 2, 4, batch_size=3)
    with pytest.raises(ValueError, match=r"k must have shape \(B, Hkv, T, d\) = \(3, 2, 'T', 4\)"):
        batched.append(np.zeros((2, 1, 4)), np.zeros((2, 1, 4)))


# ---- decoder layer demo --------------------------------------------------------------------------------
@pytest.mark.kv_cache
@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (4, 2), (4, 1)])
def test_prefill_plus_decode_equals_recompute_every_step(rng, n_heads, n_kv_heads):
    layer = TinyDecoderLayer(d_model=32, n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=48, max_len=40,
                             seed=int(rng.integers(1 << 31)), dtype=np.float64)
    total, prompt = int(rng.integers(10, 30)), int(rng.integers(1, 8))
    x = rng.standard_normal((total, 32))
    out = layer.prefill(x[:prompt])
    assert np.allclose(out, layer.forward_full(x[:prompt]), rtol=0, atol=1e-12)
    for t in range(prompt, total):
        y = layer.decode_step(x[t])
        full = layer.forward_full(x[: t + 1])          # no cache: recompute the whole prefix
        assert y.shape == (32,)
        np.testing.assert_allclose(y, full[-1], rtol=1e-12, atol=1e-12)
        assert len(layer.cache) == t + 1
        # the cache holds exactly the K, V a full recompute would produce
        _, k_full, v_full = layer._qkv(layer._check_x(x[: t + 1], "x", 2))
        np.testing.assert_allclose(layer.cache.k, k_full, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(layer.cache.v, v_full, rtol=1e-13, atol=1e-13)


@pytest.mark.kv_cache
def test_cache_savings_counts_match_instrumented_layer(rng):
    prompt, new = 5, 12
    layer = TinyDecoderLayer(d_model=16, n_heads=4, n_kv_heads=2, d_ff=16, max_len=32, seed=1)
    x = rng.standard_normal((prompt + new, 16))
    layer.prefill(x[:prompt])
    start = layer.kv_tokens_projected
    for t in range(prompt, prompt + new):
        layer.decode_step(x[t])
    with_cache = layer.kv_tokens_projected - start
    start = layer.kv_tokens_projected
    for t in range(prompt, prompt + new):
        layer.forward_full(x[: t + 1])
    without = layer.kv_tokens_projected - start
    c = cache_savings(prompt, new, 16, 4, 2)
    assert (with_cache, without) == (c["kv_tokens_cache"], c["kv_tokens_no_cache"]) == (new, sum(range(6, 18)))
    assert c["kv_flops_no_cache"] == without * 2 * 16 * 2 * 2 * 4


@pytest.mark.kv_cache
def test_cache_savings_quadratic_vs_linear():
    small, big = cache_savings(1, 1000, 64, 8, 8), cache_savings(1, 2000, 64, 8, 8)
    assert big["kv_tokens_cache"] == 2 * small["kv_tokens_cache"]                      # linear
    assert 3.9 < big["kv_tokens_no_cache"] / small["kv_tokens_no_cache"] < 4.1          # quadratic
    assert 7.9 < big["attn_flops_no_cache"] / small["attn_flops_no_cache"] < 8.1        # cubic (causal, T^3/6)
    assert 3.9 < big["attn_flops_cache"] / small["attn_flops_cache"] < 4.1             # quadratic


@pytest.mark.kv_cache
def test_decoder_layer_bad_input_and_full_cache(rng):
    with pytest.raises(ValueError, match="n_heads=4 must be a multiple of the kv heads n_kv_heads=3"):
        TinyDecoderLayer(d_model=32, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="d_model=30 must be a multiple of n_heads=4"):
        TinyDecoderLayer(d_model=30, n_heads=4, n_kv_heads=2)
    layer = TinyDecoderLayer(d_model=16, n_heads=2, n_kv_heads=1, d_ff=8, max_len=3)
    with pytest.raises(ValueError, match=r"x must have shape \(T, d_model\) with d_model=16"):
        layer.forward_full(np.zeros((3, 8)))
    with pytest.raises(ValueError, match=r"x_t must have shape \(d_model,\)"):
        layer.decode_step(np.zeros((1, 16)))
    layer.prefill(rng.standard_normal((3, 16)))
    with pytest.raises(KVCacheFullError, match="cannot append 1 token"):
        layer.decode_step(rng.standard_normal(16))


@pytest.mark.kv_cache
@pytest.mark.parametrize("use_fallback", [False, True])
def test_decoder_causal_attention_matches_oracle(rng, monkeypatch, use_fallback):
    import sys

    from reference.numpy import decoder_layer
    if use_fallback:                     # the layer's local masked attention, used if the stage-1 module is absent
        monkeypatch.setitem(sys.modules, "reference.numpy.attention", None)
    q, k, v = rng.standard_normal((6, 9, 8)), rng.standard_normal((3, 9, 8)), rng.standard_normal((3, 9, 8))
    out = decoder_layer._causal_attention(q, k, v)
    assert rel_err(out, attention_ref(q, k, v, causal=True)[0]) < 1e-13
