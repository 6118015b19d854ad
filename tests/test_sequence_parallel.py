"""Ulysses, the Ulysses x ring hybrid and all-gather context parallelism on gloo CPU ranks, against the
single-process float64 oracle (outputs, lse and gradients; GQA with split and with replicated kv heads;
causal with Nq != Nk and rows that see no key; ragged lengths).

Each world size is spawned once for all its cases (as the ring's tests), fresh seeds every run.
"""
import os

import numpy as np

import pytest
import torch

from reference.distributed import layout as L
from reference.distributed.comm_model import comm_bytes
from reference.distributed.demo import case_inputs, sp_cases_rank
from reference.distributed.launch import run_ranks
from reference.distributed.ulysses import head_split

from .common import run_smoke
from .oracle import allowed_mask, attention_grads, attention_ref, lse_err, rel_err

pytestmark = pytest.mark.ring_attention
RANK_TIMEOUT = 120

# name: (scheme, ulysses size or None, causal, layout, nq, nk, hq, hkv, extra); world-dependent sizes below
CASES = {
    "ulysses_full_ragged_mha": ("ulysses", None, False, "contiguous", 13, 13, 4, 4, {}),
    "ulysses_causal_gqa_split": ("ulysses", None, True, "contiguous", 11, 11, 8, 4, {"autograd": True}),
    "ulysses_causal_gqa_replicated": ("ulysses", None, True, "contiguous", 10, 10, 4, 1, {}),
    "ulysses_causal_nq_gt_nk_masked": ("ulysses", None, True, "contiguous", 9, 5, 4, 2, {"autograd": True}),
    "ulysses_numpy_step": ("ulysses", None, True, "contiguous", 9, 9, 4, 2, {"step": "numpy"}),
    "ulysses_float32": ("ulysses", None, True, "contiguous", 12, 12, 4, 4, {"dtype": "float32", "B": 2}),
    "hybrid_causal_zigzag_gqa": ("hybrid", 2, True, "zigzag", 15, 15, 4, 2, {"autograd": True}),
    "hybrid_full_cross_lengths": ("hybrid", 2, False, "contiguous", 7, 12, 4, 1, {}),
    "hybrid_causal_nq_lt_nk": ("hybrid", 2, True, "zigzag", 6, 11, 4, 4, {}),
    "ring_via_hybrid": ("hybrid", 1, True, "zigzag", 13, 13, 2, 1, {}),
    "allgather_causal_zigzag_gqa": ("allgather", None, True, "zigzag", 13, 13, 4, 2, {}),
    "allgather_full_cross_lengths": ("allgather", None, False, "contiguous", 5, 9, 2, 1, {}),
    "allgather_causal_nq_gt_nk": ("allgather", None, True, "zigzag", 11, 6, 2, 2, {}),
}


def _cases(world, seed):
    out = []
    for i, (name, (scheme, uly, causal, layout, nq, nk, hq, hkv, extra)) in enumerate(CASES.items()):
        if scheme == "ulysses":   # heads must split over the world: scale them with it
            hq, hkv = hq * world // 2, hkv * world // 2 if "replicated" not in name else hkv
        if scheme == "hybrid" and world % uly:
            continue
        out.append({"name": name, "seed": seed + i, "scheme": scheme, "ulysses": uly, "causal": causal,
                    "layout": layout, "nq": nq, "nk": nk, "hq": hq, "hkv": hkv, **extra})
    return out


