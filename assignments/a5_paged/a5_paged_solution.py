# %% [markdown]
# # Assignment 5 -- PagedAttention: a block allocator and attention through block tables
#
# A contiguous KV cache (assignment 4) reserves room for each request's *maximum* length. Output lengths are
# unknown, so most of that room is never used (internal fragmentation), and requests of different maximum
# lengths leave holes between them (external fragmentation): the vLLM authors measured only 20-40% of KV
# cache memory holding actual token states.
#
# **PagedAttention** borrows virtual memory from operating systems. The cache is one pool of fixed-size
# **blocks** (pages) of `block_size` tokens. A sequence owns a list of blocks -- its **block table** -- that
# need not be contiguous; a new block is taken from the free list only when the last one is full, so at most
# `block_size - 1` slots per sequence are wasted, and there is no external fragmentation. The attention kernel
# (1) fetches the non-contiguous blocks through the block table and (2) attends on the fly -- correct because
# attention does not care in which order or where the keys are stored.
#
# Blocks can be **shared**: when a sequence forks (parallel sampling, beam search), the child copies the
# parent's block table and each shared block's **reference count** goes up; a block is written only by an owner
# that holds it alone (copy-on-write), and returns to the free list when its last owner frees it.
#
# You will write `BlockAllocator`, copy-on-write `cow_fork` / `cow_append`, `paged_attention` (NumPy) and
# `paged_decode` (Triton).
#
# **Layout** (same as the course's reference): `q (B, Hq, d)` one new token per sequence;
# `k_cache, v_cache (num_blocks, block_size, Hkv, d)`; `block_tables (B, max_blocks)` int32, padded with `-1`;
# `seq_lens (B,)` integers. Token `t` of sequence `b` lives in block `block_tables[b, t // block_size]` at slot
# `t % block_size`. A sequence of length 0 gets `o = 0`. GQA: query head `h` reads kv head
# `h // (Hq // Hkv)`. Forbidden: `scipy`, softmax/attention library calls, `vllm`, `flash_attn`, the `reference`
# package; the NumPy parts must not use deep-learning frameworks.

# %% given="numpy_helpers"

# %%
class OutOfBlocksError(RuntimeError):
    """Given: raised by ``BlockAllocator.allocate`` when no block is free."""


# %% [markdown]
# ## Part 1 -- the block allocator
#
# `BlockAllocator(num_blocks)` manages the physical block indices `0 .. num_blocks - 1`:
#
# | member | behaviour |
# |---|---|
# | `allocate()` | take a free block, set its reference count to 1, return its index; raise `OutOfBlocksError` (a `RuntimeError`) when none is free |
# | `incref(block)` | one more owner of an allocated block (a fork shares it); `ValueError` if the block is free |
# | `free(block)` | one owner fewer; at count 0 the block returns to the free list; `ValueError` on a double free |
# | `refcount(block)` | number of owners (0 when free) |
# | `num_free` | property: number of free blocks |
#
# Any index that is not an integer in `[0, num_blocks)` raises (`TypeError` / `ValueError`); use the given
# `_check`. Every operation should be O(1): keep a free *list* (a stack) and a count per block.

# %%
class BlockAllocator:
    """Physical KV-cache blocks with reference counts (a block is free iff its count is 0)."""

    def __init__(self, num_blocks):
        self.num_blocks = positive_int(num_blocks, "num_blocks")
        ### BEGIN SOLUTION
        self._free = list(range(self.num_blocks - 1, -1, -1))  # a stack: hands out 0, 1, 2, ... first
        self._refs = [0] * self.num_blocks
        ### END SOLUTION

    def _check(self, block):
        """Given: ``block`` as a valid index, or TypeError/ValueError."""
        if isinstance(block, bool) or not isinstance(block, numbers.Integral):
            raise TypeError(f"block must be an integer block index, got {block!r}")
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block must be in [0, {self.num_blocks}), got {block}")
        return int(block)

    @property
    def num_free(self):
        """Number of free blocks."""
        ### BEGIN SOLUTION
        return len(self._free)
        ### END SOLUTION

    def allocate(self):
        """Take one free block (reference count 1) and return its index."""
        ### BEGIN SOLUTION
        if not self._free:
            raise OutOfBlocksError(f"out of KV cache blocks: all {self.num_blocks} are in use")
        block = self._free.pop()
        self._refs[block] = 1
        return block
        ### END SOLUTION

    def incref(self, block):
        """Add an owner to an allocated block (copy-on-write sharing after a fork)."""
        block = self._check(block)
        ### BEGIN SOLUTION
        if self._refs[block] == 0:
            raise ValueError(f"block {block} is free; incref needs an allocated block")
        self._refs[block] += 1
        ### END SOLUTION

    def free(self, block):
        """Drop one owner; the block returns to the free list when the last owner is gone."""
        block = self._check(block)
        ### BEGIN SOLUTION
        if self._refs[block] == 0:
            raise ValueError(f"double free: block {block} is already free")
        self._refs[block] -= 1
        if self._refs[block] == 0:
            self._free.append(block)
        ### END SOLUTION

    def refcount(self, block):
        """Number of owners of ``block`` (0 when free)."""
        block = self._check(block)
        ### BEGIN SOLUTION
        return self._refs[block]
        ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a5.BlockAllocator", BlockAllocator)

