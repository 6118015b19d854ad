"""How much work each rank does at each ring step, and what the slowest rank costs.

At step ``s`` rank ``r`` holds the K/V chunk of rank ``(r - s) mod world`` and attends its own queries to it.
The ring is synchronous (a rank cannot start step ``s + 1`` before the chunk arrives), so a step lasts as long
as its busiest rank: ``time = sum_s max_r work[r, s]``. With perfect balance it would be
``sum_{r,s} work[r, s] / world``; their ratio is the efficiency.

Causal with the contiguous layout: at step ``s`` rank ``r`` sees a full block when ``s <= r`` (and ``s > 0``),
nothing when ``s > r``; the last rank is busy at every step while rank 0 idles after step 0: time
``W - 1/2`` blocks against an ideal of ``W/2``, efficiency ``W / (2W - 1)`` (2/3 for two ranks, -> 1/2). The zig-zag layout gives every rank the same work at every step (to within
one row when the length is ragged).
"""
from __future__ import annotations

import numpy as np

from .layout import rank_segments
from .local_step import visible_pairs


def ring_work(nq: int, nk: int, world: int, layout: str = "zigzag", causal: bool = True) -> np.ndarray:
    """``(world, world)`` int64 array: ``work[r, s]`` = (query, key) pairs rank ``r`` scores at step ``s``."""
    q_segs = rank_segments(nq, world, layout)
    k_segs = rank_segments(nk, world, layout)
    work = np.zeros((world, world), dtype=np.int64)
    for r in range(world):
        for s in range(world):
            src = (r - s) % world
            for qs, qe in q_segs[r]:
                for ks, ke in k_segs[src]:
                    work[r, s] += visible_pairs(qe - qs, ke - ks, qs + (nk - nq) - ks, causal)
    return work


def ring_balance(work) -> dict:
    """Summary of a work matrix: busiest-rank time per step, total, ideal (perfect balance), efficiency."""
    work = np.asarray(work)
    if work.ndim != 2 or work.shape[0] != work.shape[1]:
        raise ValueError(f"work must be a square (world, world) array, got shape {work.shape}")
    per_step = work.max(axis=0)
    total = int(per_step.sum())
    ideal = float(work.sum()) / work.shape[0]
    return {"per_step_max": per_step.tolist(), "per_rank_total": work.sum(axis=1).tolist(), "time": total,
            "ideal": ideal, "efficiency": ideal / total if total else 1.0}
