"""reference.numpy.attention against the float64 torch oracle (tests/oracle.py) and autograd."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.numpy.attention import attention, attention_backward, causal_mask, multi_head_attention
from tests.common_numpy import NP_DTYPES as DTYPES
from tests.common_numpy import NP_GRAD_TOL as GRAD_TOL
from tests.common_numpy import NP_SHAPES as SHAPES
from tests.common_numpy import NP_TOL as TOL
from tests.common_numpy import qkv, rand
from tests.oracle import allowed_mask, attention_grads, attention_ref, lse_err, rel_err


# ---------------------------------------------------------------- attention
@pytest.mark.attention
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qs,ks", SHAPES)
def test_attention_matches_oracle(rng, qs, ks, causal, dtype):
    q, k, v = qkv(rng, qs, ks, dtype)
    o, lse = attention(q, k, v, causal=causal, return_lse=True)
    o_ref, lse_ref, _ = attention_ref(q, k, v, causal=causal)
    assert o.dtype == dtype and o.shape == q.shape
    assert lse.dtype == (np.float64 if dtype == np.float64 else np.float32) and lse.shape == q.shape[:-1]
    assert rel_err(o, o_ref) < TOL[dtype]
    assert lse_err(lse, lse_ref) < max(TOL[dtype], 1e-6)
    np.testing.assert_array_equal(attention(q, k, v, causal=causal), o)  # return_lse=False gives o alone


@pytest.mark.attention
def test_attention_fully_masked_rows(rng):
    q, k, v = qkv(rng, (2, 10, 8), (2, 4, 8), np.float32)
    o, lse = attention(q, k, v, causal=True, return_lse=True)
    # Nq - Nk = 6 rows see no key: output exactly 0, lse -inf, never NaN
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    assert (o[:, :6] == 0).all()
    assert np.isneginf(lse[:, :6]).all() and np.isfinite(lse[:, 6:]).all()


@pytest.mark.attention
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_large_logits(rng, dtype):
    q, k, v = qkv(rng, (2, 33, 16), (2, 33, 16), dtype, scale=30.0)
    o, lse = attention(q, k, v, causal=True, return_lse=True)
    o_ref, lse_ref, _ = attention_ref(q, k, v, causal=True)
    assert np.isfinite(o).all()
    assert rel_err(o, o_ref) < TOL[dtype]
    assert lse_err(lse, lse_ref) < 1e-6


@pytest.mark.attention
def test_attention_custom_scale(rng):
    q, k, v = qkv(rng, (9, 8), (12, 8), np.float64)
    o, lse = attention(q, k, v, scale=0.3, return_lse=True)
    o_ref, lse_ref, _ = attention_ref(q, k, v, scale=0.3)
    assert rel_err(o, o_ref) < 1e-12 and lse_err(lse, lse_ref) < 1e-12


@pytest.mark.attention
def test_attention_inputs_unchanged(rng):
    q, k, v = qkv(rng, (2, 4, 9, 8), (2, 2, 9, 8), np.float32)
    copies = [a.copy() for a in (q, k, v)]
    attention(q, k, v, causal=True)
    for a, c in zip((q, k, v), copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.attention
@settings(max_examples=12, deadline=None)
@given(nq=st.integers(1, 20), nk=st.integers(1, 20), hkv=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]),
       d=st.sampled_from([1, 4, 16]), causal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_attention_hypothesis_shapes(nq, nk, hkv, group, d, causal, seed):
    r = np.random.default_rng(seed)
    q, k, v = qkv(r, (2, hkv * group, nq, d), (2, hkv, nk, d), np.float64)
    o, lse = attention(q, k, v, causal=causal, return_lse=True)
    o_ref, lse_ref, _ = attention_ref(q, k, v, causal=causal)
    assert rel_err(o, o_ref) < 1e-12 and lse_err(lse, lse_ref) < 1e-12


# ---------------------------------------------------------------- causal_mask
@pytest.mark.causal_mask
@pytest.mark.parametrize("nq,nk", [(1, 1), (5, 5), (1, 7), (3, 8), (8, 3), (16, 9)])
def test_causal_mask_bottom_right(nq, nk):
    m = causal_mask(nq, nk)
    assert m.dtype == np.bool_ and m.shape == (nq, nk)
    np.testing.assert_array_equal(m, allowed_mask(nq, nk).numpy())
    if nq == 1:
        assert m.all()  # decoding: the single query sees every key
    if nq > nk:
        assert not m[: nq - nk].any() and m[nq - nk:].any(axis=1).all()


@pytest.mark.causal_mask
def test_causal_mask_bad_input():
    with pytest.raises(ValueError, match="nq must be a positive integer"):
        causal_mask(0, 3)
    with pytest.raises(TypeError, match="nk must be a positive integer"):
        causal_mask(3, 2.0)


# ---------------------------------------------------------------- attention_backward
@pytest.mark.attention_backward
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qs,ks", SHAPES[1:5])
def test_backward_matches_autograd(rng, qs, ks, causal, dtype):
    q, k, v = qkv(rng, qs, ks, dtype)
    do = rand(rng, qs, dtype)
    grads = attention_backward(q, k, v, do, causal=causal)
    refs = attention_grads(q, k, v, do, causal=causal)
    for name, g, r, x in zip("qkv", grads, refs, (q, k, v)):
        assert g.dtype == dtype and g.shape == x.shape, name
        assert rel_err(g, r) < GRAD_TOL[dtype], f"d{name}: {rel_err(g, r)}"


@pytest.mark.attention_backward
def test_backward_fully_masked_rows_and_scale(rng):
    q, k, v = qkv(rng, (2, 12, 8), (2, 5, 8), np.float64)
    do = rand(rng, q.shape, np.float64)
    grads = attention_backward(q, k, v, do, causal=True, scale=0.7)
    refs = attention_grads(q, k, v, do, causal=True, scale=0.7)
    assert all(np.isfinite(g).all() for g in grads)
    assert (grads[0][:, :7] == 0).all()  # rows that see no key have no gradient
    for g, r in zip(grads, refs):
        assert rel_err(g, r) < 1e-11


@pytest.mark.attention_backward
def test_backward_bad_do_shape(rng):
    q = np.zeros((4, 8))
    with pytest.raises(ValueError, match=r"do must have the shape of q \(4, 8\)"):
        attention_backward(q, q, q, np.zeros((4, 7)))


# ---------------------------------------------------------------- multi_head_attention
def mha_ref(x, w_q, w_k, w_v, w_o, h, hkv, causal):
    t = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64))  # noqa: E731
    x = t(x)
    dh = w_q.shape[1] // h

    def split(w, n):
        y = x @ t(w)
        return y.reshape(y.shape[:-1] + (n, dh)).transpose(-2, -3)

    o, _, _ = attention_ref(split(w_q, h), split(w_k, hkv), split(w_v, hkv), causal=causal)
    o = o.transpose(-2, -3)
    return o.reshape(o.shape[:-2] + (h * dh,)) @ t(w_o)


@pytest.mark.multi_head_attention
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lead,n,h,hkv,causal", [((), 7, 2, None, False), ((3,), 11, 4, 2, True),
                                                 ((2, 2), 5, 4, 1, True)])
def test_mha_matches_oracle(rng, dtype, lead, n, h, hkv, causal):
    d_model, dh = 24, 6
    x = rand(rng, lead + (n, d_model), dtype)
    kv = h if hkv is None else hkv
    w = [rand(rng, s, dtype, 0.3) for s in ((d_model, h * dh), (d_model, kv * dh), (d_model, kv * dh),
                                             (h * dh, d_model))]
    out = multi_head_attention(x, *w, n_heads=h, n_kv_heads=hkv, causal=causal)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, mha_ref(x, *w, h, kv, causal)) < TOL[dtype]


@pytest.mark.multi_head_attention
def test_mha_bad_shapes():
    x = np.zeros((5, 8))
    wq, wk, wo = np.zeros((8, 8)), np.zeros((8, 4)), np.zeros((8, 8))
    with pytest.raises(ValueError, match=r"w_q must have shape \(d_model=8, n_heads\*d_head\)"):
        multi_head_attention(x, np.zeros((7, 8)), wk, wk, wo, n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match=r"w_q must have shape"):
        multi_head_attention(x, np.zeros((8, 9)), wk, wk, wo, n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match=r"w_k must have shape \(d_model, n_kv_heads\*d_head\) = \(8, 4\)"):
        multi_head_attention(x, wq, np.zeros((8, 8)), wk, wo, n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match=r"w_v must have shape"):
        multi_head_attention(x, wq, wk, np.zeros((8, 5)), wo, n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match=r"w_o must have shape \(n_heads\*d_head, d_model\) = \(8, 8\)"):
        multi_head_attention(x, wq, wk, wk, np.zeros((8, 7)), n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match="n_heads=2 must be a multiple of the kv heads n_kv_heads=3"):
        multi_head_attention(x, wq, wk, wk, wo, n_heads=2, n_kv_heads=3)
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        multi_head_attention(x, wq, wk, wk, wo, n_heads=0)
    with pytest.raises(ValueError, match="w_k must be a 2-D matrix"):
        multi_head_attention(x, wq, np.zeros((1, 8, 4)), wk, wo, n_heads=2, n_kv_heads=1)
    with pytest.raises(ValueError, match="x must have at least 2 dimension"):
        multi_head_attention(np.zeros(8), wq, wk, wk, wo, n_heads=2, n_kv_heads=1)
    with pytest.raises(TypeError, match="x must have dtype"):
        multi_head_attention(np.zeros((5, 8), dtype=np.int64), wq, wk, wk, wo, n_heads=2, n_kv_heads=1)
