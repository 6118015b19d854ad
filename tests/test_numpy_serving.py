"""reference.numpy varlen attention, paged (chunked) prefill and cascade decode vs the float64 oracle.

The oracle attends each sequence on its own (``tests.oracle.attention_ref``), so packing, boundaries, GQA,
bottom-right causal with Nq != Nk, empty sequences and fully masked rows are all checked against code that
shares nothing with ``reference``.
"""
import numpy as np
import pytest

from reference.numpy import cascade_decode, paged_prefill, varlen_attention, varlen_attention_backward
from reference.numpy.paged import PagedKVCache
from tests.oracle import attention_grads, attention_ref, lse_err, rel_err

TOL = {np.float32: 2e-6, np.float64: 1e-12}


def packed(rng, lens, h, d, dtype=np.float64):
    x = rng.standard_normal((int(sum(lens)), h, d)) + rng.uniform(-0.5, 0.5)
    return x.astype(dtype)


def cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def per_sequence_ref(q, k, v, lq, lk, causal, scale=None):
    """float64 oracle: each sequence attended alone, results packed again (o (T, Hq, d), lse (Hq, T))."""
    o = np.zeros(q.shape)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    cq, ck = cu(lq), cu(lk)
    for b in range(len(lq)):
        if lq[b] == 0 or lk[b] == 0:
            continue
        sl_q, sl_k = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        ob, lb, _ = attention_ref(q[sl_q].transpose(1, 0, 2), k[sl_k].transpose(1, 0, 2),
                                  v[sl_k].transpose(1, 0, 2), causal=causal, scale=scale)
        o[sl_q] = ob.numpy().transpose(1, 0, 2)
        lse[:, sl_q] = lb.numpy()
    return o, lse


CASES = [  # (q lengths, k lengths, Hq, Hkv, d)
    ([5, 1, 17], [5, 1, 17], 4, 2, 8),          # self-attention, ragged, N = 1
    ([3, 9, 4], [7, 9, 2], 2, 2, 16),            # Nq < Nk, Nq > Nk (fully masked causal rows)
    ([0, 6, 2], [4, 6, 0], 6, 2, 4),             # an empty query sequence, a sequence with no keys, GQA 3
    ([1], [1], 1, 1, 4),                         # one token
]