# %% [markdown]
# ### Part 1b -- fork and copy-on-write (graded)
#
# Now the cache side of sharing, as two **pure functions** on a cache state (return new arrays; the grader
# fails a call that modifies its inputs). `refcount (num_blocks,)` holds the owners of every block (0 = free);
# a sequence is its `block_table` (int array of its blocks, `ceil(seq_len / block_size)` long) and `seq_len`.
#
# * `cow_fork(refcount, block_table) -> refcount`: the child shares every block of the parent, so each block of
#   the table gets one more owner. No K/V data is copied.
# * `cow_append(k_cache, v_cache, refcount, block_table, seq_len, k_new, v_new) -> (k_cache, v_cache, refcount,
#   block_table)`: append the `T` tokens `k_new, v_new (T, Hkv, d)`. Token `t` goes to slot `t % block_size` of
#   block `block_table[t // block_size]`. When the last block is full (or the table is empty), take a **fresh
#   block: the lowest-numbered one with refcount 0**, and set its count to 1. When the last block is only
#   partly filled *and shared* (refcount > 1), **copy it first** into a fresh block (K and V), drop one owner
#   from the old block and put the copy in the table: the other owners keep seeing their data. Full shared
#   blocks are never written again, so they stay shared.
#
# Why only the last block: a sequence writes nothing but its tail, so everything before it can be shared
# forever -- a fork costs one block copy at most, and only when the child writes.

# %%
def cow_fork(refcount, block_table):
    """The reference counts after forking the sequence ``block_table``: every block of it + 1 (a new array)."""
    ### BEGIN SOLUTION
    out = np.array(refcount, copy=True)
    np.add.at(out, np.asarray(block_table, dtype=np.int64), 1)
    return out
    ### END SOLUTION


def cow_append(k_cache, v_cache, refcount, block_table, seq_len, k_new, v_new):
    """Append ``k_new, v_new (T, Hkv, d)`` with copy-on-write of a shared, partly filled last block.

    Returns new ``(k_cache, v_cache, refcount, block_table)``; fresh blocks are the lowest-numbered free ones.
    """
    ### BEGIN SOLUTION
    kc, vc = np.array(k_cache, copy=True), np.array(v_cache, copy=True)
    refs = np.array(refcount, copy=True)
    table = [int(b) for b in block_table]
    bs, n = kc.shape[1], int(seq_len)

    def fresh():
        free = np.flatnonzero(refs == 0)
        if free.size == 0:
            raise RuntimeError(f"out of blocks: all {refs.size} blocks are in use")
        refs[free[0]] = 1
        return int(free[0])

    for t in range(len(k_new)):
        if n % bs == 0:
            table.append(fresh())
        elif refs[table[-1]] > 1:                     # copy-on-write before the first write into a shared block
            new = fresh()
            kc[new], vc[new] = kc[table[-1]], vc[table[-1]]
            refs[table[-1]] -= 1
            table[-1] = new
        kc[table[-1], n % bs], vc[table[-1], n % bs] = k_new[t], v_new[t]
        n += 1
    return kc, vc, refs, np.asarray(table, dtype=np.int64)
    ### END SOLUTION


# %% tags=["check"]
check("a5.cow_fork", cow_fork)

# %% tags=["check"]
check("a5.cow_append", cow_append)

# %% [markdown]
# ## Part 2 -- paged attention in NumPy
#
# For each sequence `b`: take its first `ceil(seq_lens[b] / block_size)` block indices from the block table,
# gather those blocks from the caches (`k_cache[table]` is one fancy-indexing read), flatten them to
# `(tokens, Hkv, d)`, keep the first `seq_lens[b]` tokens and attend the query to them (softmax with the max
# trick; GQA by reshaping `q[b]` to `(Hkv, group, d)`). Return `o (B, Hq, d)` in `q`'s dtype, computed in at
# least float32. `check_paged_inputs` validates everything, including that every block a sequence needs is a
# valid index.

