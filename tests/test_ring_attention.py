"""Ring attention on torch.distributed: gloo CPU ranks against the single-process float64 oracle.

Each world size is spawned ONCE (one test runs every case in the same ranks, so pytest-xdist cannot split the
cases over workers and spawn twice) to keep CI cheap; a hang fails with TimeoutError after RANK_TIMEOUT seconds.
"""
import os
from pathlib import Path
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist

from reference.distributed import layout as L
from reference.distributed.demo import case_inputs, ring_cases_rank
from reference.distributed.launch import run_ranks
from reference.distributed.local_step import block_calls, visible_pairs
from reference.distributed.merge import merge_into, merge_states_torch
from reference.distributed.ring_attention import (ring_attention, ring_attention_backward,
                                                  ring_attention_forward, simulate_ring_attention)
from reference.distributed.schedule import ring_balance, ring_work

from .ring_ranks import fail_rank as _fail_rank, hang_rank as _hang_rank
from .oracle import allowed_mask, attention_grads, attention_ref, lse_err, rel_err

pytestmark = pytest.mark.ring_attention
RANK_TIMEOUT = 90

# name: (causal, layout, nq, nk, hq, hkv, extra)
CASES = {
    "full_zigzag_ragged_gqa": (False, "zigzag", 13, 13, 4, 2, {}),
    "causal_zigzag_ragged_gqa": (True, "zigzag", 13, 13, 4, 2, {"autograd": True}),
    "causal_contiguous_ragged": (True, "contiguous", 11, 11, 2, 2, {}),
    "causal_nq_lt_nk": (True, "zigzag", 6, 11, 2, 1, {}),
    "causal_nq_gt_nk_masked_rows": (True, "zigzag", 11, 6, 2, 2, {"autograd": True}),
    "full_cross_lengths": (False, "contiguous", 5, 9, 2, 1, {}),
    "causal_n1": (True, "zigzag", 1, 1, 2, 2, {}),
    "causal_zigzag_numpy_step": (True, "zigzag", 10, 10, 2, 1, {"step": "numpy"}),
    "causal_zigzag_float32": (True, "zigzag", 12, 12, 2, 2, {"dtype": "float32", "B": 2}),
    # ranks 1..W-1 only (group ranks != global ranks; an odd ring of 3 when W = 4)
    "causal_zigzag_subgroup": (True, "zigzag", 14, 14, 2, 1, {"subgroup": True, "autograd": True}),
}


def _case(name, seed):
    causal, layout, nq, nk, hq, hkv, extra = CASES[name]
    return {"name": name, "seed": seed, "causal": causal, "layout": layout, "nq": nq, "nk": nk, "hq": hq,
            "hkv": hkv, **extra}


def _check_case(case, per_rank, world):  # per_rank: the ranks of the case's group, in order
    """Failures (strings) of one case's rank results against the float64 oracle; [] when all match."""
    q, k, v, do = case_inputs(case)
    o_ref, lse_ref, _ = attention_ref(q, k, v, causal=case["causal"])
    grads_ref = attention_grads(q, k, v, do, causal=case["causal"])
    lay = case["layout"]
    got = {key: L.unshard([p[key] for p in per_rank], lay) for key in ("o", "dq", "dk", "dv")}
    lse = L.unshard([p["lse"].unsqueeze(-1) for p in per_rank], lay).squeeze(-1)
    tol = 1e-5 if case.get("dtype") == "float32" else 1e-12
    errs = {"o": rel_err(got["o"], o_ref), "lse": lse_err(lse, lse_ref)}
    errs.update({key: rel_err(got[key], ref) for key, ref in zip(("dq", "dk", "dv"), grads_ref)})
    bad = [f"{case['name']}: {key} error {e:.3g} > {tol}" for key, e in errs.items() if not e < tol]
    if any(len(p["compute_s"]) != len(per_rank) for p in per_rank):
        bad.append(f"{case['name']}: stats do not have one compute time per ring step")
    empty = ~allowed_mask(case["nq"], case["nk"]).any(dim=1) if case["causal"] else torch.zeros(case["nq"], dtype=bool)
    if not (torch.all(got["o"][..., empty, :] == 0) and torch.all(lse[..., empty] == float("-inf"))):
        bad.append(f"{case['name']}: rows that see no key must give o = 0 and lse = -inf exactly")
    return bad


