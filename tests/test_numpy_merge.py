"""reference.numpy.merge: attention over a union of key sets from attention over the parts (recursive attention).

Ground truth is tests/oracle.py (float64 torch) on the union; the partial states fed to the merge are computed
here in float64 torch with an arbitrary key subset and mask, then rounded to the dtype under test.
"""
import math

import numpy as np
import pytest
import torch

from reference.numpy.merge import merge_many, merge_states
from tests.oracle import allowed_mask, attention_ref, lse_err, rel_err

pytestmark = pytest.mark.merge_states

TOL = {np.float16: 3e-3, np.float32: 2e-6, np.float64: 1e-13}
DTYPES = [np.float16, np.float32, np.float64]


def partial_state(q, k, v, idx, causal=False, scale=None):
    """float64 (o, lse) of q over the keys ``idx`` only; rows with no allowed key -> (0, -inf)."""
    qt, kt, vt = (torch.from_numpy(np.asarray(a, np.float64)) for a in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    idx = torch.as_tensor(np.asarray(idx, dtype=np.int64))
    s = (qt @ kt[..., idx, :].transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~allowed_mask(q.shape[-2], k.shape[-2])[:, idx], float("-inf"))
    lse = torch.logsumexp(s, dim=-1) if idx.numel() else torch.full(s.shape[:-1], float("-inf"), dtype=s.dtype)
    fin = torch.isfinite(lse)
    p = torch.where(fin[..., None], torch.exp(s - torch.where(fin, lse, 0)[..., None]), 0.0)
    return (p @ vt[..., idx, :]).numpy(), lse.numpy()


def random_partition(rng, n, parts):
    """Split range(n) into ``parts`` disjoint random subsets (some may be empty)."""
    labels = rng.integers(0, parts, size=n)
    return [np.nonzero(labels == j)[0] for j in range(parts)]


def cast_state(o, lse, dtype):
    return o.astype(dtype), lse.astype(np.float64 if dtype == np.float64 else np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_two_equals_attention_over_union(rng, dtype):
    b, h, nq, nk, d = rng.integers(1, 3), rng.integers(1, 4), rng.integers(1, 20), rng.integers(2, 70), 16
    q, k, v = (rng.standard_normal(s) for s in [(b, h, nq, d), (b, h, nk, d), (b, h, nk, d)])
    part_a, part_b = random_partition(rng, nk, 2)
    oa, la = cast_state(*partial_state(q, k, v, part_a), dtype)
    ob, lb = cast_state(*partial_state(q, k, v, part_b), dtype)
    o, lse = merge_states(oa, la, ob, lb)
    ref_o, ref_lse, _ = attention_ref(q, k, v)
    assert o.dtype == dtype and o.shape == (b, h, nq, d)
    assert lse.dtype == (np.float64 if dtype == np.float64 else np.float32) and lse.shape == (b, h, nq)
    assert rel_err(o, ref_o) < TOL[dtype]
    assert lse_err(lse, ref_lse) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_causal_with_fully_masked_rows(rng, dtype):
    # Nq > Nk causal: the first Nq - Nk rows see no key; prefix/suffix parts leave further rows empty in a part.
    nk = int(rng.integers(3, 30))
    nq = nk + int(rng.integers(1, 8))
    d = 8
    q, k, v = rng.standard_normal((nq, d)), rng.standard_normal((nk, d)), rng.standard_normal((nk, d))
    cut = int(rng.integers(1, nk))
    oa, la = cast_state(*partial_state(q, k, v, np.arange(cut), causal=True), dtype)
    ob, lb = cast_state(*partial_state(q, k, v, np.arange(cut, nk), causal=True), dtype)
    assert np.isneginf(lb).any()                     # the suffix part really has empty rows
    o, lse = merge_states(oa, la, ob, lb)
    ref_o, ref_lse, _ = attention_ref(q, k, v, causal=True)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse.numpy()))
    assert np.all(o[: nq - nk] == 0)
    assert rel_err(o, ref_o) < TOL[dtype]
    assert lse_err(lse, ref_lse) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_merge_many_equals_attention_over_union(rng, dtype):
    h, nq, nk, d = 2, int(rng.integers(1, 9)), int(rng.integers(1, 90)), 32
    parts = int(rng.integers(1, 9))                  # more parts than keys sometimes: empty parts
    q, k, v = (rng.standard_normal(s) for s in [(h, nq, d), (h, nk, d), (h, nk, d)])
    states = [cast_state(*partial_state(q, k, v, idx), dtype) for idx in random_partition(rng, nk, parts)]
    o, lse = merge_many([s[0] for s in states], [s[1] for s in states])
    ref_o, ref_lse, _ = attention_ref(q, k, v)
    assert o.dtype == dtype
    assert rel_err(o, ref_o) < TOL[dtype]
    assert lse_err(lse, ref_lse) < TOL[dtype]


def _random_tree_merge(rng, states):
    """Merge states pairwise in a random order and random tree shape (associativity + commutativity)."""
    states = list(states)
    while len(states) > 1:
        i, j = rng.choice(len(states), size=2, replace=False)
        merged = merge_states(*states[i], *states[j])
        states = [s for t, s in enumerate(states) if t not in (i, j)] + [merged]
    return states[0]