# %%
def check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens):
    """Given: validate the paged layout; return ``(q, k_cache, v_cache, tables, lens, group)`` as NumPy."""
    q, k_cache, v_cache = as_float(q, "q"), as_float(k_cache, "k_cache"), as_float(v_cache, "v_cache")
    if q.ndim != 3 or k_cache.ndim != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"expected q (B, Hq, d), k_cache, v_cache (num_blocks, block_size, Hkv, d), got "
                         f"{q.shape}, {k_cache.shape}, {v_cache.shape}")
    (B, Hq, d), (num_blocks, bs, Hkv, dk) = q.shape, k_cache.shape
    if dk != d or Hkv == 0 or Hq % Hkv or bs == 0:
        raise ValueError(f"q {q.shape} and k_cache {k_cache.shape} must share d, with Hq % Hkv == 0")
    tables, lens = np.asarray(block_tables), np.asarray(seq_lens)
    if tables.dtype.kind not in "iu" or tables.ndim != 2 or tables.shape[0] != B:
        raise ValueError(f"block_tables must be integers of shape ({B}, max_blocks), got {tables.shape}")
    if lens.dtype.kind not in "iu" or lens.shape != (B,) or (lens < 0).any():
        raise ValueError(f"seq_lens must be {B} non-negative integers, got {seq_lens!r}")
    for b in range(B):
        need = (int(lens[b]) + bs - 1) // bs  # blocks holding seq_lens[b] tokens
        used = tables[b, :need]
        if used.size < need or (used < 0).any() or (used >= num_blocks).any():
            raise ValueError(f"block_tables[{b}] must start with {need} valid block indices, got {used}")
    return q, k_cache, v_cache, tables, lens, Hq // Hkv


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
    """Decode attention reading K/V through block tables: gather each sequence's blocks, then attend."""
    q, k_cache, v_cache, tables, lens, group = check_paged_inputs(q, k_cache, v_cache, block_tables, seq_lens)
    B, Hq, d = q.shape
    bs, Hkv = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    acc = np.result_type(np.float32, q.dtype, k_cache.dtype, v_cache.dtype)
    o = np.zeros((B, Hkv, group, d), dtype=acc)
    ### BEGIN SOLUTION
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue  # nothing to attend: o = 0
        table = tables[b, :(n + bs - 1) // bs]
        k = k_cache[table].reshape(-1, Hkv, d)[:n].astype(acc)  # (n, Hkv, d), step 1: fetch blocks
        v = v_cache[table].reshape(-1, Hkv, d)[:n].astype(acc)
        qg = q[b].astype(acc).reshape(Hkv, group, d)
        s = scale * np.einsum("hgd,nhd->hgn", qg, k)  # step 2: attend
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        o[b] = np.einsum("hgn,nhd->hgd", p, v) / p.sum(axis=-1, keepdims=True)
    ### END SOLUTION
    return o.reshape(B, Hq, d).astype(q.dtype)


# %% tags=["check"]
from autograder.check import check

check("a5.paged_attention", paged_attention)

# %% [markdown]
# ## Part 3 -- paged decode in Triton
#
# Take your split-KV decode kernel from assignment 4 and change only *where keys come from*: for a tile of
# token positions `t`, load the physical block `block_tables[b, t // block_size]` (masked for `t >= seq_len`)
# and address `k_cache[block, t % block_size, hk, :]`. Everything else -- the GQA tile, the online softmax,
# the splits -- is unchanged. The grid is `(B * Hkv, num_splits)`, then the merge kernel over `(B * Hq,)`:
# `merge_splits_kernel`, given as in assignment 4 (the cell after the setup cell). Any `block_size` works this
# way (a tile may span several blocks); on a GPU, a `BLOCK_N` that is a multiple of `block_size` keeps each
# block's rows contiguous in memory.

# %% given="triton_setup"

# %% given="merge_splits"

# %% given="split_program"

# %%
def check_paged_tensors(q, k_cache, v_cache, block_tables, seq_lens):
    """Given: validate the torch inputs of ``paged_decode``; return ``(B, Hq, Hkv, block_size, d)``."""
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"{name} must be a float16/bfloat16/float32 torch.Tensor")
    for name, x in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if not isinstance(x, torch.Tensor) or x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be an int32/int64 torch.Tensor")
    if q.dtype != k_cache.dtype or k_cache.dtype != v_cache.dtype:
        raise TypeError(f"q, k_cache, v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError("expected q (B, Hq, d), k_cache, v_cache (num_blocks, block_size, Hkv, d)")
    (B, Hq, d), (_, bs, Hkv, dk) = q.shape, k_cache.shape
    if dk != d or Hkv == 0 or Hq % Hkv or d not in (16, 32, 64, 128):
        raise ValueError(f"q {tuple(q.shape)} and k_cache {tuple(k_cache.shape)} must share d in "
                         "(16, 32, 64, 128), with Hq % Hkv == 0")
    if block_tables.dim() != 2 or block_tables.shape[0] != B or tuple(seq_lens.shape) != (B,):
        raise ValueError(f"block_tables must be ({B}, max_blocks) and seq_lens ({B},)")
    if B and (int(seq_lens.min()) < 0 or int(seq_lens.max()) > block_tables.shape[1] * bs):
        raise ValueError(f"seq_lens must lie in [0, max_blocks * block_size = {block_tables.shape[1] * bs}]")
    return B, Hq, Hkv, bs, d


# %%
@triton.jit
def _paged_split_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, o_part_ptr, lse_part_ptr,
                        sqb, sqh, skblk, sks, skh, svblk, svs, svh, stb,
                        Hkv, group, block_size, num_splits, chunk, qk_scale,
                        D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stage 1 of paged decode: one (sequence, kv head, split), keys fetched through the block table."""
    b, hk, split, heads, row_ok = split_program(Hkv, group, BLOCK_G)  # heads: the query heads of this kv head
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    seq_len = tl.load(lens_ptr + b).to(tl.int32)
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    ### BEGIN SOLUTION
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + heads[:, None] * sqh + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for start_n in range(start, end, BLOCK_N):
        t = start_n + offs_n  # token positions of this tile
        ok = t < end
        blk = tl.load(tables_ptr + b.to(tl.int64) * stb + t // block_size, mask=ok, other=0).to(tl.int64)
        slot = t % block_size
        k = tl.load(k_ptr + blk[:, None] * skblk + slot[:, None] * sks + hk * skh + offs_d[None, :],
                    mask=ok[:, None], other=0.0)
        v = tl.load(v_ptr + blk[:, None] * svblk + slot[:, None] * svs + hk * svh + offs_d[None, :],
                    mask=ok[:, None], other=0.0)
        s = tl.where(ok[None, :], dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        # finite: the tile's first key (start_n < end) is visible to every row, so no -inf - (-inf) to guard
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v)
        m_i = m_new
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # a split past the sequence's end saw no key: o = 0, lse = -inf
    lse2 = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))  # base 2
    row = (b.to(tl.int64) * Hkv * group + heads) * num_splits + split
    tl.store(o_part_ptr + row[:, None] * D + offs_d[None, :], acc / l_safe[:, None], mask=row_ok[:, None])
    tl.store(lse_part_ptr + row, lse2, mask=row_ok)
    ### END SOLUTION


def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
    """PagedAttention decode in Triton: split-KV over each sequence's blocks, then a merge kernel."""
    B, Hq, Hkv, bs, d = check_paged_tensors(q, k_cache, v_cache, block_tables, seq_lens)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = torch.empty((B, Hq, d), device=q.device, dtype=q.dtype)
    ### BEGIN SOLUTION
    BLOCK_N = 64
    max_len = block_tables.shape[1] * bs
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
    num_splits = max(1, min(triton.cdiv(2 * sms, B * Hkv), triton.cdiv(max_len, BLOCK_N), 128))
    chunk = triton.cdiv(triton.cdiv(max_len, num_splits), BLOCK_N) * BLOCK_N
    group = Hq // Hkv
    q, tables, lens = q.contiguous(), block_tables.contiguous(), seq_lens.contiguous()
    o_part = torch.empty((B, Hq, num_splits, d), device=q.device, dtype=torch.float32)
    lse_part = torch.empty((B, Hq, num_splits), device=q.device, dtype=torch.float32)
    _paged_split_kernel[(B * Hkv, num_splits)](
        q, k_cache, v_cache, tables, lens, o_part, lse_part, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), tables.stride(0), Hkv, group, bs, num_splits, chunk, scale * LOG2E.value,
        D=d, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=BLOCK_N)
    merge_splits_kernel[(B * Hq,)](o_part, lse_part, o, num_splits, D=d,
                                   BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
    ### END SOLUTION
    return o


# %% tags=["check"]
from autograder.check import check

check("a5.paged_decode", paged_decode)

# %% [markdown]
# ## Going further (ungraded)
#
# * Simulate a serving workload (random prompt and output lengths) and compare the memory a contiguous cache
#   reserves with the blocks a paged cache uses, for `block_size` in {1, 4, 16, 64}. Where does the waste go?
# * On a GPU, time `paged_decode` against your `flash_decode` at the same lengths (`block_size = 16`). The
#   indirection costs one extra small load per key tile.
