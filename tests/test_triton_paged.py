"""reference.triton.paged_decode (PagedAttention decode) vs the float64 oracle, the NumPy reference and the
contiguous flash_decode on the same keys. Scattered random block tables; CUDA or the Triton interpreter.
"""
import numpy as np
import pytest
import torch

from reference.triton import DEVICE, flash_decode, paged_decode
from tests.common import DECODE_TOL as TOL
from tests.common import make_decode as make
from tests.oracle import decode_ref, rel_err

pytestmark = pytest.mark.triton_paged_decode


def scatter(rng, k, v, seq_lens, block_size, extra_blocks=3, table_dtype=torch.int32):
    """Copy contiguous k, v (B, Hkv, Nmax, d) into a paged cache with randomly permuted physical blocks.

    Returns (k_cache, v_cache, block_tables, seq_lens_tensor); unused table entries are -1 and the pool holds
    a few spare blocks filled with garbage so a wrong index gives a wrong answer.
    """
    B, Hkv, n_max, d = k.shape
    need = [-(-int(n) // block_size) for n in seq_lens]
    num_blocks = sum(need) + extra_blocks
    perm = rng.permutation(num_blocks)
    k_cache = torch.tensor(rng.standard_normal((num_blocks, block_size, Hkv, d)) * 50, dtype=k.dtype, device=DEVICE)
    v_cache = torch.tensor(rng.standard_normal((num_blocks, block_size, Hkv, d)) * 50, dtype=k.dtype, device=DEVICE)
    max_blocks = max(need) + 1  # one always-padded column
    tables = torch.full((B, max_blocks), -1, dtype=table_dtype)
    i = 0
    for b, n in enumerate(seq_lens):
        n = int(n)
        for j in range(need[b]):
            blk = int(perm[i])
            i += 1
            tables[b, j] = blk
            lo, hi = j * block_size, min((j + 1) * block_size, n)
            k_cache[blk, : hi - lo] = k[b, :, lo:hi].transpose(0, 1)
            v_cache[blk, : hi - lo] = v[b, :, lo:hi].transpose(0, 1)
    sl = torch.tensor([int(n) for n in seq_lens], dtype=torch.int32, device=DEVICE)
    return k_cache, v_cache, tables.to(DEVICE), sl


@pytest.mark.parametrize("block_size", [16, 32, 128, 8, 5])
def test_block_sizes_vs_oracle_and_contiguous(rng, block_size):
    # 8 and 5 are smaller than the kernel's 64-key tile (and 5 is not a power of two): one tile spans blocks.
    q, k, v = make(rng, 3, 8, 2, 140, 32, torch.float32)
    lens = [140, int(rng.integers(2, 139)), 1]
    kc, vc, bt, sl = scatter(rng, k, v, lens, block_size)
    o = paged_decode(q, kc, vc, bt, sl)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert rel_err(o, decode_ref(q, k, v, lens)) < TOL[torch.float32]
    o_contig = flash_decode(q, k, v, seq_lens=sl)
    assert rel_err(o, o_contig) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes_gqa_ragged_with_empty(rng, dtype):
    q, k, v = make(rng, 4, 8, 2, 100, 64, dtype)
    lens = [100, 0, 1, int(rng.integers(2, 99))]
    kc, vc, bt, sl = scatter(rng, k, v, lens, 16, table_dtype=torch.int64)
    o = paged_decode(q, kc, vc, bt, sl)
    assert o.dtype == dtype
    assert rel_err(o, decode_ref(q, k, v, lens)) < TOL[dtype]
    assert torch.all(o[1] == 0)


@pytest.mark.parametrize("num_splits", [1, 4, 50])
def test_mqa_num_splits(rng, num_splits):
    q, k, v = make(rng, 2, 4, 1, 120, 32, torch.float32)
    lens = [120, 47]
    kc, vc, bt, sl = scatter(rng, k, v, lens, 16)
    o = paged_decode(q, kc, vc, bt, sl, num_splits=num_splits)
    assert rel_err(o, decode_ref(q, k, v, lens)) < TOL[torch.float32]


def test_matches_numpy_paged_cache_with_fork(rng):
    """Build the cache with reference.numpy.paged.PagedKVCache (append, fork, copy-on-write) and compare."""
    from reference.numpy.paged import PagedKVCache, paged_attention
    hkv, d, bs = 2, 32, 16
    cache = PagedKVCache(num_blocks=24, block_size=bs, n_kv_heads=hkv, head_dim=d, dtype=np.float32)
    cache.add_sequence("a")
    cache.append("a", rng.standard_normal((37, hkv, d)), rng.standard_normal((37, hkv, d)))
    cache.fork("a", "b")  # shares a's blocks; b's next append copies the shared partial block
    cache.append("b", rng.standard_normal((20, hkv, d)), rng.standard_normal((20, hkv, d)))
    cache.add_sequence("c")
    cache.append("c", rng.standard_normal((5, hkv, d)), rng.standard_normal((5, hkv, d)))
    ids = ["a", "b", "c"]
    tables, lens = cache.block_tables(ids)
    q = rng.standard_normal((3, 4, d)).astype(np.float32)
    o_np = paged_attention(q, cache.k_cache, cache.v_cache, tables, lens)

    def t(x):
        return torch.from_numpy(np.ascontiguousarray(x)).to(DEVICE)
    o = paged_decode(t(q), t(cache.k_cache), t(cache.v_cache), t(tables), t(lens))
    assert rel_err(o, torch.from_numpy(o_np)) < TOL[torch.float32]
    # and against the oracle on the gathered keys
    for b, sid in enumerate(ids):
        kk, vv = cache.gather(sid)
        ref = decode_ref(t(q[b:b + 1]), t(kk.transpose(1, 0, 2)[None]), t(vv.transpose(1, 0, 2)[None]))
        assert rel_err(o[b:b + 1], ref) < TOL[torch.float32]


def _inputs():
    q = torch.randn(2, 4, 32, device=DEVICE)
    kc = torch.randn(6, 16, 2, 32, device=DEVICE)
    vc = torch.randn(6, 16, 2, 32, device=DEVICE)
    bt = torch.tensor([[0, 1, -1], [2, -1, -1]], dtype=torch.int32, device=DEVICE)
    sl = torch.tensor([20, 16], dtype=torch.int32, device=DEVICE)
    return q, kc, vc, bt, sl


@pytest.mark.parametrize("edit,exc,match", [
    (lambda a: a.update(kc=a["kc"][0]), ValueError, "k_cache must have 4 dimensions"),
    (lambda a: a.update(vc=a["vc"][:, :8]), ValueError, "k_cache and v_cache must have the same shape"),
    (lambda a: a.update(q=a["q"][:, :3]), ValueError, "multiple of the kv heads"),
    (lambda a: a.update(q=a["q"][..., :16]), ValueError, "same head dimension"),
    (lambda a: a.update(kc=a["kc"].half(), vc=a["vc"].half()), TypeError, "must have the same dtype"),
    (lambda a: a.update(bt=a["bt"].float()), TypeError, "block_tables must have dtype"),
    (lambda a: a.update(bt=a["bt"][0]), ValueError, "block_tables must have 2 dimensions"),
    (lambda a: a.update(bt=a["bt"][:1]), ValueError, r"block_tables must have shape \(B, max_blocks\)"),
    (lambda a: a.update(sl=a["sl"][:1]), ValueError, r"seq_lens must have shape \(B,\)"),
    (lambda a: a.update(sl=a["sl"] + 40), ValueError, r"seq_lens must lie in \[0, 48\]"),
    (lambda a: a["bt"].__setitem__((0, 1), 6), ValueError, r"block_tables\[0, 1\] = 6 is not a block index"),
    (lambda a: a["bt"].__setitem__((1, 0), -1), ValueError, r"block_tables\[1, 0\] = -1 is not a block index"),
])
def test_bad_inputs_raise(edit, exc, match):
    q, kc, vc, bt, sl = _inputs()
    a = dict(q=q, kc=kc, vc=vc, bt=bt, sl=sl)
    edit(a)
    with pytest.raises(exc, match=match):
        paged_decode(a["q"], a["kc"], a["vc"], a["bt"], a["sl"])


def test_padding_entries_are_never_read(rng):
    # -1 entries past a sequence's last block are fine, and so is garbage there when validate=True only
    # checks the used part.
    q, kc, vc, bt, sl = _inputs()
    bt[1, 1:] = 12345
    o = paged_decode(q, kc, vc, bt, sl)
    k0 = kc[2].transpose(0, 1)[None]  # sequence 1: block 2, 16 tokens
    ref = decode_ref(q[1:], k0, vc[2].transpose(0, 1)[None])
    assert rel_err(o[1:], ref) < TOL[torch.float32]
