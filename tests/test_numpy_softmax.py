"""reference.numpy.softmax against float64 torch (an independent oracle)."""
import numpy as np
import pytest
import torch

from reference.numpy.softmax import (merge_softmax_stats, naive_softmax, online_softmax, safe_softmax,
                                     softmax_stats)
from tests.oracle import rel_err

TOL = {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-13}
DTYPES = [np.float16, np.float32, np.float64]


def ref_softmax(x, axis=-1):
    """float64 torch softmax; rows that are all -inf give zeros (the convention under test), not NaN."""
    t = torch.from_numpy(np.asarray(x, dtype=np.float64))
    out = torch.softmax(t, dim=axis)
    return torch.nan_to_num(out, nan=0.0).numpy()


def rand(rng, shape, dtype, scale=3.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


# ---------------------------------------------------------------- naive_softmax
@pytest.mark.naive_softmax
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_naive_matches_oracle_small_logits(rng, dtype, axis):
    x = rand(rng, (5, 17, 3), dtype, scale=1.0)
    out = naive_softmax(x, axis=axis)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, ref_softmax(x, axis)) < TOL[dtype]


@pytest.mark.naive_softmax
def test_naive_overflows_in_float16_with_large_logits(rng):
    # 65504 < e^12: logits of ~30 sigma overflow exp in float16, so the row becomes inf/inf = nan.
    x = (rng.standard_normal((4, 64)) * 30).astype(np.float16)
    with pytest.warns(RuntimeWarning):
        out = naive_softmax(x)
    assert out.dtype == np.float16
    assert not np.isfinite(out).all()
    assert np.isnan(out).any()
    assert np.isfinite(safe_softmax(x)).all()  # the max trick fixes exactly this


@pytest.mark.naive_softmax
def test_naive_float16_fine_for_small_logits(rng):
    x = rand(rng, (3, 40), np.float16, scale=1.0)
    assert rel_err(naive_softmax(x), ref_softmax(x)) < TOL[np.float16]


# ---------------------------------------------------------------- safe_softmax
@pytest.mark.safe_softmax
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((1,), -1), ((7,), 0), ((3, 129), -1), ((2, 5, 33), 1), ((4, 1), -1)])
def test_safe_matches_oracle(rng, dtype, shape, axis):
    x = rand(rng, shape, dtype)
    out = safe_softmax(x, axis=axis)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, ref_softmax(x, axis)) < TOL[dtype]


@pytest.mark.safe_softmax
@pytest.mark.parametrize("dtype", DTYPES)
def test_safe_large_logits(rng, dtype):
    x = (rng.standard_normal((6, 100)) * 30).astype(dtype)
    out = safe_softmax(x)
    assert np.isfinite(out).all()
    assert rel_err(out, ref_softmax(x)) < TOL[dtype]
    np.testing.assert_allclose(out.astype(np.float64).sum(-1), 1.0, rtol=5 * TOL[dtype])


@pytest.mark.safe_softmax
@pytest.mark.parametrize("fn", [safe_softmax, online_softmax])
def test_all_neg_inf_rows_give_zeros(rng, fn):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    x[1] = -np.inf
    x[3, :4] = -np.inf  # partly masked row is an ordinary softmax over the rest
    out = fn(x)
    assert not np.isnan(out).any()
    assert (out[1] == 0).all()
    assert rel_err(out, ref_softmax(x)) < 1e-6


@pytest.mark.safe_softmax
def test_safe_does_not_modify_input(rng):
    x = rand(rng, (3, 20), np.float32)
    x0 = x.copy()
    safe_softmax(x)
    np.testing.assert_array_equal(x, x0)


# ---------------------------------------------------------------- online_softmax
@pytest.mark.online_softmax
@pytest.mark.parametrize("dtype", DTYPES)
def test_online_every_block_size(rng, dtype):
    n = 13
    x = rand(rng, (3, n), dtype)
    ref = ref_softmax(x)
    for b in range(1, n + 4):
        out = online_softmax(x, block_size=b)
        assert out.dtype == dtype and out.shape == x.shape
        assert rel_err(out, ref) < TOL[dtype], f"block_size={b}"


@pytest.mark.online_softmax
@pytest.mark.parametrize("dtype", DTYPES)
def test_online_large_logits_and_batch_dims(rng, dtype):
    x = (rng.standard_normal((2, 3, 300)) * 30).astype(dtype)
    out = online_softmax(x)  # default block 128: 3 ragged blocks
    assert np.isfinite(out).all()
    assert rel_err(out, ref_softmax(x)) < TOL[dtype]


@pytest.mark.online_softmax
def test_online_running_max_increases_late(rng):
    # The maximum sits in the last block, so earlier partial sums must be rescaled by e^{m_old - m_new}.
    x = np.linspace(-5, 40, 257)[None, :]
    np.testing.assert_allclose(online_softmax(x, block_size=16), ref_softmax(x), rtol=1e-12, atol=1e-300)


