"""Rank programs for ``run_ranks``: build a case's inputs from a seed on every rank, shard them, run ring
attention forward and backward, return this rank's results (used by the tests and the lecture)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .layout import shard
from .ring_attention import ring_attention, ring_attention_backward, ring_attention_forward

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def case_inputs(case: dict):
    """Full ``q, k, v, do`` of a case, identical in every process (seeded CPU generator)."""
    g = torch.Generator().manual_seed(case["seed"])
    dt = DTYPES[case.get("dtype", "float64")]
    B, d = case.get("B", 1), case.get("d", 16)

    def randn(h, n):
        return torch.randn(B, h, n, d, generator=g, dtype=torch.float64).to(dt)

    return randn(case["hq"], case["nq"]), randn(case["hkv"], case["nk"]), randn(case["hkv"], case["nk"]), \
        randn(case["hq"], case["nq"])


def ring_cases_rank(rank: int, world: int, cases: list) -> list:
    """For each case: this rank's ``o, lse, dq, dk, dv`` and per-step forward timings (``stats``).

    A case with ``"subgroup": True`` runs on a process group of the ranks ``1 .. world-1`` (all of them when
    ``world == 2``); ranks outside it return ``None`` for that case.
    """
    out = []
    for case in cases:
        layout, causal, step = case["layout"], case["causal"], case.get("step", "torch")
        group, members = None, list(range(world))
        if case.get("subgroup"):
            members = members[1:] if world > 2 else members
            group = dist.new_group(members)          # collective: every rank calls it
            if rank not in members:
                out.append(None)
                continue
        g_rank, g_world = members.index(rank), len(members)
        q, k, v, do = (shard(x, g_rank, g_world, layout) for x in case_inputs(case))
        stats = {}
        o, lse = ring_attention_forward(q, k, v, causal, None, layout, step, group=group, stats=stats)
        if case.get("autograd"):   # through torch.autograd (RingAttentionFunction)
            leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
            ring_attention(*leaves, causal=causal, layout=layout, step=step, group=group).backward(do)
            dq, dk, dv = (x.grad for x in leaves)
        else:
            dq, dk, dv = ring_attention_backward(q, k, v, o, lse, do, causal, None, layout, step, group=group)
        out.append({"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv, "compute_s": stats["compute_s"],
                    "compute_cpu_s": stats.get("compute_cpu_s"), "wait_s": stats["wait_s"]})
    return out


def sp_cases_rank(rank: int, world: int, cases: list) -> list:
    """For each case: this rank's ``o, lse, dq, dk, dv`` under ``case["scheme"]``: ``"ulysses"`` (every rank
    one group), ``"hybrid"`` (groups of ``case["ulysses"]`` ranks, ring across them) or ``"allgather"``.
    ``case["autograd"]``: gradients through the autograd Function instead of the functional backward."""
    from .layout import hybrid_shard
    from .ulysses import (allgather_attention_backward, allgather_attention_forward, hybrid_attention,
                          hybrid_attention_backward, hybrid_attention_forward, hybrid_groups, ulysses_attention,
                          ulysses_attention_backward, ulysses_attention_forward)
    out = []
    for case in cases:
        scheme, causal, layout = case["scheme"], case["causal"], case.get("layout", "zigzag")
        step = case.get("step", "torch")
        full = case_inputs(case)
        stats = {}
        if scheme == "allgather":
            q, k, v, do = (shard(x, rank, world, layout) for x in full)
            o, lse = allgather_attention_forward(q, k, v, causal, None, layout, step, stats=stats)
            grads = allgather_attention_backward(q, k, v, o, lse, do, causal, None, layout, step)
        elif scheme == "ulysses":
            q, k, v, do = (hybrid_shard(x, rank, world, 1) for x in full)
            o, lse = ulysses_attention_forward(q, k, v, causal, None, step, stats=stats)
            if case.get("autograd"):
                leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
                ulysses_attention(*leaves, causal=causal, step=step).backward(do)
                grads = tuple(x.grad for x in leaves)
            else:
                grads = ulysses_attention_backward(q, k, v, o, lse, do, causal, None, step)
        elif scheme == "hybrid":
            a = case["ulysses"]
            groups = hybrid_groups(a)
            q, k, v, do = (hybrid_shard(x, groups.index, a, world // a, layout) for x in full)
            o, lse = hybrid_attention_forward(q, k, v, groups, causal, None, layout, step, stats=stats)
            if case.get("autograd"):
                leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
                hybrid_attention(*leaves, groups, causal=causal, layout=layout, step=step).backward(do)
                grads = tuple(x.grad for x in leaves)
            else:
                grads = hybrid_attention_backward(q, k, v, o, lse, do, groups, causal, None, layout, step)
        else:
            raise ValueError(f"scheme must be 'ulysses', 'hybrid' or 'allgather', got {scheme!r}")
        dq, dk, dv = grads
        out.append({"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv, "stats": stats})
    return out