@pytest.mark.parametrize("world", [2, 4])
def test_ring_matches_single_process_oracle(world):
    """One spawn of ``world`` gloo ranks runs every case (outputs, lse and gradients vs float64 autograd)."""
    seed = int.from_bytes(os.urandom(4), "little")
    cases = [_case(n, seed + i) for i, n in enumerate(CASES)]
    results = run_ranks(ring_cases_rank, world, (cases,), timeout=RANK_TIMEOUT)
    bad = [m for i, case in enumerate(cases)
           for m in _check_case(case, [r[i] for r in results if r[i] is not None], world)]
    assert not bad, f"world={world} seed={seed}:\n" + "\n".join(bad)
    assert any(not allowed_mask(c["nq"], c["nk"]).any(dim=1).all() for c in cases if c["causal"]), \
        "a case must have fully masked rows"


# ------------------------------------------------------------------------------------------------------
# single process: layout, schedule, local-step decomposition, merge, bad input
# ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,world", [(13, 2), (1, 4), (16, 4), (0, 3), (7, 1)])
@pytest.mark.parametrize("layout", L.LAYOUTS)
def test_layout_partitions_positions(n, world, layout):
    segs = L.rank_segments(n, world, layout)
    covered = sorted(i for r in segs for a, b in r for i in range(a, b))
    assert covered == list(range(n))
    if layout == "zigzag":  # rank r holds chunks r and 2W-1-r of 2W array_split chunks
        chunks = np.array_split(np.arange(n), 2 * world)
        for r in range(world):
            want = np.concatenate([chunks[r], chunks[2 * world - 1 - r]])
            assert [i for a, b in segs[r] for i in range(a, b)] == want.tolist()
    x = torch.arange(2 * n, dtype=torch.float64).reshape(1, 1, n, 2)
    assert torch.equal(L.unshard([L.shard(x, r, world, layout) for r in range(world)], layout), x)


def test_block_calls_cover_exactly_the_visible_pairs():
    """Brute force: the kernel calls of a segment pair score each visible (i, j) exactly once, nothing else."""
    for nq in range(0, 6):
        for nk in range(0, 6):
            for delta in range(-8, 9):
                for causal in (False, True):
                    seen = np.zeros((nq, nk), dtype=int)
                    for q_lo, q_hi, k_hi, c in block_calls(nq, nk, delta, causal):
                        off = k_hi - (q_hi - q_lo)
                        for i in range(q_lo, q_hi):
                            for j in range(k_hi):
                                if not c or j <= i - q_lo + off:
                                    seen[i, j] += 1
                    want = np.ones((nq, nk), dtype=int)
                    if causal:
                        want = (np.arange(nk)[None, :] <= np.arange(nq)[:, None] + delta).astype(int)
                    assert np.array_equal(seen, want), (nq, nk, delta, causal)
                    assert visible_pairs(nq, nk, delta, causal) == want.sum()


@pytest.mark.parametrize("world", [2, 4, 8])
def test_zigzag_balances_causal_work_and_contiguous_does_not(world):
    n = 64 * world
    naive = ring_balance(ring_work(n, n, world, "contiguous", causal=True))
    zig = ring_balance(ring_work(n, n, world, "zigzag", causal=True))
    total = n * (n + 1) // 2
    assert naive["per_rank_total"][-1] > naive["per_rank_total"][0] * (world - 1)
    assert sum(zig["per_rank_total"]) == sum(naive["per_rank_total"]) == total
    assert zig["efficiency"] > 0.99
    # contiguous: step 0 is a half block (the diagonal) for everyone, then the last rank does a full block at
    # every step: time = W - 1/2 blocks, ideal = W/2 blocks
    assert naive["efficiency"] == pytest.approx(world / (2 * world - 1), rel=0.02)