@pytest.mark.online_softmax
def test_online_single_element_and_1d(rng):
    assert online_softmax(np.array([3.0]))[0] == 1.0
    x = rand(rng, (50,), np.float64)
    assert rel_err(online_softmax(x, block_size=7), ref_softmax(x)) < 1e-13


# ---------------------------------------------------------------- softmax_stats / merge_softmax_stats
@pytest.mark.softmax_stats
@pytest.mark.parametrize("dtype", DTYPES)
def test_stats_match_max_and_logsumexp(rng, dtype):
    x = rand(rng, (4, 2, 37), dtype) * 10
    m, l = softmax_stats(x)
    t = torch.from_numpy(x.astype(np.float64))
    assert m.shape == x.shape[:-1] and l.shape == x.shape[:-1]
    assert m.dtype == np.result_type(np.float32, dtype)
    np.testing.assert_array_equal(m, x.max(-1))
    lse = torch.logsumexp(t, dim=-1).numpy()
    np.testing.assert_allclose(m + np.log(l), lse, rtol=1e-6 if dtype != np.float64 else 1e-13)


@pytest.mark.softmax_stats
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_merge_of_parts_equals_whole(rng, dtype):
    x = rand(rng, (5, 40), dtype) * 10
    for cut in (0, 1, 17, 39, 40):  # includes an empty part on either side
        m1, l1 = softmax_stats(x[:, :cut])
        m2, l2 = softmax_stats(x[:, cut:])
        m, l = merge_softmax_stats(m1, l1, m2, l2)
        mw, lw = softmax_stats(x)
        np.testing.assert_array_equal(m, mw)
        np.testing.assert_allclose(l, lw, rtol=1e-5 if dtype == np.float32 else 1e-13)


@pytest.mark.softmax_stats
def test_merge_fully_masked_parts_no_nan():
    ninf = -np.inf
    m1 = np.array([ninf, ninf, 1.0])
    l1 = np.array([0.0, 0.0, 2.0])
    m2 = np.array([ninf, 3.0, ninf])
    l2 = np.array([0.0, 5.0, 0.0])
    m, l = merge_softmax_stats(m1, l1, m2, l2)
    assert not np.isnan(m).any() and not np.isnan(l).any()
    np.testing.assert_array_equal(m, [ninf, 3.0, 1.0])
    np.testing.assert_array_equal(l, [0.0, 5.0, 2.0])
    m, l = softmax_stats(np.full((2, 4), ninf))
    np.testing.assert_array_equal(m, [ninf, ninf])
    np.testing.assert_array_equal(l, [0.0, 0.0])


@pytest.mark.softmax_stats
def test_merge_rescales_the_smaller_max():
    # seeds: l = e^{m1-m} l1 + e^{m2-m} l2 with m = max(m1, m2)
    m, l = merge_softmax_stats(np.array([2.0]), np.array([3.0]), np.array([5.0]), np.array([1.0]))
    assert m[0] == 5.0
    np.testing.assert_allclose(l[0], np.exp(-3.0) * 3.0 + 1.0, rtol=1e-15)


# ---------------------------------------------------------------- bad input
@pytest.mark.safe_softmax
@pytest.mark.parametrize("fn", [naive_softmax, safe_softmax, online_softmax, softmax_stats])
def test_integer_input_rejected(fn):
    with pytest.raises(TypeError, match="x must have dtype float16, float32 or float64"):
        fn(np.arange(6).reshape(2, 3))
    with pytest.raises(TypeError, match="x must be a floating-point array"):
        fn([[1, 2, 3]])
    with pytest.raises(ValueError, match="x must have at least 1 dimension"):
        fn(np.float64(1.0))


@pytest.mark.safe_softmax
@pytest.mark.parametrize("fn", [naive_softmax, safe_softmax])
def test_bad_axis(fn):
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"axis must be in \[-2, 1\]"):
        fn(x, axis=2)
    with pytest.raises(TypeError, match="axis must be an integer"):
        fn(x, axis=1.0)


@pytest.mark.online_softmax
@pytest.mark.parametrize("bad,exc", [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError),
                                     ("8", TypeError)])
def test_online_bad_block_size(bad, exc):
    with pytest.raises(exc, match="block_size must be a positive integer"):
        online_softmax(np.zeros((2, 8)), block_size=bad)


@pytest.mark.softmax_stats
def test_merge_shape_mismatch():
    a, b = np.zeros(3), np.zeros(4)
    with pytest.raises(ValueError, match=r"m2 must have the same shape as m1 \(3,\)"):
        merge_softmax_stats(a, a, b, b)
    with pytest.raises(TypeError, match="l1 must have dtype"):
        merge_softmax_stats(a, np.zeros(3, dtype=np.int32), a, a)