def test_merge_is_associative_and_commutative(rng):
    h, nq, nk, d = 3, 5, 64, 16
    q, k, v = (rng.standard_normal(s) for s in [(h, nq, d), (h, nk, d), (h, nk, d)])
    states = [partial_state(q, k, v, idx) for idx in random_partition(rng, nk, 6)]
    a, b = states[0], states[1]
    ab, ba = merge_states(*a, *b), merge_states(*b, *a)
    assert np.array_equal(ab[0], ba[0]) and np.array_equal(ab[1], ba[1])     # commutative, bit for bit
    c = states[2]
    left = merge_states(*merge_states(*a, *b), *c)
    right = merge_states(*a, *merge_states(*b, *c))
    assert rel_err(left[0], right[0]) < 1e-14 and rel_err(left[1], right[1]) < 1e-14
    one_pass = merge_many([s[0] for s in states], [s[1] for s in states])
    for _ in range(3):
        tree = _random_tree_merge(rng, states)
        assert rel_err(tree[0], one_pass[0]) < 1e-14 and rel_err(tree[1], one_pass[1]) < 1e-14
    perm = rng.permutation(len(states))
    shuffled = merge_many([states[i][0] for i in perm], [states[i][1] for i in perm])
    assert rel_err(shuffled[0], one_pass[0]) < 1e-14


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_sets_give_zero_and_neg_inf_without_nan(rng, dtype):
    n, d = 7, 4
    o_empty = np.full((n, d), np.nan, dtype=dtype)      # garbage behind lse=-inf must be ignored
    lse_empty = np.full(n, -np.inf)
    o, lse = merge_states(o_empty, lse_empty, o_empty, lse_empty)
    assert np.all(o == 0) and np.all(np.isneginf(lse))
    o_b, lse_b = rng.standard_normal((n, d)).astype(dtype), rng.standard_normal(n)
    o, lse = merge_states(o_empty, lse_empty, o_b, lse_b)    # identity element
    assert np.array_equal(o, o_b) and np.allclose(lse, lse_b, rtol=0, atol=0)
    mixed = lse_b.copy()
    mixed[::2] = -np.inf
    o, lse = merge_states(o_b, mixed, o_empty, lse_empty)
    assert np.all(o[::2] == 0) and np.array_equal(o[1::2], o_b[1::2]) and np.all(np.isneginf(lse[::2]))
    o, lse = merge_many([o_empty] * 3, [lse_empty] * 3)
    assert np.all(o == 0) and np.all(np.isneginf(lse))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_merge_large_logits(rng, dtype):
    # lse around 1e4: e^{lse} overflows any float; only the differences lse_a - lse may be exponentiated.
    nq, nk, d = 6, 40, 16
    q, k, v = rng.standard_normal((nq, d)), rng.standard_normal((nk, d)), rng.standard_normal((nk, d))
    scale = 3000.0
    states = [cast_state(*partial_state(q, k, v, idx, scale=scale), dtype) for idx in random_partition(rng, nk, 3)]
    o, lse = merge_many([s[0] for s in states], [s[1] for s in states])
    ref_o, ref_lse, _ = attention_ref(q, k, v, scale=scale)
    assert np.abs(ref_lse.numpy()).max() > 1000
    assert rel_err(o, ref_o) < 5e-3 and lse_err(lse, ref_lse) < 1e-5


def test_merge_states_bad_input():
    o, lse = np.zeros((2, 3, 4)), np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"lse_a must have shape \(\.\.\., N\)"):
        merge_states(o, np.zeros((2, 4)), o, lse)
    with pytest.raises(ValueError, match="o_a and o_b must have the same shape"):
        merge_states(o, lse, np.zeros((2, 3, 5)), lse)
    with pytest.raises(TypeError, match="o_b must have dtype float16, float32 or float64"):
        merge_states(o, lse, o.astype(np.int32), lse)
    with pytest.raises(TypeError, match="lse_a must"):
        merge_states(o, "lse", o, lse)
    with pytest.raises(ValueError, match="lse_b must be finite or -inf"):
        merge_states(o, lse, o, np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="lse_b must be finite or -inf"):
        merge_states(o, lse, o, np.full((2, 3), np.inf))
    with pytest.raises(ValueError, match="o_a must have at least 2 dimension"):
        merge_states(np.zeros(3), np.zeros(()), o, lse)


def test_merge_many_bad_input():
    o, lse = np.zeros((3, 4)), np.zeros(3)
    with pytest.raises(ValueError, match="at least one partial output"):
        merge_many([], [])
    with pytest.raises(ValueError, match="same length"):
        merge_many([o, o], [lse])
    with pytest.raises(TypeError, match="must be sequences"):
        merge_many(iter([o]), iter([lse]))
    with pytest.raises(ValueError, match=r"os\[1\] is \(3, 5\)"):
        merge_many([o, np.zeros((3, 5))], [lse, lse])
    with pytest.raises(ValueError, match=r"lses\[1\] must have shape"):
        merge_many([o, o], [lse, np.zeros(4)])


def test_merge_many_accepts_stacked_arrays(rng):
    os_ = rng.standard_normal((4, 5, 8))
    lses = rng.standard_normal((4, 5))
    a = merge_many(os_, lses)
    b = merge_many(list(os_), list(lses))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
