"""reference.triton.mixed_attention (one launch over prefill chunks and decode rows) vs the NumPy reference, the
float64 oracle and separate paged_prefill / paged_decode calls; in the interpreter without a GPU.

Caches come from ``reference.numpy.paged.PagedKVCache`` with sequences appended in interleaved pieces, so their
pages are scattered. Page sizes 16 and 64 (a key block inside one page), 8 (whole pages per block) and 3 (the
row-gather fallback); the interpreter config uses 16-key blocks and 64-key splits, so long rows are split and
merged inside the launch.
"""
import numpy as np
import pytest
import torch

from experiments.serving_baselines import MixedVariant, mixed_attention_variant
from reference.numpy.mixed import mixed_attention as np_mixed
from reference.triton import DEVICE, INTERPRET, paged_decode, paged_prefill
from reference.triton.mixed import MixedConfig, make_mixed_plan, mixed_attention
from tests.common import pinned_flash_configs  # noqa: F401  (autouse fixture)
from tests.oracle import lse_err, rel_err
from tests.common_numpy import fill_paged_cache as fill_cache
from tests.oracle import mixed_attention_ref as oracle

DT = torch.float32 if INTERPRET else torch.float16
TOL = 1e-5 if INTERPRET else 3e-3


def t(x):
    return torch.tensor(np.asarray(x), device=DEVICE)


