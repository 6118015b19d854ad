"""PagedAttention in NumPy: a block allocator, a paged KV cache with copy-on-write fork, and paged attention.

vLLM (Kwon et al., SOSP 2023; the seeds' "Application-level memory paging and virtualization for KV cache")
stores the KV cache in fixed-size *blocks* of ``block_size`` tokens. A sequence owns a *block table*: the list
of physical block indices holding its tokens 0..T-1 in order. Memory waste is then at most one partly filled
block per sequence (no reservation for the maximum length, no external fragmentation), and sequences that share
a prefix (parallel sampling, beam search) share its blocks, counted by reference counts and copied on write.

Attention reads K/V through the block table: "1. Fetch non-contiguous KV blocks using the block table,
2. Apply attention on the fly". Because attention over a union of key sets is a merge of attention over the
parts (:mod:`reference.numpy.merge`), the order and placement of blocks in memory does not matter.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ._validate import as_float_array, check_float_dtype, check_positive_int, check_scale, compute_dtype
from ._validate import check_block_tables, check_paged_caches, check_seq_lens  # noqa: F401  (public here too)

__all__ = ["OutOfBlocksError", "UnknownSequenceError", "BlockAllocator", "PagedKVCache", "paged_attention", "check_block_tables"]


class OutOfBlocksError(RuntimeError):
    """Not enough free blocks. ``requested`` and ``free`` say how many were asked for and how many were free."""

    def __init__(self, requested: int, free: int, what: str = ""):
        self.requested, self.free = requested, free
        extra = f" ({what})" if what else ""
        super().__init__(f"out of KV cache blocks: {requested} requested, {free} free{extra}")


class UnknownSequenceError(KeyError, ValueError):
    """A sequence id that the cache does not hold (a KeyError, and a ValueError as docs/design.md §3 asks of bad
    input)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _check_index(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer block index, got {value!r}")
    return int(value)


class BlockAllocator:
    """Hands out physical block indices ``0..num_blocks-1`` from a free list, with reference counts.

    A block is free iff its reference count is 0. ``allocate`` sets the count to 1, ``incref`` adds an owner
    (a forked sequence sharing the block), ``free`` drops one owner and returns the block to the free list when
    the last owner is gone. Freeing a free block (double free), an index out of range, or allocating with no
    free block raises.
    """

    def __init__(self, num_blocks):
        self.num_blocks = check_positive_int(num_blocks, "num_blocks")
        self._ref = np.zeros(self.num_blocks, dtype=np.int64)
        # A stack: allocate() pops from the end, so a fresh allocator hands out 0, 1, 2, ...
        self._free = list(range(self.num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def _check(self, block, name: str = "block") -> int:
        block = _check_index(block, name)
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"{name} must be in [0, {self.num_blocks}), got {block}")
        return block

    def allocate(self) -> int:
        """Take one free block (reference count 1)."""
        return self.allocate_many(1)[0]

    def allocate_many(self, n) -> list:
        """Take ``n`` free blocks at once, or none: raises :class:`OutOfBlocksError` if fewer than ``n`` are free."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        if n > len(self._free):
            raise OutOfBlocksError(int(n), len(self._free))
        blocks = [self._free.pop() for _ in range(n)]
        self._ref[blocks] = 1
        return blocks

    def incref(self, block) -> None:
        """Add an owner to an allocated block (sharing on fork)."""
        block = self._check(block)
        if self._ref[block] == 0:
            raise ValueError(f"block {block} is free; incref needs an allocated block")
        self._ref[block] += 1

    def free(self, block) -> None:
        """Drop one owner of ``block``; at reference count 0 it returns to the free list."""
        block = self._check(block)
        if self._ref[block] == 0:
            raise ValueError(f"double free: block {block} is already free")
        self._ref[block] -= 1
        if self._ref[block] == 0:
            self._free.append(block)

    def refcount(self, block) -> int:
        """Number of owners of ``block`` (0 when free)."""
        return int(self._ref[self._check(block)])

    def free_blocks(self) -> list:
        """The free list (a copy), for inspection."""
        return list(self._free)

    def __repr__(self) -> str:
        return f"BlockAllocator(num_blocks={self.num_blocks}, num_free={self.num_free})"


class PagedKVCache:
    """A paged KV cache for many sequences (vLLM layout ``k_cache, v_cache (num_blocks, block_size, Hkv, d)``).

    Token ``t`` of a sequence lives in physical block ``block_table[t // block_size]`` at slot
    ``t % block_size``. Only the last block of a sequence can be partly filled, so the waste per sequence is
    below ``block_size`` tokens.

    Sharing: ``fork`` gives the child the parent's block table and increments every block's reference count.
    Blocks other than the last are full and never written again, so they can be shared forever; the last block
    is copied before the first write into it while it is shared (copy-on-write).

    Atomicity: ``append`` works out how many blocks it needs, takes them all from the allocator at once, and
    only then writes. If there are not enough, :class:`OutOfBlocksError` is raised and no sequence, block table,
    reference count or cached value has changed.
    """

    def __init__(self, num_blocks, block_size, n_kv_heads, head_dim, dtype=np.float32):
        self.allocator = BlockAllocator(num_blocks)
        self.num_blocks = self.allocator.num_blocks
        self.block_size = check_positive_int(block_size, "block_size")
        self.n_kv_heads = check_positive_int(n_kv_heads, "n_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.dtype = check_float_dtype(dtype)
        shape = (self.num_blocks, self.block_size, self.n_kv_heads, self.head_dim)
        self.k_cache = np.zeros(shape, dtype=self.dtype)
        self.v_cache = np.zeros(shape, dtype=self.dtype)
        self._tables: dict = {}
        self._lens: dict = {}

    # ---- sequences -------------------------------------------------------------------------------------
    def _get(self, seq_id, name: str = "seq_id"):
        try:
            return self._tables[seq_id]
        except KeyError:
            raise UnknownSequenceError(f"{name} {seq_id!r} is not a sequence in this cache") from None
        except TypeError:
            raise TypeError(f"{name} must be hashable, got {type(seq_id).__name__}") from None

    def __contains__(self, seq_id) -> bool:
        return seq_id in self._tables

    @property
    def seq_ids(self) -> list:
        return list(self._tables)

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    def _check_new(self, seq_id, name: str) -> None:
        """``seq_id`` (argument ``name``) is hashable and not registered yet."""
        try:
            exists = seq_id in self._tables
        except TypeError:
            raise TypeError(f"{name} must be hashable, got {type(seq_id).__name__}") from None
        if exists:
            raise ValueError(f"{name} {seq_id!r} already exists")

    def add_sequence(self, seq_id) -> None:
        """Register an empty sequence (no blocks until the first append)."""
        self._check_new(seq_id, "seq_id")
        self._tables[seq_id] = []
        self._lens[seq_id] = 0

    def seq_len(self, seq_id) -> int:
        self._get(seq_id)
        return self._lens[seq_id]

    def block_table(self, seq_id) -> np.ndarray:
        """The sequence's physical block indices in token order (an int32 copy)."""
        return np.array(self._get(seq_id), dtype=np.int32)

    def blocks_needed(self, seq_id, t: int) -> int:
        """Blocks that appending ``t`` tokens would take from the allocator (new blocks + a copy-on-write)."""
        table, n = self._get(seq_id), self._lens[seq_id]
        new = math.ceil((n + t) / self.block_size) - len(table)
        cow = int(t > 0 and n % self.block_size != 0 and self.allocator.refcount(table[-1]) > 1)
        return new + cow

    def append(self, seq_id, k, v) -> None:
        """Append ``T`` tokens: ``k, v (T, Hkv, d)``. Fills the last block first, then takes new blocks."""
        table = self._get(seq_id)
        k = as_float_array(k, "k")
        v = as_float_array(v, "v")
        want = ("T", self.n_kv_heads, self.head_dim)
        for name, x in (("k", k), ("v", v)):
            if x.ndim != 3 or x.shape[1:] != want[1:]:
                raise ValueError(f"{name} must have shape (T, Hkv, d) = {want}, got {x.shape}")
        if k.shape != v.shape:
            raise ValueError(f"k and v must have the same shape (T, Hkv, d), got k {k.shape} and v {v.shape}")
        t, n, bs = k.shape[0], self._lens[seq_id], self.block_size
        if t == 0:
            return
        need = self.blocks_needed(seq_id, t)
        try:
            fresh = self.allocator.allocate_many(need)      # all or nothing: nothing is written yet
        except OutOfBlocksError as exc:
            raise OutOfBlocksError(exc.requested, exc.free,
                                   f"appending {t} token(s) to sequence {seq_id!r} of length {n}") from None
        if n % bs != 0 and self.allocator.refcount(table[-1]) > 1:
            # Copy-on-write: the partly filled last block is shared with a fork; give this sequence its own copy.
            old, new = table[-1], fresh.pop(0)
            self.k_cache[new] = self.k_cache[old]
            self.v_cache[new] = self.v_cache[old]
            self.allocator.free(old)                        # drops our reference; the other owners keep it
            table[-1] = new
        table.extend(fresh)
        pos = n + np.arange(t)
        blocks = np.asarray(table, dtype=np.int64)[pos // bs]
        self.k_cache[blocks, pos % bs] = k
        self.v_cache[blocks, pos % bs] = v
        self._lens[seq_id] = n + t

    def fork(self, parent_id, child_id) -> None:
        """Create ``child_id`` sharing every block of ``parent_id`` (reference counts + 1); no data is copied."""
        parent = self._get(parent_id, "parent_id")
        self._check_new(child_id, "child_id")
        for block in parent:
            self.allocator.incref(block)
        self._tables[child_id] = list(parent)
        self._lens[child_id] = self._lens[parent_id]

    def free(self, seq_id) -> None:
        """Drop a sequence; its blocks return to the free list once no other sequence shares them."""
        table = self._get(seq_id)
        for block in table:
            self.allocator.free(block)
        del self._tables[seq_id], self._lens[seq_id]

    def gather(self, seq_id):
        """The sequence's keys and values as contiguous copies ``(T, Hkv, d)`` each."""
        table, n = self._get(seq_id), self._lens[seq_id]
        idx = np.asarray(table, dtype=np.int64)
        shape = (-1, self.n_kv_heads, self.head_dim)
        return self.k_cache[idx].reshape(shape)[:n], self.v_cache[idx].reshape(shape)[:n]

    def block_tables(self, seq_ids, max_blocks=None):
        """Batch the tables of ``seq_ids`` for :func:`paged_attention`.

        Returns ``(block_tables, seq_lens)``: ``(B, max_blocks)`` int32 padded with ``-1`` (``max_blocks``
        defaults to the longest table) and ``(B,)`` int32 lengths.
        """
        tables = [self._get(s) for s in seq_ids]
        width = max((len(t) for t in tables), default=0)
        if max_blocks is not None:
            max_blocks = _check_index(max_blocks, "max_blocks")
            if max_blocks < width:
                raise ValueError(f"max_blocks must be at least the longest block table ({width}), got {max_blocks}")
            width = max_blocks
        out = np.full((len(tables), width), -1, dtype=np.int32)
        for i, t in enumerate(tables):
            out[i, :len(t)] = t
        return out, np.array([self._lens[s] for s in seq_ids], dtype=np.int32)

    def __repr__(self) -> str:
        return (f"PagedKVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"sequences={len(self._tables)}, free_blocks={self.num_free_blocks})")


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
    """Decode attention reading K/V through block tables (PagedAttention, vLLM's paged_attention kernel).

    For each sequence ``b``: gather its ``ceil(seq_lens[b] / block_size)`` blocks with one fancy-indexing read
    (``k_cache[table]``, step 1 "fetch non-contiguous KV blocks using the block table"), keep its first
    ``seq_lens[b]`` tokens, and attend (step 2). GQA: query head ``h`` reads kv head ``h // (Hq // Hkv)``.

    Args:
        q: ``(B, Hq, d)`` one query token per sequence.
        k_cache, v_cache: ``(num_blocks, block_size, Hkv, d)``.
        block_tables: ``(B, max_blocks)`` integers (int32), padded with ``-1``.
        seq_lens: ``(B,)`` integers; a length of 0 gives an output row of zeros.
        scale: default ``1/sqrt(d)``.

    Returns:
        ``o (B, Hq, d)`` in the promoted input dtype, accumulated in at least float32.
    """
    q = as_float_array(q, "q")
    if q.ndim != 3:
        raise ValueError(f"q must have shape (B, Hq, d) (one query token per sequence), got {q.shape}")
    b, hq, d = q.shape
    k_cache, v_cache = check_paged_caches(k_cache, v_cache, d, hq)
    num_blocks, bs, hkv, _ = k_cache.shape
    group = hq // hkv
    tables, lens = check_block_tables(block_tables, seq_lens, b, num_blocks, bs)
    scale = check_scale(scale, d)
    acc = compute_dtype(q, k_cache, v_cache)
    o = np.zeros((b, hkv, group, d), dtype=acc)
    qg = q.astype(acc).reshape(b, hkv, group, d)
    for i in range(b):
        n = int(lens[i])
        if n == 0:
            continue
        blocks = tables[i, :-(-n // bs)]
        # One gathered copy per sequence, head-major (Hkv, n, d) so that the matmuls below run as BLAS calls.
        k = k_cache[blocks].transpose(2, 0, 1, 3).reshape(hkv, -1, d)[:, :n].astype(acc, copy=False)
        v = v_cache[blocks].transpose(2, 0, 1, 3).reshape(hkv, -1, d)[:, :n].astype(acc, copy=False)
        # (K q^T)^T rather than q K^T: with G << n NumPy's batched matmul is far faster this way round.
        s = np.ascontiguousarray((k @ qg[i].transpose(0, 2, 1)).transpose(0, 2, 1)) * scale     # (Hkv, G, n)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        o[i] = (p @ v) / p.sum(axis=-1, keepdims=True)
    return o.reshape(b, hq, d).astype(np.result_type(q.dtype, k_cache.dtype, v_cache.dtype))