def test_simulated_ring_with_triton_step_matches_oracle(rng):
    """The course's Triton kernels (interpreter on CPU) as the local step, every rank and step in one process."""
    from reference.triton import DEVICE
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q = torch.randn(1, 2, 40, 16, generator=g).to(DEVICE)
    k, v = (torch.randn(1, 1, 40, 16, generator=g).to(DEVICE) for _ in range(2))
    do = torch.randn(1, 2, 40, 16, generator=g).to(DEVICE)
    o, lse, grads = simulate_ring_attention(q, k, v, 2, causal=True, step="triton", do=do)
    o_ref, lse_ref, _ = attention_ref(q, k, v, causal=True)
    assert rel_err(o, o_ref) < 1e-2 and lse_err(lse, lse_ref) < 1e-3   # fp32 inputs: TF32-level on a GPU
    for got, ref in zip(grads, attention_grads(q, k, v, do, causal=True)):
        assert rel_err(got, ref) < 1e-2


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def test_gluon_step_is_registered_and_refuses_a_non_hopper_device():
    """``step="gluon"``: the Hopper wing's kernels as the ring's local step; without an sm_90 GPU the kernels'
    own device check names what is missing (no silent fallback to another kernel)."""
    from reference.distributed.local_step import GluonStep, get_step
    st = get_step("gluon")
    assert isinstance(st, GluonStep)
    if HOPPER:
        pytest.skip("on Hopper the step runs: test_simulated_ring_with_gluon_step_matches_oracle")
    q = torch.randn(1, 2, 64, 64, dtype=torch.bfloat16)
    with pytest.raises((RuntimeError, ValueError), match="(?i)hopper|sm_90|cuda|gpu"):
        st.forward(q, q[:, :1], q[:, :1], True, 0.125)


