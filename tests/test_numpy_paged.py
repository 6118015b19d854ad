"""reference.numpy.paged: BlockAllocator, PagedKVCache (copy-on-write fork) and paged_attention vs the oracle."""
import numpy as np
import pytest

from reference.numpy.decoding import flash_decoding
from reference.numpy.paged import (BlockAllocator, OutOfBlocksError, PagedKVCache, UnknownSequenceError,
                                   paged_attention)
from tests.oracle import attention_ref, rel_err

TOL = {np.float16: 3e-3, np.float32: 2e-6, np.float64: 1e-13}
DTYPES = [np.float16, np.float32, np.float64]


# ---- BlockAllocator ------------------------------------------------------------------------------------
@pytest.mark.block_allocator
def test_allocator_allocate_free_refcount():
    alloc = BlockAllocator(4)
    blocks = [alloc.allocate() for _ in range(4)]
    assert sorted(blocks) == [0, 1, 2, 3] and alloc.num_free == 0 and alloc.num_used == 4
    assert all(alloc.refcount(b) == 1 for b in blocks)
    alloc.incref(blocks[0])
    assert alloc.refcount(blocks[0]) == 2
    alloc.free(blocks[0])
    assert alloc.refcount(blocks[0]) == 1 and alloc.num_free == 0      # still owned once
    alloc.free(blocks[0])
    assert alloc.refcount(blocks[0]) == 0 and alloc.num_free == 1
    assert alloc.allocate() == blocks[0]                                 # back from the free list
    for b in blocks:
        alloc.free(b)
    assert alloc.num_free == 4 and sorted(alloc.free_blocks()) == [0, 1, 2, 3]


@pytest.mark.block_allocator
def test_allocator_out_of_blocks_is_clear_and_atomic():
    alloc = BlockAllocator(3)
    alloc.allocate()
    with pytest.raises(OutOfBlocksError, match="5 requested, 2 free") as info:
        alloc.allocate_many(5)
    assert isinstance(info.value, RuntimeError) and (info.value.requested, info.value.free) == (5, 2)
    assert alloc.num_free == 2                                           # nothing was taken
    alloc.allocate_many(2)
    with pytest.raises(OutOfBlocksError, match="1 requested, 0 free"):
        alloc.allocate()
    assert alloc.allocate_many(0) == []


@pytest.mark.block_allocator
def test_allocator_bad_input():
    with pytest.raises(ValueError, match="num_blocks must be a positive integer"):
        BlockAllocator(0)
    with pytest.raises(TypeError, match="num_blocks must be a positive integer"):
        BlockAllocator(2.0)
    alloc = BlockAllocator(4)
    b = alloc.allocate()
    alloc.free(b)
    with pytest.raises(ValueError, match=f"double free: block {b} is already free"):
        alloc.free(b)
    with pytest.raises(ValueError, match=r"block must be in \[0, 4\), got 4"):
        alloc.free(4)
    with pytest.raises(ValueError, match=r"block must be in \[0, 4\), got -1"):
        alloc.refcount(-1)
    with pytest.raises(TypeError, match="block must be an integer block index"):
        alloc.free(1.0)
    with pytest.raises(TypeError, match="block must be an integer block index"):
        alloc.incref(True)
    with pytest.raises(ValueError, match="block 2 is free; incref needs an allocated block"):
        alloc.incref(2)
    with pytest.raises(ValueError, match="n must be a non-negative integer"):
        alloc.allocate_many(-1)
    assert alloc.num_free == 4


# ---- PagedKVCache --------------------------------------------------------------------------------------
def _kv(rng, t, hkv=2, d=4):
    return rng.standard_normal((t, hkv, d)), rng.standard_normal((t, hkv, d))