def _unshard(case, parts, world):
    if case["scheme"] == "allgather":
        return L.unshard(parts, case["layout"])
    a = world if case["scheme"] == "ulysses" else case["ulysses"]
    lay = "contiguous" if case["scheme"] == "ulysses" else case["layout"]
    return L.hybrid_unshard(parts, a, world // a, lay)


def _check(case, per_rank, world):
    q, k, v, do = case_inputs(case)
    o_ref, lse_ref, _ = attention_ref(q, k, v, causal=case["causal"])
    grads_ref = attention_grads(q, k, v, do, causal=case["causal"])
    got = {key: _unshard(case, [p[key] for p in per_rank], world) for key in ("o", "dq", "dk", "dv")}
    lse = _unshard(case, [p["lse"].unsqueeze(-1) for p in per_rank], world).squeeze(-1)
    tol = 1e-5 if case.get("dtype") == "float32" else 1e-12
    errs = {"o": rel_err(got["o"], o_ref), "lse": lse_err(lse, lse_ref)}
    errs.update({key: rel_err(got[key], ref) for key, ref in zip(("dq", "dk", "dv"), grads_ref)})
    bad = [f"{case['name']}: {key} error {e:.3g} > {tol}" for key, e in errs.items() if not e < tol]
    if case["causal"]:
        empty = ~allowed_mask(case["nq"], case["nk"]).any(dim=1)
        if not (torch.all(got["o"][..., empty, :] == 0) and torch.all(lse[..., empty] == float("-inf"))):
            bad.append(f"{case['name']}: rows that see no key must give o = 0 and lse = -inf exactly")
    if not all(p["stats"]["a2a_s"] >= 0 and p["stats"]["attn_s"] > 0 for p in per_rank):
        bad.append(f"{case['name']}: stats must time the all-to-alls and the attention")
    return bad


@pytest.mark.parametrize("world", [2, 4])
def test_sequence_parallel_matches_single_process_oracle(world):
    seed = int.from_bytes(os.urandom(4), "little")
    cases = _cases(world, seed)
    results = run_ranks(sp_cases_rank, world, (cases,), timeout=RANK_TIMEOUT)
    bad = [m for i, case in enumerate(cases) for m in _check(case, [r[i] for r in results], world)]
    assert not bad, f"world={world} seed={seed}:\n" + "\n".join(bad)


def test_head_split_gqa_split_and_replicated():
    assert head_split(8, 4, 2) == [(0, 4, 0, 2), (4, 8, 2, 4)]
    assert head_split(8, 2, 4) == [(0, 2, 0, 1), (2, 4, 0, 1), (4, 6, 1, 2), (6, 8, 1, 2)]   # kv replicated
    for hq, hkv, w in ((32, 8, 8), (32, 8, 4), (32, 8, 2), (16, 16, 8), (8, 1, 8)):
        for lo, hi, kv_lo, kv_hi in head_split(hq, hkv, w):   # every query head reads its own kv head
            g = hq // hkv
            assert all(kv_lo <= h // g < kv_hi for h in range(lo, hi))
            assert (hi - lo) // max(kv_hi - kv_lo, 1) in (g, hi - lo)


@pytest.mark.parametrize("args, match", [((6, 2, 4), "multiple of the Ulysses size"), ((6, 4, 2), "multiple of kv"),
                                          ((12, 4, 6), "divide or be divided"), ((0, 1, 1), "hq")])
def test_head_split_rejects_what_does_not_split(args, match):
    with pytest.raises(ValueError, match=match):
        head_split(*args)


@pytest.mark.parametrize("n, a, b, layout", [(37, 2, 2, "zigzag"), (10, 4, 1, "zigzag"), (9, 1, 3, "contiguous"),
                                             (5, 2, 3, "zigzag"), (3, 4, 1, "contiguous")])
def test_hybrid_layout_round_trips_and_reduces_to_ring_and_ulysses(n, a, b, layout):
    x = torch.randn(1, 2, n, 3)
    parts = [L.hybrid_shard(x, r, a, b, layout) for r in range(a * b)]
    assert torch.equal(L.hybrid_unshard(parts, a, b, layout), x)
    assert sum(p.shape[2] for p in parts) == n
    assert L.hybrid_segments(n, 1, b, layout) == L.rank_segments(n, b, layout)
    flat = [seg for r in L.hybrid_segments(n, a * b, 1, layout) for seg in r]
    assert flat == [s for s in L.chunk_bounds(n, a * b) if s[1] > s[0]]   # ring = 1: contiguous cuts


def test_ulysses_bytes_model_matches_what_the_all_to_alls_send():
    """The forward's all-to-alls of Q, K, V and O move (W-1)/W of each rank's tensors (comm_model's formula)."""
    n, w, hq, hkv, d = 64, 4, 8, 4, 16
    c = n // w
    per_rank = sum(((hi - lo) * c * d) for lo, hi, _, _ in head_split(hq, hkv, w)[1:])   # q heads sent away
    sent = 2 * per_rank                                            # q in, o out
    sent += 2 * sum((kh - kl) * c * d for _, _, kl, kh in head_split(hq, hkv, w)[1:])   # k, v
    assert sent * 2 == comm_bytes("ulysses", n, w, hq, hkv, d)  # bf16: 2 bytes a number


def test_benchmark_smoke_sends_what_the_byte_model_says(tmp_path):
    """The benchmark's CPU smoke run (gloo, 4 ranks): every scheme checked against one device, and the bytes
    each rank sent equal ``comm_model``'s formula (plus, in the forward of the all-to-all schemes, the fp32 lse
    that travels back with ``o``, which the model leaves out as 1/d of it)."""
    data = run_smoke("benchmarks.course.bench_sequence_parallel", tmp_path, "smoke-seqpar-w4.json")
    assert (tmp_path / "smoke-seqpar-w4.png").exists()
    assert {c["scheme"] for c in data["checks"]} == {"ring", "allgather", "ulysses", "hybrid_u2"}
    assert all(c["rel_err"] < 1e-5 for c in data["checks"])
    shape, world = data["meta"]["shape"], data["meta"]["world"]
    for r in data["rows"]:
        extra = 0
        if r["pass"] == "forward" and r["ulysses"] >= 2:
            a, c = r["ulysses"], r["n"] // world
            extra = (a - 1) * c * (shape["hq"] // a) * 4
        assert r["bytes_sent"] == r["bytes_model"] + extra, r


def _a6_namespace():
    """The a6 solution's cells (graded functions and given helpers) and its Part 3 ``run_real_ring``."""
    from autograder.percent import parse_percent
    from pathlib import Path
    src = (Path(__file__).resolve().parents[1] / "assignments/a6_ring/a6_ring_solution.py").read_text()
    ns = {}
    for c in parse_percent(src, "a6_ring_solution.py"):
        if c.kind != "code" or "check" in c.tags:
            continue
        if "def run_real_ring" in c.source:
            exec(c.source.split("\n\ntry:")[0], ns)   # the definition, not the demo run
        elif "skip" not in c.tags:
            exec(c.source, ns)
    return ns


@pytest.mark.parametrize("world, layout", [(2, "zigzag"), (3, "contiguous"), (3, "zigzag")])
def test_a6_real_ring_runs_the_students_step_across_processes(world, layout):
    """a6 Part 3: the solution's ring_step on ``world`` gloo processes equals full attention; a step that
    forgets to merge (keeps only the last chunk) is caught by the same run."""
    ns = _a6_namespace()
    n = 17 + world
    assert ns["run_real_ring"](ns["ring_step"], world=world, n=n, layout=layout, timeout=60) < 1e-12

    def last_chunk_only(o, lse, q, k, v, q_pos, k_pos, causal=True, scale=None):
        return ns["ring_step"](np.zeros_like(o), np.full_like(lse, -np.inf), q, k, v, q_pos, k_pos, causal, scale)

    assert ns["run_real_ring"](last_chunk_only, world=world, n=n, layout=layout, timeout=60) > 1e-3