@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
def test_simulated_ring_with_gluon_step_matches_oracle(rng):
    """The Gluon forward and warp-specialised backward as the local step (zig-zag and contiguous, GQA, ragged
    chunk lengths), every rank and step in one process, against the float64 oracle."""
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    for world, n, layout in ((2, 1000, "zigzag"), (3, 777, "contiguous")):
        q = torch.randn(1, 4, n, 64, generator=g).to("cuda", torch.bfloat16)
        k, v = (torch.randn(1, 2, n, 64, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
        do = torch.randn(1, 4, n, 64, generator=g).to("cuda", torch.bfloat16)
        o, lse, grads = simulate_ring_attention(q, k, v, world, causal=True, layout=layout, step="gluon", do=do)
        o_ref, lse_ref, _ = attention_ref(q, k, v, causal=True)
        assert rel_err(o, o_ref) < 2e-2 and lse_err(lse, lse_ref) < 1e-2, (world, layout)
        for got, ref in zip(grads, attention_grads(q, k, v, do, causal=True)):
            assert rel_err(got, ref) < 3e-2, (world, layout)


def test_merge_states_torch_matches_union_and_handles_empty_sets(rng):
    s = torch.from_numpy(rng.standard_normal((3, 10)))
    vals = torch.from_numpy(rng.standard_normal((10, 4)))

    def part(cols):
        lse = torch.logsumexp(s[:, cols], dim=1)
        return torch.softmax(s[:, cols], dim=1) @ vals[cols], lse
    o, lse = merge_states_torch(*part(slice(0, 4)), *part(slice(4, 10)))
    o_ref, lse_ref = part(slice(0, 10))
    assert rel_err(o, o_ref) < 1e-13 and lse_err(lse, lse_ref) < 1e-13
    empty_o, empty_l = torch.full((3, 4), float("nan"), dtype=torch.float64), torch.full((3,), float("-inf"),
                                                                                            dtype=torch.float64)
    o2, l2 = merge_states_torch(o_ref, lse_ref, empty_o, empty_l)
    assert torch.equal(o2, o_ref) and torch.equal(l2, lse_ref)
    o3, l3 = merge_states_torch(empty_o, empty_l, empty_o, empty_l)
    assert torch.all(o3 == 0) and torch.all(l3 == float("-inf"))
    # the ring's in-place form, on row slices (views), with empty rows on either side
    o_acc, l_acc = part(slice(0, 4))
    o_acc, l_acc = o_acc.clone(), l_acc.clone()
    o_acc[0], l_acc[0] = 0, float("-inf")
    o_b, l_b = part(slice(4, 10))
    o_b[1], l_b[1] = 0, float("-inf")
    want = merge_states_torch(o_acc, l_acc, o_b, l_b)
    big_o, big_l = torch.zeros(5, 4, dtype=torch.float64), torch.full((5,), float("-inf"), dtype=torch.float64)
    big_o[1:4], big_l[1:4] = o_acc, l_acc
    merge_into(big_o[1:4], big_l[1:4], o_b, l_b)
    assert rel_err(big_o[1:4], want[0]) < 1e-14 and lse_err(big_l[1:4], want[1]) < 1e-14
    assert torch.all(big_o[[0, 4]] == 0) and torch.all(big_l[[0, 4]] == float("-inf"))
    with pytest.raises(ValueError, match="lse_a"):
        merge_states_torch(o_ref, lse_ref[:2], o_ref, lse_ref)
    with pytest.raises(TypeError, match="o_b"):
        merge_states_torch(o_ref, lse_ref, o_ref.numpy(), lse_ref)


@pytest.fixture
def one_rank_group():
    """A world of one gloo process (this one): the ring with no sends, and the argument checks."""
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/rv", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_world_of_one_and_bad_input(one_rank_group, rng):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    q, k, v, do = (torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64) for _ in range(4))
    o, lse = ring_attention_forward(q, k, v, causal=True)
    o_ref, lse_ref, _ = attention_ref(q, k, v, causal=True)
    assert rel_err(o, o_ref) < 1e-13 and lse_err(lse, lse_ref) < 1e-13
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    ring_attention(*leaves, causal=True).backward(do)
    for x, ref in zip(leaves, attention_grads(q, k, v, do, causal=True)):
        assert rel_err(x.grad, ref) < 1e-12
    with pytest.raises(ValueError, match="holds 9 positions"):
        ring_attention_forward(q, k, v, seq_lens=(20, 9))
    with pytest.raises(ValueError, match="layout"):
        ring_attention_forward(q, k, v, layout="striped")
    with pytest.raises(ValueError, match="step"):
        ring_attention_forward(q, k, v, step="cuda")
    with pytest.raises(TypeError, match="step"):
        ring_attention_forward(q, k, v, step=3)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        ring_attention_forward(q, k[:, :1].expand(1, 3, 9, 8)[:, :3], v[:, :1].expand(1, 3, 9, 8))
    with pytest.raises(TypeError, match="one dtype"):
        ring_attention_forward(q, k.float(), v)
    with pytest.raises(ValueError, match="shape"):
        ring_attention_backward(q, k, v, o[:, :, :3], lse, do)


def test_ring_without_process_group_says_how_to_start_one():
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_attention_forward(q, q, q)


def test_run_ranks_times_out_instead_of_hanging():
    with pytest.raises(TimeoutError, match="did not finish"):
        run_ranks(_hang_rank, 2, timeout=2)


def test_run_ranks_reraises_a_rank_error():
    with pytest.raises(RuntimeError, match="(?s)rank 1: .*rank 1 failed on purpose"):
        run_ranks(_fail_rank, 2, timeout=60)


@pytest.mark.parametrize("layout", L.LAYOUTS)
@pytest.mark.parametrize("world,n,hq,hkv", [(3, 29, 4, 2), (2, 1, 1, 1), (4, 13, 2, 2)])
def test_numpy_ring_step_builds_causal_attention(rng, layout, world, n, hq, hkv):
    """reference.numpy.ring.ring_step folded over every rank and step equals float64 causal attention."""
    from reference.numpy.ring import ring_step
    q = rng.standard_normal((2, hq, n, 8))
    k, v = rng.standard_normal((2, hkv, n, 8)), rng.standard_normal((2, hkv, n, 8))
    o_ref, lse_ref, _ = attention_ref(q, k, v, causal=True)
    o, lse = np.zeros_like(q), np.full(q.shape[:-1], -np.inf)
    segs = L.rank_segments(n, world, layout)
    pos = [np.array([i for a, b in segs[r] for i in range(a, b)], dtype=np.int64) for r in range(world)]
    for r in range(world):
        o_r, l_r = np.zeros((2, hq, len(pos[r]), 8)), np.full((2, hq, len(pos[r])), -np.inf)
        for s in range(world):
            kp = pos[(r - s) % world]
            o_r, l_r = ring_step(o_r, l_r, q[..., pos[r], :], k[..., kp, :], v[..., kp, :], pos[r], kp)
            assert not np.isnan(o_r).any() and not np.isnan(l_r).any()
        o[..., pos[r], :], lse[..., pos[r]] = o_r, l_r
    assert rel_err(o, o_ref) < 1e-13 and lse_err(lse, lse_ref) < 1e-13


def test_numpy_ring_step_keeps_state_of_rows_that_see_nothing_and_checks_input(rng):
    from reference.numpy.ring import ring_step
    o = rng.standard_normal((1, 3, 4)).astype(np.float32)
    lse = np.array([[0.5, -np.inf, 1.0]], dtype=np.float32)
    o[0, 1] = 0
    q, k, v = rng.standard_normal((1, 3, 4)), rng.standard_normal((1, 2, 4)), rng.standard_normal((1, 2, 4))
    o2, l2 = ring_step(o, lse, q, k, v, np.array([0, 1, 2]), np.array([5, 6]))   # keys after every query
    assert o2.dtype == np.float32 and l2.dtype == np.float32
    assert np.array_equal(o2, o) and np.array_equal(l2, lse)
    with pytest.raises(ValueError, match="q_pos"):
        ring_step(o, lse, q, k, v, np.array([0.0, 1, 2]), np.array([5, 6]))
    with pytest.raises(ValueError, match="o must have"):
        ring_step(o[:, :2], lse, q, k, v, np.array([0, 1, 2]), np.array([5, 6]))
    with pytest.raises(TypeError, match="causal"):
        ring_step(o, lse, q, k, v, np.array([0, 1, 2]), np.array([5, 6]), causal=1)


def test_bench_ring_smoke_runs_end_to_end(tmp_path):
    """benchmarks/course/bench_ring.py --smoke (CPU, gloo, one rank + the emulated 2-rank ring): JSON and plot written."""
    import json
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "benchmarks.course.bench_ring", "--smoke", "--world-size", "1", "--out",
                    str(tmp_path)], cwd=root, check=True, capture_output=True, timeout=600)
    data = json.loads((tmp_path / "smoke-ring-w1.json").read_text())
    assert (tmp_path / "smoke-ring-w1.png").exists()
    assert all(c["rel_err"] < 1e-5 for c in data["checks"]) and len(data["checks"]) == 3
    emulated = [r for r in data["rows"] if "emulated_world" in r]
    assert len(emulated) == 3 and all(len(r["compute_ms"]) == 2 for r in emulated)


