"""The warp-specialised Gluon backward for Hopper (``reference.triton.hopper.flash_gluon_bwd_ws``).

On CPU (CI) the kernel is compiled for sm_90a ahead of time in a child process in compile-only mode
(``TRITON_INTERPRET=0``; the interpreter cannot run Gluon): it must build with a producer warp and two consumer
warpgroups (``setmaxnreg``), TMA loads, the five wgmma products of FA2 Algorithm 2 lines 10-16 per consumer and
step, and no spills. Bad arguments raise naming the argument. On an H100/H200 the gradients are compared with
float64 autograd (``benchmarks/course/bench_gluon_bwd.py --set ws`` does it at scale).
"""
import dataclasses
import json

import pytest
import torch

from reference.triton import DEVICE
from reference.triton.configs import GLUON_BACKWARD, GluonBackwardConfig
from reference.triton.hopper.flash_gluon_bwd_ws import flash_attention_backward_gluon_ws
from tests.oracle import attention_grads, attention_ref, rel_err
from tests.common import gluon_bwd_inputs as _inputs
from tests import sm90_compile

pytestmark = pytest.mark.triton_gluon
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
G_TOL = 2e-2

_CHILD = """
import json, sys
from reference.triton.configs import GluonBackwardConfig
from reference.triton.hopper._aot import resource_usage
from reference.triton.hopper.flash_gluon_bwd_ws import compile_backward_ws
for d, causal, config in json.loads(sys.argv[1]):
    config = GluonBackwardConfig.from_tuple(config) if config else None
    print(json.dumps(resource_usage(compile_backward_ws(d, causal, config))))
"""



