"""WRONG: a BlockAllocator without reference counts (free always releases, double free is silent); a correct
NumPy paged_attention; paged_decode is not written."""
import math

import numpy as np


class BlockAllocator:
    def __init__(self, num_blocks):
        self.num_blocks = num_blocks
        self.free_list = list(range(num_blocks))

    @property
    def num_free(self):
        return len(self.free_list)

    def allocate(self):
        if not self.free_list:
            raise RuntimeError("out of blocks")
        return self.free_list.pop()

    def incref(self, block):
        pass

    def refcount(self, block):
        return 0 if block in self.free_list else 1

    def free(self, block):
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"bad block {block}")
        if block not in self.free_list:
            self.free_list.append(block)


def paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
    b, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    g = hq // hkv
    ct = np.result_type(np.float32, q.dtype, k_cache.dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    o = np.zeros((b, hkv, g, d), ct)
    for i in range(b):
        n = int(seq_lens[i])
        if n == 0:
            continue
        blocks = block_tables[i, : -(-n // bs)]
        k = k_cache[blocks].reshape(-1, hkv, d)[:n].astype(ct)
        v = v_cache[blocks].reshape(-1, hkv, d)[:n].astype(ct)
        s = np.einsum("hgd,nhd->hgn", q[i].astype(ct).reshape(hkv, g, d), k) * scale
        p = np.exp(s - s.max(-1, keepdims=True))
        o[i] = np.einsum("hgn,nhd->hgd", p, v) / p.sum(-1, keepdims=True)
    return o.reshape(b, hq, d).astype(q.dtype)