@pytest.mark.varlen
@pytest.mark.parametrize("lq,lk,hq,hkv,d", CASES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_varlen_forward_matches_per_sequence(rng, lq, lk, hq, hkv, d, causal, dtype):
    q, k, v = packed(rng, lq, hq, d, dtype), packed(rng, lk, hkv, d, dtype), packed(rng, lk, hkv, d, dtype)
    o, lse = varlen_attention(q, k, v, cu(lq), cu(lk), causal=causal)
    ro, rl = per_sequence_ref(q, k, v, lq, lk, causal)
    assert o.shape == q.shape and o.dtype == q.dtype and lse.shape == (hq, q.shape[0])
    assert rel_err(o, ro) < TOL[dtype] and lse_err(lse, rl) < TOL[dtype]
    if causal and sum(lq) > 0:  # some rows see no key in these cases: exactly o = 0, lse = -inf
        dead = ~np.isfinite(rl)
        assert np.all(o.transpose(1, 0, 2)[dead] == 0) and np.all(lse[dead] == -np.inf)


@pytest.mark.varlen
def test_varlen_isolates_sequences(rng):
    """Changing one sequence's keys changes only that sequence's outputs."""
    lq, lk = [4, 5, 3], [6, 5, 7]
    q, k, v = packed(rng, lq, 2, 8), packed(rng, lk, 2, 8), packed(rng, lk, 2, 8)
    o1, _ = varlen_attention(q, k, v, cu(lq), cu(lk))
    k2 = k.copy()
    k2[6:11] = rng.standard_normal(k2[6:11].shape)  # sequence 1's keys
    o2, _ = varlen_attention(q, k2, v, cu(lq), cu(lk))
    assert np.array_equal(o1[:4], o2[:4]) and np.array_equal(o1[9:], o2[9:]) and not np.allclose(o1[4:9], o2[4:9])


@pytest.mark.varlen
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_backward_matches_autograd(rng, causal):
    lq, lk, hq, hkv, d = [3, 6, 1, 4], [5, 6, 2, 0], 4, 2, 8
    q, k, v = packed(rng, lq, hq, d), packed(rng, lk, hkv, d), packed(rng, lk, hkv, d)
    do = packed(rng, lq, hq, d)
    dq, dk, dv = varlen_attention_backward(q, k, v, do, cu(lq), cu(lk), causal=causal, scale=0.3)
    cq, ck = cu(lq), cu(lk)
    for b in range(len(lq)):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if lk[b] == 0:
            assert np.all(dq[sq] == 0)
            continue
        t = lambda x: x.transpose(1, 0, 2)  # noqa: E731
        g = attention_grads(t(q[sq]), t(k[sk]), t(v[sk]), t(do[sq]), causal=causal, scale=0.3)
        for got, ref in zip((dq[sq], dk[sk], dv[sk]), g):
            assert rel_err(t(got), ref) < 1e-12


BAD_CU = [
    ([0, 3, 2, 5], "non-decreasing"),
    ([1, 3, 5], "start at 0"),
    ([0, 3, 6], "must equal the number of packed tokens 5"),
    ([0], r"shape \(B \+ 1,\)"),
]


@pytest.mark.varlen
@pytest.mark.parametrize("bad,msg", BAD_CU)
def test_varlen_bad_cu_seqlens(rng, bad, msg):
    q = packed(rng, [5], 2, 8)
    with pytest.raises(ValueError, match="cu_seqlens_q.*" + msg):
        varlen_attention(q, q, q, np.array(bad), np.array([0, 5]))


@pytest.mark.varlen
def test_varlen_bad_types(rng):
    q = packed(rng, [5], 2, 8)
    with pytest.raises(TypeError, match="cu_seqlens_k must hold integers"):
        varlen_attention(q, q, q, np.array([0, 5]), np.array([0.0, 5.0]))
    with pytest.raises(ValueError, match="cu_seqlens_k must have B \\+ 1 = 2 entries"):
        varlen_attention(q, q, q, np.array([0, 5]), np.array([0, 2, 5]))
    with pytest.raises(ValueError, match="q must be packed as \\(total_tokens, heads, d\\)"):
        varlen_attention(q[None], q, q, np.array([0, 5]), np.array([0, 5]))
    with pytest.raises(ValueError, match="multiple of the kv heads"):
        varlen_attention(q, packed(rng, [5], 3, 8), packed(rng, [5], 3, 8), np.array([0, 5]), np.array([0, 5]))


# ---- paged prefill ----------------------------------------------------------------------------------------
def fill_cache(rng, lens, hkv, d, block_size, num_blocks, dtype=np.float64):
    """A PagedKVCache holding sequences of the given lengths (appended in interleaved pieces, so blocks are
    scattered); returns the cache and each sequence's contiguous K/V."""
    cache = PagedKVCache(num_blocks, block_size, hkv, d, dtype=dtype)
    kv = []
    for s, n in enumerate(lens):
        cache.add_sequence(s)
        kv.append((rng.standard_normal((n, hkv, d)).astype(dtype), rng.standard_normal((n, hkv, d)).astype(dtype)))
    for lo in range(0, max(lens), 3):
        for s, (k, v) in enumerate(kv):
            cache.append(s, k[lo:lo + 3], v[lo:lo + 3])
    return cache, kv


@pytest.mark.paged_prefill
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_prefill_matches_contiguous(rng, block_size):
    lens, chunks, hq, hkv, d = [9, 20, 3, 5], [4, 20, 1, 0], 4, 2, 8
    cache, kv = fill_cache(rng, lens, hkv, d, block_size, 64)
    q = packed(rng, chunks, hq, d)
    tables, seq_lens = cache.block_tables(range(len(lens)), max_blocks=12 if block_size == 4 else None)
    o, lse = paged_prefill(q, cache.k_cache, cache.v_cache, tables, cu(chunks), seq_lens)
    k = np.concatenate([x for x, _ in kv])
    v = np.concatenate([y for _, y in kv])
    ro, rl = per_sequence_ref(q, k, v, chunks, lens, causal=True)
    assert rel_err(o, ro) < 1e-12 and lse_err(lse, rl) < 1e-12


@pytest.mark.paged_prefill
def test_paged_prefill_short_block_table_raises(rng):
    cache, _ = fill_cache(rng, [9], 2, 8, 4, 8)
    tables, seq_lens = cache.block_tables([0])
    q = packed(rng, [2], 2, 8)
    short = tables.copy()
    short[0, 2:] = -1  # the table covers 8 of the 9 cached tokens
    with pytest.raises(ValueError, match="block_tables row 0 has 2 block"):
        paged_prefill(q, cache.k_cache, cache.v_cache, short, cu([2]), seq_lens)
    with pytest.raises(ValueError, match="seq_lens entries must lie in \\[0, 8\\]"):
        paged_prefill(q, cache.k_cache, cache.v_cache, tables[:, :2], cu([2]), seq_lens)
    with pytest.raises(TypeError, match="k_cache and v_cache must have the same dtype"):
        paged_prefill(q, cache.k_cache, cache.v_cache.astype(np.float32), tables, cu([2]), seq_lens)


# ---- cascade decode ---------------------------------------------------------------------------------------
@pytest.mark.cascade
@pytest.mark.parametrize("B,P,hq,hkv", [(3, 11, 4, 2), (1, 1, 2, 2), (5, 33, 8, 2)])
def test_cascade_decode_matches_full_attention(rng, B, P, hq, hkv):
    d, bs = 8, 4
    suffix = [int(x) for x in rng.integers(0, 9, B)]
    suffix[0] = 0  # a request with nothing after the prefix
    cache, kv = fill_cache(rng, [max(n, 1) for n in suffix], hkv, d, bs, 64)
    tables, lens = cache.block_tables(range(B))
    lens = np.array(suffix, dtype=np.int32)
    pk, pv = rng.standard_normal((P, hkv, d)), rng.standard_normal((P, hkv, d))
    q = rng.standard_normal((B, hq, d))
    o, lse = cascade_decode(q, pk, pv, cache.k_cache, cache.v_cache, tables, lens)
    assert o.shape == (B, hq, d) and lse.shape == (B, hq)
    for b in range(B):
        k = np.concatenate([pk, kv[b][0][:suffix[b]]]).transpose(1, 0, 2)
        v = np.concatenate([pv, kv[b][1][:suffix[b]]]).transpose(1, 0, 2)
        ro, rl, _ = attention_ref(q[b][:, None], k, v)
        assert rel_err(o[b], ro[:, 0]) < 1e-12 and lse_err(lse[b], rl[:, 0]) < 1e-12


@pytest.mark.cascade
def test_cascade_bad_prefix(rng):
    cache, _ = fill_cache(rng, [4], 2, 8, 4, 8)
    tables, lens = cache.block_tables([0])
    q = rng.standard_normal((1, 2, 8))
    with pytest.raises(ValueError, match="prefix_k must have shape \\(P, Hkv, d\\)"):
        cascade_decode(q, np.zeros((0, 2, 8)), np.zeros((0, 2, 8)), cache.k_cache, cache.v_cache, tables, lens)
    with pytest.raises(ValueError, match="prefix_k must have Hkv = 2"):
        cascade_decode(q, np.zeros((3, 1, 8)), np.zeros((3, 1, 8)), cache.k_cache, cache.v_cache, tables, lens)