@pytest.mark.slow
def test_compiles_for_hopper_warp_specialised_without_spills():
    # the default config at d = 128 causal and non-causal, and d = 64; the persistent schedule at d = 128 (its
    # item loop around the same step: the same products, no spill)
    cases = [[128, True, None], [128, False, None], [64, True, None], [128, True, [64, 2, True, True, True, True]]]
    out = sm90_compile.run(["-c", _CHILD, json.dumps(cases)], timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    usages = [json.loads(x) for x in out.stdout.strip().splitlines()]
    assert len(usages) == len(cases)
    for (d, _, config), usage in zip(cases, usages):
        bm = config[0] if config else GLUON_BACKWARD[d].block_m
        # per consumer and step: S^T, dP^T (d/16 k-steps each), dV, dK (BLOCK_M/16 each), dQ (BLOCK_M/64 x 2 x 4:
        # the consumer's column half over both consumers' keys), plus the deferred last dQ after the loop; two
        # consumers. A recomputing kernel has more.
        assert usage["HGMMA"] == 2 * (2 * d // 16 + 2 * bm // 16 + 2 * (bm // 64) * 8), usage
        assert usage["HMMA"] == 0, usage
        assert usage["UTMALDG"] > 0, usage
        assert usage["USETMAXREG"] > 0, usage  # warp_specialize with register budgets
        if bm == 64:
            assert usage["LDL"] == 0 and usage["STL"] == 0 and usage["stack"] == 0, usage
        else:  # d = 64's 128-row steps: 10-13 spill instructions, 32 bytes of stack (notes/hopper.md 1g), not more
            assert usage["LDL"] <= 16 and usage["STL"] <= 16 and usage["stack"] <= 32, usage
        assert usage["shared_bytes"] <= 232448, usage  # 227 KB, the most one CTA may have


def test_bad_inputs_are_named(rng):
    # the input checks are the serial kernel's (check_backward_args, tested there), naming this entry point
    q, k, v, do = _inputs(rng, 1, 2, 2, 8, 8, 64)
    lse = torch.zeros(1, 2, 8, device=DEVICE)
    f = flash_attention_backward_gluon_ws
    with pytest.raises(ValueError, match="flash_attention_backward_gluon_ws: q, k, v must be bfloat16 or float16"):
        f(q.float(), k.float(), v.float(), q.float(), lse, do.float())
    with pytest.raises(ValueError, match="lse must have"):
        f(q, k, v, q, lse[:, :1], do)
    with pytest.raises(TypeError, match=r"config must be a reference\.triton\.configs\.GluonBackwardConfig or None"):
        f(q, k, v, q, lse, do, config=(64, 2, True, True, True))  # the tuple form is refused, not read
    with pytest.raises(ValueError, match="GluonBackwardConfig.dq_tma must be a bool"):
        GluonBackwardConfig(dq_tma=1)
    with pytest.raises(ValueError, match="GluonBackwardConfig.block_m must be a power of two"):
        GluonBackwardConfig(block_m=96)
    with pytest.raises(ValueError, match="block_m must be 64"):
        f(q, k, v, q, lse, do, config=GluonBackwardConfig(block_m=32))
    q1, k1, v1, do1 = _inputs(rng, 1, 2, 2, 8, 8, 128)
    with pytest.raises(ValueError, match=r"block_m must be 64 \(or 128 at head_dim 64\)"):
        f(q1, k1, v1, q1, lse, do1, config=GluonBackwardConfig(block_m=128))  # d = 128: too many registers
    with pytest.raises(ValueError, match="num_stages 2 or 3"):
        f(q, k, v, q, lse, do, config=GluonBackwardConfig(num_stages=4))
    with pytest.raises(ValueError, match="block_n 128"):
        f(q, k, v, q, lse, do, config=GluonBackwardConfig(block_n=64))
    for bad in (-1, 1.5, True, "all"):
        with pytest.raises(ValueError, match="order_heads must be an int >= 0"):
            f(q, k, v, q, lse, do, order_heads=bad)


def test_program_order_visits_every_block_once_longest_first():
    # _program_order's arithmetic, replayed in Python on the grids it sees (a head count that the group size does
    # not divide included): a bijection onto (key block, head); inside a group the blocks come by key block, i.e.
    # longest first under the causal mask, the heads interleaved
    from reference.triton.hopper.flash_gluon_bwd_ws import check_order_heads

    def order(pid, n_programs, n_blocks, g):
        n_heads = n_programs // n_blocks
        grp = pid // (n_blocks * g)
        in_grp = min(g, n_heads - grp * g)
        r = pid - grp * n_blocks * g
        return r // in_grp, grp * g + r % in_grp

    for n_blocks, n_heads in [(1, 1), (5, 3), (7, 8), (64, 8)]:
        for g in {1, 2, 3, n_heads}:
            g = check_order_heads(g, True, n_heads)
            seq = [order(p, n_blocks * n_heads, n_blocks, g) for p in range(n_blocks * n_heads)]
            assert sorted(seq) == [(j, h) for j in range(n_blocks) for h in range(n_heads)]
            for grp in range(-(-n_heads // g)):
                mine = [j for j, h in seq if h // g == grp]
                assert mine == sorted(mine)  # key block ascending = longest first
    assert check_order_heads(0, True, 6) == 6 and check_order_heads(9, False, 6) == 6


@pytest.mark.parametrize("causal,Nq,Nk,bm,n_heads,group,order,P", [
    (True, 2048, 2048, 64, 128, 1, 1, 132), (True, 8192, 8192, 64, 16, 4, 2, 132), (False, 1000, 3000, 128, 5, 1, 0, 7),
    (True, 300, 1000, 64, 3, 2, 1, 4), (True, 1, 5, 64, 1, 1, 1, 1), (True, 4096, 4096, 128, 32, 4, 0, 132)])
def test_persistent_schedule_deals_every_block_once_and_balances(causal, Nq, Nk, bm, n_heads, group, order, P):
    # the persistent launch's list: P + 1 run offsets, then every (key block, head) item exactly once, each run in
    # program order (a program takes its items in the order the list deals them); the busiest program's work is
    # within one longest item of the average (list scheduling's bound, Graham 1966), by the same cost model
    from reference.triton.hopper.flash_gluon_bwd_ws import (ITEM_OVERHEAD_STEPS, block_costs, persistent_schedule,
                                                            program_order)
    costs = block_costs(causal, Nq, Nk, bm)
    n_blocks = len(costs)
    order = order or n_heads  # 0: all heads (check_order_heads)
    sched = persistent_schedule(causal, Nq, Nk, bm, n_heads, group, order, P)
    offsets, codes = sched[:P + 1], sched[P + 1:]
    assert offsets[0] == 0 and offsets[-1] == len(codes) == n_blocks * n_heads
    assert all(a <= b for a, b in zip(offsets, offsets[1:]))
    assert sorted(codes) == list(range(n_blocks * n_heads))
    rank = {h * n_blocks + j: i for i, (j, h) in enumerate(program_order(n_blocks, n_heads, order))}
    cost = {c: costs[c % n_blocks] * group + ITEM_OVERHEAD_STEPS for c in codes}
    loads = []
    for p in range(P):
        run = codes[offsets[p]:offsets[p + 1]]
        assert [rank[c] for c in run] == sorted(rank[c] for c in run)
        loads.append(sum(cost[c] for c in run))
    assert max(loads) <= sum(loads) / P + max(cost.values()) + 1e-9
    if causal and Nq == Nk:  # the causal mask: key block j sees the query blocks from its own diagonal on
        assert costs == [-(-Nq // bm) - j * 128 // bm for j in range(n_blocks)]
    with pytest.raises(ValueError, match="persistent_schedule: order_heads must be a positive int, got 0"):
        persistent_schedule(causal, Nq, Nk, bm, n_heads, group, 0, P)


def test_the_pinned_order_interleaves_only_short_causal_launches():
    # the longest program's share of one SM's work on 132 SMs (an H100): GQA 4:1 at 8k-16k interleaves two heads,
    # MHA and 32k stay head-major; non-causal launches always do
    from reference.triton import configs
    from reference.triton.hopper.flash_gluon_bwd_ws import check_order_heads, longest_share
    gqa_8k = longest_share(True, 8192, 8192, 64, 8, 132)  # B = 2, Hkv = 4
    assert abs(gqa_8k - 128 * 132 / (4160 * 8)) < 1e-12  # blocks cost 128 - 2j query steps, j < 64
    assert check_order_heads(None, True, 8, gqa_8k) == configs.GLUON_BWD_ORDER["heads"]
    assert check_order_heads(None, False, 8, longest_share(False, 8192, 8192, 64, 8, 132)) == 1
    for args in [(8192, 8192, 64, 32), (32768, 32768, 64, 8), (2048, 2048, 64, 128)]:  # MHA 8k, GQA 32k, MHA 2k
        assert check_order_heads(None, True, args[-1], longest_share(True, *args, 132)) == 1, args
    assert longest_share(True, 1, 5, 64, 1, 132) == 132.0  # one program


@pytest.mark.skipif(HOPPER, reason="checks the error raised where no Hopper GPU is present")
def test_needs_a_hopper_gpu(rng):
    q, k, v, do = _inputs(rng, 1, 2, 2, 8, 8, 64)
    with pytest.raises(RuntimeError, match="flash_attention_backward_gluon_ws needs .*compute capability 9.0"):
        flash_attention_backward_gluon_ws(q, k, v, q, torch.zeros(1, 2, 8, device=DEVICE), do)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
# the default, the first TMA-reduce version (no DEFER, no LD_TMA) and dQ by vector atomics from registers
@pytest.mark.parametrize("config", [None] + [GluonBackwardConfig.from_tuple(t) for t in (
    (64, 2, True, False, False), (64, 2, False, False, False), (64, 2, True, True, True),
    (64, 2, True, True, True, True), (64, 2, False, False, False, True))])
@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,d,causal,dtype", [
    (2, 4, 4, 256, 256, 128, False, torch.bfloat16), (1, 4, 2, 300, 1000, 128, True, torch.bfloat16),
    (1, 2, 2, 1000, 300, 128, True, torch.bfloat16), (1, 2, 2, 333, 333, 64, False, torch.float16),
    (1, 2, 2, 1, 5, 64, True, torch.bfloat16)])
def test_gradients_match_float64_autograd(rng, config, B, Hq, Hkv, Nq, Nk, d, causal, dtype):
    q, k, v, do = _inputs(rng, B, Hq, Hkv, Nq, Nk, d, dtype)
    o, lse, _ = attention_ref(q, k, v, causal=causal)
    got = flash_attention_backward_gluon_ws(q, k, v, o.to(DEVICE, dtype), lse.to(DEVICE, torch.float32), do,
                                            causal=causal, config=config)
    for name, a, r in zip(("dq", "dk", "dv"), got, attention_grads(q, k, v, do, causal=causal)):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, r) < G_TOL, (name, rel_err(a, r))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
# the program order (head-major, groups of 3 of 4 heads: one short group, all heads) on GQA with many key blocks,
# ragged N, causal Nq < Nk and not; d = 64's 128-row steps and d = 128; one program per key block, and persistent
# on 5 programs (several items a CTA, of different lengths: barrier phases and buffers carried from item to item)
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("order_heads", [1, 3, 0])
@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,d,causal", [
    (2, 8, 2, 700, 900, 128, True), (2, 8, 2, 650, 650, 64, True), (1, 12, 4, 500, 500, 128, False)])
def test_program_orders_match_float64_autograd(rng, persistent, order_heads, B, Hq, Hkv, Nq, Nk, d, causal):
    q, k, v, do = _inputs(rng, B, Hq, Hkv, Nq, Nk, d, torch.bfloat16)
    o, lse, _ = attention_ref(q, k, v, causal=causal)
    config = dataclasses.replace(GLUON_BACKWARD[d], persistent=persistent)
    got = flash_attention_backward_gluon_ws(q, k, v, o.to(DEVICE, q.dtype), lse.to(DEVICE, torch.float32), do,
                                            causal=causal, order_heads=order_heads, config=config,
                                            _programs=5 if persistent else None)
    for name, a, r in zip(("dq", "dk", "dv"), got, attention_grads(q, k, v, do, causal=causal)):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, r) < G_TOL, (name, rel_err(a, r))