# ------------------------------------------------------------------------------------------------------
# one kernel call per ring step, a fused merge, a running state that adopts
# ------------------------------------------------------------------------------------------------------
def _brute_seen(q_segs, k_segs, off, causal, calls):
    qpos = [p for a, b in q_segs for p in range(a, b)]
    kpos = [p for a, b in k_segs for p in range(a, b)]
    want = np.array([[(not causal) or kp <= qp + off for kp in kpos] for qp in qpos], dtype=int)
    want = want.reshape(len(qpos), len(kpos))
    seen = np.zeros_like(want)
    for lo, hi, klo, khi, c in calls:
        for i in range(lo, hi):
            for j in range(klo, khi):
                if not c or j - klo <= i - lo + (khi - klo) - (hi - lo):
                    seen[i, j] += 1
    return seen, want


def test_step_calls_cover_exactly_the_visible_pairs_and_zigzag_steps_are_one_call(rng):
    """Brute force over the ring's real schedules (both layouts, ragged, Nq != Nk) and random segment sets:
    every visible (row, key) pair is scored exactly once; a zig-zag step of equal chunks is ONE kernel call."""
    from reference.distributed.local_step import step_calls
    for n in (1, 5, 13, 16, 48, 100):
        for world in (1, 2, 3, 4):
            for lay in L.LAYOUTS:
                for extra in (0, 3, -2):
                    nq, nk = n, max(n + extra, 0)
                    qs, ks = L.rank_segments(nq, world, lay), L.rank_segments(nk, world, lay)
                    for r in range(world):
                        for s in range(world):
                            for causal in (True, False):
                                calls = step_calls(qs[r], ks[(r - s) % world], nk - nq, causal)
                                seen, want = _brute_seen(qs[r], ks[(r - s) % world], nk - nq, causal, calls)
                                assert np.array_equal(seen, want), (n, world, lay, extra, r, s, causal, calls)
                                if lay == "zigzag" and n % (2 * world) == 0 and extra == 0:
                                    assert len(calls) <= 1, (n, world, r, s, calls)
    for _ in range(400):   # random segments; unsorted key segments take the per-pair fallback
        def segs():
            pts = sorted(rng.choice(30, size=int(rng.choice([2, 4, 6])), replace=False).tolist())
            out = [(pts[i], pts[i + 1]) for i in range(0, len(pts), 2)]
            return out[::-1] if rng.random() < 0.2 else out
        q_segs, k_segs, off, causal = segs(), segs(), int(rng.integers(-10, 11)), bool(rng.random() < 0.8)
        calls = step_calls(q_segs, k_segs, off, causal)
        seen, want = _brute_seen(q_segs, k_segs, off, causal, calls)
        assert np.array_equal(seen, want), (q_segs, k_segs, off, causal, calls)