@pytest.mark.paged_kv_cache
def test_append_fills_last_block_before_taking_new_ones(rng):
    cache = PagedKVCache(num_blocks=16, block_size=4, n_kv_heads=2, head_dim=4, dtype=np.float64)
    cache.add_sequence("s")
    ks, vs = [], []
    for t in [3, 1, 1, 6, 0, 5]:
        k, v = _kv(rng, t)
        before = len(cache.block_table("s"))
        cache.append("s", k, v)
        ks.append(k), vs.append(v)
        n = cache.seq_len("s")
        assert len(cache.block_table("s")) == -(-n // 4) and cache.num_free_blocks == 16 - -(-n // 4)
        assert len(cache.block_table("s")) - before == -(-n // 4) - before
        gk, gv = cache.gather("s")
        assert np.array_equal(gk, np.concatenate(ks)) and np.array_equal(gv, np.concatenate(vs))
    assert cache.block_table("s").dtype == np.int32


@pytest.mark.paged_kv_cache
def test_fork_shares_blocks_and_copies_on_write(rng):
    cache = PagedKVCache(16, 4, 2, 4, np.float64)
    cache.add_sequence("p")
    kp, vp = _kv(rng, 6)                       # 1 full block + a half-filled last block
    cache.append("p", kp, vp)
    cache.fork("p", "c")
    table = cache.block_table("p")
    assert np.array_equal(cache.block_table("c"), table)
    assert [cache.allocator.refcount(b) for b in table] == [2, 2] and cache.num_free_blocks == 14
    kc, vc = _kv(rng, 1)
    cache.append("c", kc, vc)                  # last block is shared and partly filled: copy it first
    tc = cache.block_table("c")
    assert tc[0] == table[0] and tc[1] != table[1]
    assert cache.allocator.refcount(table[0]) == 2 and cache.allocator.refcount(table[1]) == 1
    assert np.array_equal(cache.gather("p")[0], kp)                                # parent untouched
    assert np.array_equal(cache.gather("c")[0], np.concatenate([kp, kc]))
    kp2, vp2 = _kv(rng, 2)
    cache.append("p", kp2, vp2)                # parent now sole owner of its last block: no copy
    assert np.array_equal(cache.block_table("p"), table)
    cache.free("p")
    assert np.array_equal(cache.gather("c")[1], np.concatenate([vp, vc]))          # child survives
    assert cache.allocator.refcount(table[0]) == 1 and cache.allocator.refcount(table[1]) == 0
    cache.free("c")
    assert cache.num_free_blocks == 16


@pytest.mark.paged_kv_cache
def test_fork_at_block_boundary_needs_no_copy(rng):
    cache = PagedKVCache(8, 4, 2, 4, np.float64)
    cache.add_sequence(0)
    k, v = _kv(rng, 8)
    cache.append(0, k, v)
    cache.fork(0, 1)
    k1, v1 = _kv(rng, 1)
    cache.append(1, k1, v1)
    assert list(cache.block_table(1)[:2]) == list(cache.block_table(0))      # the full blocks stay shared
    assert cache.num_free_blocks == 8 - 3


@pytest.mark.paged_kv_cache
def test_out_of_blocks_during_append_leaves_everything_intact(rng):
    cache = PagedKVCache(4, 2, 2, 4, np.float64)
    cache.add_sequence("a")
    ka, va = _kv(rng, 3)
    cache.append("a", ka, va)
    cache.fork("a", "b")
    k_cache, v_cache = cache.k_cache.copy(), cache.v_cache.copy()
    tables = {s: cache.block_table(s).copy() for s in "ab"}
    with pytest.raises(OutOfBlocksError, match=r"4 requested, 2 free \(appending 6 token\(s\) to sequence 'b'"):
        cache.append("b", *_kv(rng, 6))        # needs a copy-on-write block + 3 new ones
    assert cache.num_free_blocks == 2 and cache.seq_len("b") == 3
    assert np.array_equal(cache.k_cache, k_cache) and np.array_equal(cache.v_cache, v_cache)
    for s in "ab":
        assert np.array_equal(cache.block_table(s), tables[s])
        assert np.array_equal(cache.gather(s)[0], ka)
    cache.append("b", *_kv(rng, 3))            # exactly fits (COW block + 1 new)
    assert cache.num_free_blocks == 0


@pytest.mark.paged_kv_cache
def test_block_tables_batch(rng):
    cache = PagedKVCache(10, 3, 2, 4, np.float32)
    for s, t in [("x", 7), ("y", 0), ("z", 3)]:
        cache.add_sequence(s)
        cache.append(s, *_kv(rng, t))
    tables, lens = cache.block_tables(["z", "x", "y"])
    assert tables.dtype == np.int32 and lens.dtype == np.int32 and tables.shape == (3, 3)
    assert list(lens) == [3, 7, 0]
    assert list(tables[0]) == list(cache.block_table("z")) + [-1, -1]
    assert list(tables[2]) == [-1, -1, -1]
    wide, _ = cache.block_tables(["x"], max_blocks=5)
    assert wide.shape == (1, 5) and list(wide[0, 3:]) == [-1, -1]
    with pytest.raises(ValueError, match=r"max_blocks must be at least the longest block table \(3\)"):
        cache.block_tables(["x"], max_blocks=2)


@pytest.mark.paged_kv_cache
def test_paged_kv_cache_bad_input(rng):
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        PagedKVCache(4, 0, 2, 4)
    with pytest.raises(TypeError, match="dtype must be float16, float32 or float64"):
        PagedKVCache(4, 2, 2, 4, dtype=np.int16)
    cache = PagedKVCache(4, 2, 2, 4)
    cache.add_sequence("a")
    with pytest.raises(ValueError, match="seq_id 'a' already exists"):
        cache.add_sequence("a")
    with pytest.raises(TypeError, match="seq_id must be hashable"):
        cache.add_sequence(["a"])
    with pytest.raises(UnknownSequenceError, match="seq_id 'q' is not a sequence in this cache"):
        cache.append("q", *_kv(rng, 1))
    with pytest.raises(ValueError, match="parent_id 'q' is not a sequence"):
        cache.fork("q", "r")
    with pytest.raises(ValueError, match="child_id 'a' already exists"):
        cache.fork("a", "a")
    with pytest.raises(KeyError, match="seq_id 'q' is not a sequence"):
        cache.free("q")
    with pytest.raises(ValueError, match=r"k must have shape \(T, Hkv, d\) = \('T', 2, 4\), got \(2, 1, 4\)"):
        cache.append("a", np.zeros((2, 1, 4)), np.zeros((2, 1, 4)))
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        cache.append("a", np.zeros((2, 2, 4)), np.zeros((1, 2, 4)))
    with pytest.raises(TypeError, match="v must have dtype float16, float32 or float64"):
        cache.append("a", np.zeros((1, 2, 4)), np.zeros((1, 2, 4), dtype=int))
    assert cache.seq_len("a") == 0 and cache.num_free_blocks == 4


# ---- paged_attention -----------------------------------------------------------------------------------
def paged_oracle(q, k_cache, v_cache, tables, lens, scale=None):
    """Read token t of sequence b at k_cache[tables[b, t // bs], t % bs] one token at a time; oracle attention."""
    b, hq, d = q.shape
    bs = k_cache.shape[1]
    o = np.zeros((b, hq, d))
    for i in range(b):
        n = int(lens[i])
        if n == 0:
            continue
        k = np.stack([k_cache[tables[i, t // bs], t % bs] for t in range(n)], axis=1)   # (Hkv, n, d)
        v = np.stack([v_cache[tables[i, t // bs], t % bs] for t in range(n)], axis=1)
        o[i] = attention_ref(q[i][:, None, :], k, v, scale=scale)[0][:, 0].numpy()
    return o


def scattered_case(rng, dtype, block_size, hkv, group, d=16):
    b = int(rng.integers(1, 6))
    lens = rng.integers(0, 70, size=b)
    lens[0] = max(1, lens[0])
    if b > 1:
        lens[1] = 1
    if b > 2:
        lens[2] = 0
    if b > 3:
        lens[3] = block_size * int(rng.integers(1, 4))                # exact multiple of the block size
    need = -(-lens // block_size)
    max_blocks = int(need.max()) + int(rng.integers(0, 3))
    num_blocks = int(need.sum()) + int(rng.integers(1, 10))
    perm = rng.permutation(num_blocks)                               # blocks scattered over the pool
    tables = np.full((b, max_blocks), -1, dtype=np.int32)
    start = 0
    for i in range(b):
        extra = int(rng.integers(0, max_blocks - need[i] + 1))       # unused-but-valid trailing blocks are OK
        extra = min(extra, num_blocks - start - int(need[i:].sum()))
        n = int(need[i]) + max(extra, 0)
        tables[i, :n] = perm[start:start + n]
        start += n
    k_cache = rng.standard_normal((num_blocks, block_size, hkv, d)).astype(dtype)
    v_cache = rng.standard_normal((num_blocks, block_size, hkv, d)).astype(dtype)
    q = rng.standard_normal((b, hkv * group, d)).astype(dtype)
    return q, k_cache, v_cache, tables, lens.astype(np.int32)


@pytest.mark.paged_attention
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("hkv,group", [(1, 4), (2, 2), (3, 1)])
def test_paged_attention_matches_oracle(rng, dtype, block_size, hkv, group):
    q, k_cache, v_cache, tables, lens = scattered_case(rng, dtype, block_size, hkv, group)
    o = paged_attention(q, k_cache, v_cache, tables, lens)
    ref = paged_oracle(q, k_cache, v_cache, tables, lens)
    assert o.dtype == dtype and o.shape == q.shape and not np.isnan(o).any()
    assert rel_err(o, ref) < TOL[dtype]
    assert np.all(o[lens == 0] == 0)


@pytest.mark.paged_attention
def test_paged_attention_scale_and_large_logits(rng):
    q, k_cache, v_cache, tables, lens = scattered_case(rng, np.float16, 4, 2, 2)
    o = paged_attention(q, k_cache, v_cache, tables, lens, scale=30.0)
    assert np.isfinite(o).all()
    assert rel_err(o, paged_oracle(q, k_cache, v_cache, tables, lens, scale=30.0)) < 1e-2


@pytest.mark.paged_attention
@pytest.mark.paged_kv_cache
def test_paged_attention_through_cache_equals_flash_decoding(rng):
    hkv, d, bs = 2, 8, 4
    cache = PagedKVCache(64, bs, hkv, d, np.float64)
    cache.add_sequence("root")
    cache.append("root", *_kv(rng, 10, hkv, d))
    for child in ("a", "b", "c"):
        cache.fork("root", child)
        cache.append(child, *_kv(rng, int(rng.integers(0, 12)), hkv, d))
    ids = ["root", "a", "b", "c"]
    tables, lens = cache.block_tables(ids)
    q = rng.standard_normal((4, hkv * 3, d))
    o = paged_attention(q, cache.k_cache, cache.v_cache, tables, lens)
    nmax = int(lens.max())
    dense_k, dense_v = np.zeros((4, hkv, nmax, d)), np.zeros((4, hkv, nmax, d))
    for i, s in enumerate(ids):
        k, v = cache.gather(s)
        dense_k[i, :, :len(k)], dense_v[i, :, :len(v)] = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    ref, _ = flash_decoding(q, dense_k, dense_v, num_splits=3, seq_lens=lens)
    assert rel_err(o, ref) < 1e-13
    assert rel_err(o, paged_oracle(q, cache.k_cache, cache.v_cache, tables, lens)) < 1e-13


@pytest.mark.paged_attention
def test_paged_attention_bad_input():
    q = np.zeros((2, 4, 8))
    kc = np.zeros((5, 4, 2, 8))
    tables = np.array([[0, 1], [2, -1]], dtype=np.int32)
    lens = np.array([5, 3], dtype=np.int32)
    paged_attention(q, kc, kc, tables, lens)                           # the valid baseline
    with pytest.raises(ValueError, match=r"q must have shape \(B, Hq, d\)"):
        paged_attention(q[:, :, None], kc, kc, tables, lens)
    with pytest.raises(ValueError, match=r"k_cache must have shape \(num_blocks, block_size, Hkv, d\)"):
        paged_attention(q, kc[0], kc[0], tables, lens)
    with pytest.raises(ValueError, match="v_cache must have the shape of k_cache"):
        paged_attention(q, kc, kc[:4], tables, lens)
    with pytest.raises(ValueError, match="same head dimension d"):
        paged_attention(q, kc[..., :4], kc[..., :4], tables, lens)
    with pytest.raises(ValueError, match="Hq=4 must be a multiple of the kv heads Hkv=3"):
        paged_attention(q, np.zeros((5, 4, 3, 8)), np.zeros((5, 4, 3, 8)), tables, lens)
    with pytest.raises(TypeError, match="k_cache must have dtype float16, float32 or float64"):
        paged_attention(q, kc.astype(np.int32), kc, tables, lens)
    with pytest.raises(TypeError, match="block_tables must hold integers"):
        paged_attention(q, kc, kc, tables.astype(np.float32), lens)
    with pytest.raises(TypeError, match="block_tables must be a numpy integer array"):
        paged_attention(q, kc, kc, tables.tolist(), lens)
    with pytest.raises(ValueError, match=r"block_tables must have shape \(B, max_blocks\) with B=2"):
        paged_attention(q, kc, kc, tables[:1], lens)
    with pytest.raises(ValueError, match=r"block_tables entries must be -1 \(padding\) or in \[0, 5\)"):
        paged_attention(q, kc, kc, np.array([[0, 5], [2, -1]], dtype=np.int32), lens)
    with pytest.raises(ValueError, match=r"block_tables entries must be -1 \(padding\) or in \[0, 5\)"):
        paged_attention(q, kc, kc, np.array([[0, -2], [2, -1]], dtype=np.int32), lens)
    with pytest.raises(ValueError, match="block_tables row 1 has a valid block after a -1"):
        paged_attention(q, kc, kc, np.array([[0, 1], [-1, 2]], dtype=np.int32), np.array([5, 0]))
    with pytest.raises(ValueError, match=r"block_tables row 1 has 1 block\(s\) but seq_lens\[1\]=5 needs 2"):
        paged_attention(q, kc, kc, tables, np.array([5, 5], dtype=np.int32))
    with pytest.raises(ValueError, match=r"seq_lens entries must lie in \[0, 8\]"):
        paged_attention(q, kc, kc, tables, np.array([9, 1]))
    with pytest.raises(ValueError, match=r"seq_lens entries must lie in \[0, 8\]"):
        paged_attention(q, kc, kc, tables, np.array([-1, 1]))
    with pytest.raises(TypeError, match="seq_lens must hold integers"):
        paged_attention(q, kc, kc, tables, np.array([1.0, 1.0]))
    with pytest.raises(ValueError, match=r"seq_lens must have shape \(B,\) = \(2,\)"):
        paged_attention(q, kc, kc, tables, np.array([1]))
