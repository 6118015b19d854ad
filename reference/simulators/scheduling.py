"""Load balancing causal attention: LPT scheduling of work tiles.

One of the simulations of Tri Dao's FlashAttention-3 talk ("Optimizing Attention for Modern Hardware") that
``reference.simulators`` holds. Nothing here runs on a GPU: each function turns one slide into arithmetic or a
simulation that can be checked.

* Load balancing for causal attention (slides 26-45): ``causal_tiles`` builds the work tiles of a causal
  attention forward (query block ``i`` of a head visits ``i + 1`` key blocks), ``schedule`` runs ``W`` workers
  (SMs of a persistent kernel) over a tile order, each next tile going to the worker that frees up first, as the
  hardware block scheduler does. ``order="naive"`` walks tiles in launch order; ``order="lpt"`` sorts them
  longest-processing-time-first (Graham, 1969). The talk's example, 2 batches x 4 query blocks on 3 workers,
  gives per-worker work ``[9, 5, 6]`` naive and ``[7, 7, 6]`` LPT. ``kv_traffic`` counts the K/V bytes an order
  reads from HBM through the L2 cache (head-major vs head-minor tile order).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._args import check_flag, check_nonneg_real, check_positive_int

__all__ = ["tile_visits", "Tile", "Schedule", "causal_tiles", "order_tiles", "schedule", "makespan_lower_bound",
           "kv_traffic"]


def tile_visits(nq, nk, block_q, block_k, causal=False):
    """Order in which FA2 Algorithm 1 visits the ``(T_r, T_c)`` tiles of S; 0 marks a tile that is skipped.

    Outer loop over query blocks ``i`` (line 3), inner over key blocks ``j`` (line 6). With the bottom-right
    causal mask (query ``r`` sees key ``c`` iff ``c <= r + nk - nq``) a tile whose first key lies beyond its last
    query's horizon is never loaded or computed. Returns an int array, visits numbered from 1.
    """
    nq, nk, block_q, block_k = (check_positive_int(nq, "nq"), check_positive_int(nk, "nk"), check_positive_int(block_q, "block_q"),
                                check_positive_int(block_k, "block_k"))
    causal = check_flag(causal, "causal")
    t_r, t_c = -(-nq // block_q), -(-nk // block_k)
    out = np.zeros((t_r, t_c), dtype=np.int64)
    step = 0
    for i in range(t_r):
        last_row = min(nq, (i + 1) * block_q) - 1
        for j in range(t_c):
            if causal and j * block_k > last_row + nk - nq:
                continue
            step += 1
            out[i, j] = step
    return out


@dataclass(frozen=True)
class Tile:
    """One work tile: query block ``q_block`` of head ``head`` of batch ``batch``; ``cost`` in key-block units."""
    batch: int
    head: int
    q_block: int
    cost: int


@dataclass
class Schedule:
    """Result of ``schedule``: per-worker total work, finish time, and the (start, end, tile) timeline."""
    n_workers: int
    loads: list
    timeline: list = field(repr=False)

    @property
    def makespan(self) -> int:
        return max(self.loads) if self.loads else 0

    @property
    def efficiency(self) -> float:
        """Busy fraction of all workers until the last one finishes: sum(work) / (W * makespan)."""
        return sum(self.loads) / (self.n_workers * self.makespan) if self.makespan else 1.0


def causal_tiles(n_batches, n_q_blocks, n_heads=1, n_k_blocks=None):
    """Tiles of a causal attention forward in launch order (batch, head, query block ascending).

    With ``N`` split into blocks of equal size, query block ``i`` (0-based) attends key blocks ``0..i`` under the
    causal mask (FA2 Algorithm 1 with the fully masked tiles skipped), so its cost is ``i + 1`` key blocks.
    ``n_k_blocks > n_q_blocks`` models the bottom-right mask with more keys than queries: block ``i`` then
    costs ``i + 1 + (n_k_blocks - n_q_blocks)``.
    """
    n_batches, n_q_blocks, n_heads = (check_positive_int(n_batches, "n_batches"), check_positive_int(n_q_blocks, "n_q_blocks"),
                                      check_positive_int(n_heads, "n_heads"))
    n_k_blocks = n_q_blocks if n_k_blocks is None else check_positive_int(n_k_blocks, "n_k_blocks")
    if n_k_blocks < n_q_blocks:
        raise ValueError(f"n_k_blocks must be >= n_q_blocks ({n_q_blocks}), got {n_k_blocks}")
    off = n_k_blocks - n_q_blocks
    return [Tile(b, h, i, i + 1 + off) for b in range(n_batches) for h in range(n_heads) for i in range(n_q_blocks)]


def order_tiles(tiles, order="naive", heads_per_group=None):
    """``tiles`` as a list in the order a scheduler takes them: "naive" as given, "lpt" cost descending (ties
    keep the given order). ``reference.triton.hopper.flash_persistent`` feeds its persistent kernel in this order.

    ``heads_per_group`` (with "lpt"): sort longest-first only inside groups of that many consecutive
    (batch, head) pairs, group after group, so the tiles running at one time share the K/V of a few heads
    (the talk's caveat: a global LPT order spreads them over all heads and can spill the L2 cache).
    """
    tiles = list(tiles)
    if not all(isinstance(t, Tile) for t in tiles):
        raise TypeError("tiles must be a sequence of reference.simulators.scheduling.Tile")
    if order == "lpt":
        if heads_per_group is None:
            return sorted(tiles, key=lambda t: -t.cost)  # stable: ties keep launch order
        g = check_positive_int(heads_per_group, "heads_per_group")
        index: dict = {}
        for t in tiles:
            index.setdefault((t.batch, t.head), len(index))
        return sorted(tiles, key=lambda t: (index[(t.batch, t.head)] // g, -t.cost))
    if order != "naive":
        raise ValueError(f"order must be 'naive' or 'lpt', got {order!r}")
    return tiles


def schedule(tiles, n_workers, order="naive"):
    """Greedy list scheduling of ``tiles`` on ``n_workers`` identical workers.

    Tiles are taken in ``order`` ("naive": as given; "lpt": cost descending, ties in given order) and each goes
    to the worker that becomes free first (lowest index among ties): the dynamic behaviour of the GPU block
    scheduler, and of a persistent kernel's tile counter. Returns a ``Schedule``.
    """
    n_workers = check_positive_int(n_workers, "n_workers")
    tiles = order_tiles(tiles, order)
    free_at = [0] * n_workers
    timeline = [[] for _ in range(n_workers)]
    for t in tiles:
        w = min(range(n_workers), key=lambda i: (free_at[i], i))
        timeline[w].append((free_at[w], free_at[w] + t.cost, t))
        free_at[w] += t.cost
    return Schedule(n_workers, free_at, timeline)


def makespan_lower_bound(tiles, n_workers) -> int:
    """No schedule finishes before ``max(longest tile, ceil(total work / W))``."""
    n_workers = check_positive_int(n_workers, "n_workers")
    costs = [t.cost for t in tiles]
    return max(max(costs, default=0), -(-sum(costs) // n_workers))


def kv_traffic(tiles, n_sms, l2_bytes, kv_bytes):
    """K/V bytes read from HBM when ``tiles`` run in this order, ``n_sms`` at a time, over an L2 cache.

    A deliberately coarse model of the order lesson of the Gluon forward (notes/hopper.md section 1c): tiles run
    in waves of ``n_sms`` consecutive ones; every tile streams the whole K/V of its (batch, head), ``kv_bytes``;
    the tiles of one head in the same wave share one read; the L2 keeps whole heads' K/V, ``l2_bytes`` in all,
    least recently used out. Returns ``(hbm_bytes, ratio)``, ``ratio`` = ``hbm_bytes`` over reading each head's
    K/V once. Head-major order (a head's query blocks side by side) reads each head about once; head-minor order
    (one query block of every head, then the next block) re-reads every head once per query block when the heads
    do not all fit in L2.
    """
    from collections import OrderedDict
    tiles = list(tiles)
    if not all(isinstance(t, Tile) for t in tiles):
        raise TypeError("tiles must be a sequence of reference.simulators.scheduling.Tile")
    n_sms = check_positive_int(n_sms, "n_sms")
    l2, kv = check_nonneg_real(l2_bytes, "l2_bytes"), check_nonneg_real(kv_bytes, "kv_bytes")
    if kv == 0:
        raise ValueError("kv_bytes must be > 0")
    capacity = int(l2 // kv)  # whole heads that fit
    cache: OrderedDict = OrderedDict()
    reads = 0
    for w in range(0, len(tiles), n_sms):
        for head in dict.fromkeys((t.batch, t.head) for t in tiles[w:w + n_sms]):  # first-appearance order
            if head in cache:
                cache.move_to_end(head)
                continue
            reads += 1
            cache[head] = True
            while len(cache) > capacity:
                cache.popitem(last=False)
    heads = len({(t.batch, t.head) for t in tiles})
    return reads * kv, (reads / heads if heads else 0.0)