@pytest.mark.parametrize("state", ["float32", "bfloat16"])
def test_fused_merge_matches_merge_states_on_row_slices(rng, state):
    """The Triton merge (interpreter on CPU) on strided row slices, with rows empty on either side or both,
    against ``merge_states_torch`` in float64; rows outside the slice untouched."""
    from reference.distributed.merge_triton import merge_rows_triton
    from reference.triton import DEVICE
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    B, H, N, d, lo, hi = 2, 3, 37, 24, 5, 30
    dt = getattr(torch, state)
    o_acc = torch.randn(B, H, N, d, generator=g).to(dt)
    lse_acc = torch.randn(B, H, N, generator=g) * 3
    o_b = torch.randn(B, H, hi - lo, d, generator=g).to(torch.bfloat16)
    lse_b = torch.randn(B, H, hi - lo, generator=g) * 3
    lse_acc[:, :, lo:lo + 3] = float("-inf")
    o_acc[:, :, lo:lo + 3] = 0
    lse_b[:, :, 2:5] = float("-inf")          # rows lo+2 (both empty), lo+3, lo+4 (b empty)
    o_b[:, :, 2:5] = 0
    want_o, want_l = merge_states_torch(o_acc[:, :, lo:hi].double(), lse_acc[:, :, lo:hi].double(),
                                        o_b.double(), lse_b.double())
    oa, la = o_acc.to(DEVICE), lse_acc.to(DEVICE)
    before_o, before_l = oa.clone(), la.clone()
    merge_rows_triton(oa[:, :, lo:hi], la[:, :, lo:hi], o_b.to(DEVICE), lse_b.to(DEVICE))
    oa, la = oa.cpu(), la.cpu()
    tol = 1e-6 if state == "float32" else 1e-2
    assert rel_err(oa[:, :, lo:hi], want_o) < tol
    assert torch.allclose(la[:, :, lo:hi].double(), want_l, atol=1e-5, equal_nan=False)
    assert torch.all(oa[:, :, lo + 2] == 0) and torch.all(la[:, :, lo + 2] == float("-inf"))
    assert not torch.isnan(oa).any()
    for sl in (slice(0, lo), slice(hi, N)):
        assert torch.equal(oa[:, :, sl], before_o[:, :, sl].cpu()) and torch.equal(la[:, :, sl], before_l[:, :, sl].cpu())
    with pytest.raises(ValueError, match="merge_rows_triton"):
        merge_rows_triton(oa.transpose(2, 3), la, o_b, lse_b)


def test_running_state_adopts_first_output_and_merges_later_ones(rng):
    """``RunningState``: a full-cover first output is adopted (no copy), a partial one copied into 0 / -inf rows,
    later outputs merged; rows never absorbed give o = 0, lse = -inf; ``state_dtype_for`` checks its argument."""
    from reference.distributed.merge import RunningState, state_dtype_for
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    shape = (1, 2, 10, 4)
    o1, l1 = torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(shape[:3], generator=g, dtype=torch.float64)
    st = RunningState(shape, torch.float64, torch.float64, "cpu")
    st.absorb(0, 10, o1, l1)
    assert st.o is o1
    o2, l2 = torch.randn(1, 2, 4, 4, generator=g, dtype=torch.float64), torch.randn(1, 2, 4, generator=g, dtype=torch.float64)
    want = merge_states_torch(o1[:, :, 3:7].clone(), l1[:, :, 3:7].clone(), o2, l2)
    st.absorb(3, 7, o2, l2)
    o, lse = st.result()
    assert torch.allclose(o[:, :, 3:7], want[0]) and torch.allclose(lse[:, :, 3:7], want[1])
    st = RunningState(shape, torch.float64, torch.float64, "cpu")
    st.absorb(2, 6, o2, l2)
    o, lse = st.result()
    assert torch.equal(o[:, :, 2:6], o2) and torch.all(o[:, :, 6:] == 0) and torch.all(lse[:, :, :2] == float("-inf"))
    q16 = torch.zeros(1, 1, 1, 1, dtype=torch.bfloat16)
    assert state_dtype_for(q16, 2) == torch.bfloat16 and state_dtype_for(q16, 64) == torch.float32
    assert state_dtype_for(q16.float(), 2) == torch.float32
    assert state_dtype_for(q16.double(), 2) == torch.float64
    with pytest.raises(TypeError, match="state_dtype"):
        state_dtype_for(q16, 2, torch.int32)
