"""Which sequence positions each rank holds (the sequence is split along its length, "context parallelism").

Two layouts of a length-``n`` sequence over ``world`` ranks:

* ``"contiguous"``: cut into ``world`` chunks; rank ``r`` holds chunk ``r``. Under a causal mask rank ``r``'s
  queries see the keys of ranks ``0..r`` only, so the last rank does ``world`` times the first rank's work.
* ``"zigzag"``: cut into ``2 * world`` chunks; rank ``r`` holds chunks ``r`` and ``2 * world - 1 - r`` (an early
  chunk and its mirror image from the end), so every rank holds the same share of the causal triangle.

Chunks follow ``numpy.array_split``: when ``n`` is not a multiple of the chunk count the first ``n % count``
chunks are one longer (a ragged length; chunks may even be empty when ``n`` is small). A rank's local tensor is
its chunks concatenated in increasing position order. Every rank can compute every other rank's segments from
``n`` and ``world`` alone, which is what lets a receiver allocate a buffer of the right size.
"""
from __future__ import annotations

import numbers

import torch

LAYOUTS = ("contiguous", "zigzag")


def _check_count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def chunk_bounds(n: int, count: int) -> list[tuple[int, int]]:
    """``count`` consecutive ``(start, stop)`` ranges covering ``[0, n)``; the first ``n % count`` are one longer."""
    n = _check_count(n, "n", 0)
    count = _check_count(count, "count", 1)
    base, extra = divmod(n, count)
    out, start = [], 0
    for c in range(count):
        stop = start + base + (1 if c < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def rank_segments(n: int, world: int, layout: str = "zigzag") -> list[list[tuple[int, int]]]:
    """For each rank, its ``(start, stop)`` global position ranges, in increasing order (module docstring)."""
    world = _check_count(world, "world", 1)
    layout = check_layout(layout)
    if layout == "contiguous":
        return [[b] for b in chunk_bounds(n, world)]
    chunks = chunk_bounds(n, 2 * world)
    return [[chunks[r], chunks[2 * world - 1 - r]] for r in range(world)]


def local_length(segments) -> int:
    return sum(stop - start for start, stop in segments)


def shard(x: torch.Tensor, rank: int, world: int, layout: str = "zigzag", dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s part of ``x`` along ``dim`` (the sequence axis): its segments concatenated."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    rank = _check_count(rank, "rank", 0)
    segs = rank_segments(x.shape[dim], world, layout)
    if rank >= len(segs):
        raise ValueError(f"rank must be < world = {len(segs)}, got {rank}")
    return torch.cat([x.narrow(dim, a, b - a) for a, b in segs[rank]], dim=dim)


def unshard(parts, layout: str = "zigzag", dim: int = -2) -> torch.Tensor:
    """Inverse of :func:`shard`: the full tensor from every rank's part (``parts[r]`` from rank ``r``)."""
    if not isinstance(parts, (list, tuple)) or not parts:
        raise TypeError("parts must be a non-empty list of tensors, one per rank")
    world = len(parts)
    n = sum(p.shape[dim] for p in parts)
    segs = rank_segments(n, world, layout)
    pieces = []
    for r, p in enumerate(parts):
        if p.shape[dim] != local_length(segs[r]):
            raise ValueError(f"parts[{r}] has length {p.shape[dim]} along dim {dim}, expected "
                             f"{local_length(segs[r])} for n = {n} over {world} ranks ({layout})")
        off = 0
        for a, b in segs[r]:
            pieces.append((a, p.narrow(dim, off, b - a)))
            off += b - a
    return torch.cat([t for _, t in sorted(pieces, key=lambda e: e[0])], dim=dim)