def setup(rng, lens, q_lens, hq, hkv, bs, d=16):
    cache, kv = fill_cache(rng, lens, hkv, d, bs, sum(-(-n // bs) for n in lens) + 2, dtype=np.float32)
    tables, seq_lens = cache.block_tables(range(len(lens)))
    q = rng.standard_normal((sum(q_lens), hq, d)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    args = (t(q).to(DT), t(cache.k_cache).to(DT), t(cache.v_cache).to(DT), t(tables.astype(np.int32)), t(cu),
            t(seq_lens.astype(np.int32)))
    return cache, kv, q, cu, tables, seq_lens, args


# (cached + new keys per request, new tokens per request, Hq, Hkv, page): decode rows, chunks after cached
# context, a request with zero cached tokens (q_len == seq_len), a request with only a decode row
CASES = [
    ([150, 9, 40, 1], [1, 9, 24, 1], 4, 2, 16),
    ([130, 70, 33], [40, 1, 0], 6, 2, 64),
    ([90, 20, 17], [1, 20, 5], 4, 1, 8),
    ([47, 12], [12, 1], 2, 2, 3),
]


@pytest.mark.triton_mixed
@pytest.mark.parametrize("lens,q_lens,hq,hkv,bs", CASES)
def test_mixed_matches_reference_and_separate_calls(rng, lens, q_lens, hq, hkv, bs):
    cache, kv, q, cu, tables, seq_lens, args = setup(rng, lens, q_lens, hq, hkv, bs)
    o, lse = mixed_attention(*args)
    assert o.shape == q.shape and o.dtype == DT and lse.shape == (hq, q.shape[0])
    ro, rl = oracle(q.astype(np.float64), [(k.astype(np.float64), v.astype(np.float64)) for k, v in kv], q_lens)
    assert rel_err(o, ro) < TOL and lse_err(lse, rl) < TOL
    no, nl = np_mixed(q, cache.k_cache, cache.v_cache, tables, cu, seq_lens)
    assert rel_err(o, no) < TOL and lse_err(lse, nl) < TOL
    # separate calls: the decode rows through paged_decode, the chunks through paged_prefill
    dec = [b for b, n in enumerate(q_lens) if n == 1]
    if dec:
        rows = [int(cu[b]) for b in dec]
        od = paged_decode(args[0][rows], args[1], args[2], args[3][dec], args[5][dec])
        assert rel_err(o[rows], od) < TOL
    pre = [b for b, n in enumerate(q_lens) if n > 1]
    if pre:
        rows = np.concatenate([np.arange(cu[b], cu[b + 1]) for b in pre])
        cu_p = t(np.concatenate([[0], np.cumsum([q_lens[b] for b in pre])]).astype(np.int32))
        op, lp = paged_prefill(args[0][rows], args[1], args[2], args[3][pre], cu_p, args[5][pre])
        assert rel_err(o[rows], op) < TOL and lse_err(lse[:, rows], lp) < TOL


@pytest.mark.triton_mixed
def test_mixed_plan_reused_and_noncausal(rng):
    lens, q_lens = [80, 30], [1, 6]
    cache, kv, q, cu, tables, seq_lens, args = setup(rng, lens, q_lens, 4, 2, 16)
    cfg = MixedConfig(small_rows=16, large_rows=16, block_n=16, num_stages=1, split_keys=32)
    plan = make_mixed_plan(q_lens, seq_lens, 4, 2, 16, config=cfg)
    assert plan.plan.n_slots > 0  # the 80-key decode row is split, merged in the launch
    o1, l1 = mixed_attention(*args, plan=plan)
    o2, l2 = mixed_attention(*args, plan=plan, validate=False)
    o3, _ = mixed_attention(*args, config=cfg)
    assert torch.equal(o1, o2) and torch.equal(l1, l2) and rel_err(o1, o3) < TOL
    ro, rl = oracle(q.astype(np.float64), kv, q_lens)
    assert rel_err(o1, ro) < TOL and lse_err(l1, rl) < TOL
    onc, _ = mixed_attention(*args, causal=False)
    ref, _ = paged_prefill(*args, causal=False)
    assert rel_err(onc, ref) < TOL


@pytest.mark.triton_mixed
@pytest.mark.parametrize("bs", [8, 32])
@pytest.mark.parametrize("ahead", [True, False])
def test_mixed_table_entries_ahead_or_in_place(rng, bs, ahead):
    """Block-table entries looked up one key block ahead with whole-page tiles (the course kernel) or in the
    iteration that uses them, one entry per key (``experiments.serving_baselines.MixedVariant``, the simpler
    lookup): both match the float64 oracle, with pages
    shorter (whole pages per block) and longer than the key block, and a split tile."""
    lens, q_lens = [100, 45, 20], [30, 1, 20]
    cache, kv, q, cu, tables, seq_lens, args = setup(rng, lens, q_lens, 4, 2, bs)
    cfg = MixedVariant(small_rows=16, large_rows=64, block_n=16, num_stages=1 if INTERPRET else 3, split_keys=64,
                       table_ahead=ahead, whole_pages=ahead)
    o, lse = mixed_attention_variant(*args, config=cfg)
    if ahead:  # the course's lookups: the same bits as mixed_attention with the plain config
        plain = MixedConfig(small_rows=16, large_rows=64, block_n=16, num_stages=1 if INTERPRET else 3, split_keys=64)
        o2, lse2 = mixed_attention(*args, config=plain)
        assert torch.equal(o, o2) and torch.equal(lse, lse2)
    with pytest.raises(TypeError, match="mixed_attention_variant"):  # the course call refuses the variant
        mixed_attention(*args, config=cfg)
    ro, rl = oracle(q.astype(np.float64), [(k.astype(np.float64), v.astype(np.float64)) for k, v in kv], q_lens)
    assert rel_err(o, ro) < TOL and lse_err(lse, rl) < TOL


@pytest.mark.triton_mixed
def test_mixed_bad_input_raises_and_writes_nothing(rng):
    cache, kv, q, cu, tables, seq_lens, args = setup(rng, [20, 6], [3, 1], 4, 2, 4)
    qq, kc, vc, bt, cut, sl = args
    before = [x.clone() for x in args]
    mixed_attention(*args)  # the base call is fine
    bad_bt = bt.clone()
    bad_bt[0, 2] = -1
    cases = [
        ((qq, kc, vc, bad_bt, cut, sl), {}, ValueError, r"block_tables\[0, 2\] = -1 is not a block index"),
        ((qq, kc, vc, bt[:1], cut, sl), {}, ValueError, "block_tables must have shape \\(B, max_blocks\\) with B=2"),
        ((qq, kc, vc[:, :2], bt, cut, sl), {}, ValueError, "k_cache and v_cache must have the same shape"),
        ((qq, kc.half() if DT != torch.float16 else kc.float(), vc, bt, cut, sl), {}, TypeError,
         "q, k_cache, v_cache must have the same dtype"),
        ((qq, kc, vc, bt, t(np.array([0, 3, 5], dtype=np.int32)), sl), {}, ValueError,
         r"cu_seqlens_q\[-1\] must equal the number of packed tokens 4"),
        ((qq, kc, vc, bt, cut.float(), sl), {}, TypeError, "cu_seqlens_q must have dtype"),
        ((qq, kc, vc, bt, cut, t(np.array([20, 0], dtype=np.int32))), {}, ValueError,
         r"seq_lens\[1\] = 0 is less than request 1's query count"),
        ((qq, kc, vc, bt, cut, sl), {"plan": make_mixed_plan([3, 1], [20, 6], 4, 2, 16)}, ValueError,
         "plan was made for page_size 16"),
        ((qq, kc, vc, bt, cut, sl), {"plan": make_mixed_plan([2, 2], [20, 6], 4, 2, 4)}, ValueError,
         "plan was made for other lengths"),
        ((qq, kc, vc, bt, cut, sl), {"plan": "plan"}, TypeError, "plan must come from make_mixed_plan"),
    ]
    for a, kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            mixed_attention(*a, **kw)
    for x, y in zip(args, before):
        assert torch.equal(x, y)
