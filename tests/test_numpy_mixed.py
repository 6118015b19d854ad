"""reference.numpy.mixed: a mixed prefill + decode batch over a paged cache vs the float64 oracle.

The oracle (``tests.oracle.attention_ref``) attends each request's queries to its keys taken straight from the
arrays the cache was filled from, so paging, packing, GQA and the bottom-right mask are all checked against
code that shares nothing with ``reference``. ``mixed_attention_by_plan`` (tiles, splits, merges) must agree.
"""
import numpy as np
import pytest

from reference.numpy.mixed import mixed_attention, mixed_attention_by_plan, mixed_plan
from reference.numpy.paged import PagedKVCache
from tests.common_numpy import fill_paged_cache as fill_cache
from tests.oracle import lse_err, mixed_attention_ref as oracle, rel_err


# (sequence lengths, new tokens per request, Hq, Hkv, block size): decode rows (1), chunks, a request with no
# cached context (q_len == seq_len), an idle request (0 new tokens)
CASES = [
    ([40, 9, 23, 17], [12, 1, 23, 1], 4, 2, 16),
    ([70, 5, 33], [1, 5, 0], 6, 2, 8),
    ([130, 64, 2], [1, 64, 1], 4, 1, 64),
]


@pytest.mark.mixed
@pytest.mark.parametrize("lens,q_lens,hq,hkv,bs", CASES)
def test_mixed_attention_matches_oracle(rng, lens, q_lens, hq, hkv, bs):
    d = 8
    cache, kv = fill_cache(rng, lens, hkv, d, bs, sum(-(-n // bs) for n in lens) + 3)
    tables, seq_lens = cache.block_tables(range(len(lens)))
    q = rng.standard_normal((sum(q_lens), hq, d))
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    o, lse = mixed_attention(q, cache.k_cache, cache.v_cache, tables, cu, seq_lens)
    ro, rl = oracle(q, kv, q_lens)
    assert o.shape == q.shape and lse.shape == (hq, q.shape[0])
    assert rel_err(o, ro) < 1e-12 and lse_err(lse, rl) < 1e-12
    for small, large, split in [(4, 8, 8), (16, 64, 32), (hq // hkv, hq // hkv, 8)]:
        plan = mixed_plan(np.diff(cu), seq_lens, hq // hkv, small, large, split, align=8)
        op, lp = mixed_attention_by_plan(q, cache.k_cache, cache.v_cache, tables, cu, seq_lens, plan)
        assert rel_err(op, ro) < 1e-12 and lse_err(lp, rl) < 1e-12


@pytest.mark.mixed
def test_mixed_plan_covers_every_key_once(rng):
    q_lens = [1, 37, 1, 0, 5]
    seq_lens = [300, 37, 9, 4, 80]
    g = 4
    plan = mixed_plan(q_lens, seq_lens, g, small_rows=16, large_rows=32, split_keys=64, align=32)
    work = plan.items[:, 4].astype(np.int64) - plan.items[:, 3]
    assert (np.diff(work * np.where(plan.items[:, 5] == 1, 32, 16)) <= 0).all()  # heaviest first
    for b, (n_q, n) in enumerate(zip(q_lens, seq_lens)):
        mine = plan.items[plan.items[:, 0] == b]
        tok = 4 if n_q <= 4 else 8
        assert sorted(set(mine[:, 1].tolist())) == list(range(0, n_q, tok))
        for t0 in range(0, n_q, tok):
            tile = mine[mine[:, 1] == t0]
            tile = tile[np.argsort(tile[:, 8])]
            hi = n - n_q + t0 + min(tok, n_q - t0)
            assert tile[0, 3] == 0 and tile[-1, 4] == hi and (tile[1:, 3] == tile[:-1, 4]).all()
            assert (tile[:, 3] % 32 == 0).all() and (tile[:, 6] == len(tile)).all()
            assert (tile[:, 7] == -1).all() if len(tile) == 1 else len(set(tile[:, 7].tolist())) == 1
    slots = plan.items[plan.items[:, 7] >= 0]
    assert sorted((slots[:, 7] + slots[:, 8]).tolist()) == list(range(plan.n_slots))


@pytest.mark.mixed
def test_mixed_attention_bad_input(rng):
    cache, _ = fill_cache(rng, [20, 6], 2, 8, 4, 12)
    tables, lens = cache.block_tables([0, 1])
    q = rng.standard_normal((3, 4, 8))
    cu = np.array([0, 2, 3], dtype=np.int32)
    kc, vc = cache.k_cache, cache.v_cache
    mixed_attention(q, kc, vc, tables, cu, lens)  # the base call is fine
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 0 is less than request 1's query count"):
        mixed_attention(q, kc, vc, tables, cu, np.array([20, 0]))
    with pytest.raises(ValueError, match="cu_seqlens_q.*must equal the number of packed tokens 3"):
        mixed_attention(q, kc, vc, tables, np.array([0, 2, 4], dtype=np.int32), lens)
    bad = tables.copy()
    bad[0, 1] = 99
    with pytest.raises(ValueError, match="block_tables entries must be -1 .* or in \\[0, 12\\)"):
        mixed_attention(q, kc, vc, bad, cu, lens)
    with pytest.raises(ValueError, match="block_tables must have shape \\(B, max_blocks\\) with B=2"):
        mixed_attention(q, kc, vc, tables[:1], cu, lens)
    with pytest.raises(ValueError, match="v_cache must have the shape of k_cache"):
        mixed_attention(q, kc, vc[:, :2], tables, cu, lens)
    with pytest.raises(TypeError, match="q must be a floating-point array|q must have dtype"):
        mixed_attention(q.astype(np.int64), kc, vc, tables, cu, lens)
    with pytest.raises(ValueError, match="plan was made for other lengths"):
        mixed_attention_by_plan(q, kc, vc, tables, cu, lens, mixed_plan([1, 2], lens, 2))
    with pytest.raises(ValueError, match="split_keys must be a multiple of align"):
        mixed_plan([1, 2], lens, 2, split_keys=100)
