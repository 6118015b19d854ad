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
