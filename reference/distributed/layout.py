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


# ----------------------------------------------------------------------------------------------------------
# the hybrid of Ulysses and the ring: ``ring`` groups of ``ulysses`` ranks
# ----------------------------------------------------------------------------------------------------------
def _cut_segments(segs, lo: int, hi: int) -> list[tuple[int, int]]:
    """The global ranges of local indices ``[lo, hi)`` of a tensor made of ``segs`` concatenated."""
    out, off = [], 0
    for a, b in segs:
        n = b - a
        s, e = max(lo - off, 0), min(hi - off, n)
        if e > s:
            if out and out[-1][1] == a + s:   # adjacent ranges (ring=1 zig-zag chunks) join into one
                out[-1] = (out[-1][0], a + e)
            else:
                out.append((a + s, a + e))
        off += n
    return out


def hybrid_segments(n: int, ulysses: int, ring: int, layout: str = "zigzag") -> list[list[tuple[int, int]]]:
    """Global position ranges of every rank of ``ring`` groups of ``ulysses`` ranks (rank = g * ulysses + u).

    Group ``g`` holds the ring's share ``rank_segments(n, ring, layout)[g]`` (zig-zag balances the causal ring
    across groups); inside the group, member ``u`` holds the ``u``-th of ``ulysses`` contiguous cuts of that
    share (``chunk_bounds`` of its length). So the group's members, concatenated in order, are the group's
    share in the order the ring expects. ``ulysses=1`` is the ring's layout; ``ring=1`` Ulysses' (contiguous).
    """
    ulysses = _check_count(ulysses, "ulysses", 1)
    if ulysses == 1:
        return rank_segments(n, ring, layout)
    out = []
    for share in rank_segments(n, ring, layout):
        for lo, hi in chunk_bounds(local_length(share), ulysses):
            out.append(_cut_segments(share, lo, hi))
    return out


def take_segments(x: torch.Tensor, segs, dim: int = -2) -> torch.Tensor:
    """The positions ``segs`` of ``x`` along ``dim``, concatenated (a rank's shard for any layout)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    pieces = [x.narrow(dim, a, b - a) for a, b in segs]
    return torch.cat(pieces, dim=dim) if pieces else x.narrow(dim, 0, 0)


def hybrid_shard(x: torch.Tensor, rank: int, ulysses: int, ring: int, layout: str = "zigzag",
                 dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s part of ``x`` in the hybrid layout (:func:`hybrid_segments`)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    segs = hybrid_segments(x.shape[dim], ulysses, ring, layout)
    rank = _check_count(rank, "rank", 0)
    if rank >= len(segs):
        raise ValueError(f"rank must be < ulysses * ring = {len(segs)}, got {rank}")
    return take_segments(x, segs[rank], dim)


def hybrid_unshard(parts, ulysses: int, ring: int, layout: str = "zigzag", dim: int = -2) -> torch.Tensor:
    """Inverse of :func:`hybrid_shard`: the full tensor from every rank's part."""
    if not isinstance(parts, (list, tuple)) or not parts:
        raise TypeError("parts must be a non-empty list of tensors, one per rank")
    if len(parts) != ulysses * ring:
        raise ValueError(f"expected {ulysses * ring} parts (ulysses * ring), got {len(parts)}")
    n = sum(p.shape[dim] for p in parts)
    pieces = []
    for r, (p, segs) in enumerate(zip(parts, hybrid_segments(n, ulysses, ring, layout))):
        if p.shape[dim] != local_length(segs):
            raise ValueError(f"parts[{r}] has length {p.shape[dim]} along dim {dim}, expected {local_length(segs)}")
        off = 0
        for a, b in segs:
            pieces.append((a, p.narrow(dim, off, b - a)))
            off += b - a
    return torch.cat([t for _, t in sorted(pieces, key=lambda e: e[0])], dim=dim)
