"""The decode and serving benchmarks' shapes and inputs (``bench_decode``, ``bench_serving``,
``bench_mixed_batch`` and the tuning sweeps and profiles that time the same cases): bf16, ``Hq = 32``,
``Hkv = 8``, ``d = 128`` on ``reference.triton.DEVICE``."""
from __future__ import annotations

import math

import numpy as np
import torch

from reference.triton import DEVICE

HQ, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16
PER_TOKEN = HKV * D * 2 * 2  # K and V bytes of one token


def empty_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def inputs(B, N):
    """Fresh random bf16 decode inputs q (B, Hq, d), k, v (B, Hkv, N, d)."""
    return (torch.randn(B, HQ, D, device=DEVICE, dtype=DTYPE), torch.randn(B, HKV, N, D, device=DEVICE, dtype=DTYPE),
            torch.randn(B, HKV, N, D, device=DEVICE, dtype=DTYPE))


def to_paged(k, v, bs):
    """The same keys in a paged cache (num_blocks, bs, Hkv, d) with a random permutation of physical blocks."""
    B, _, N, _ = k.shape
    nb = N // bs
    perm = torch.randperm(B * nb, device=k.device)  # logical block j of sequence b -> physical perm[b*nb + j]
    kc = torch.empty(B * nb, bs, HKV, D, device=k.device, dtype=k.dtype)
    vc = torch.empty_like(kc)
    kc[perm] = k.view(B, HKV, nb, bs, D).permute(0, 2, 3, 1, 4).reshape(B * nb, bs, HKV, D)
    vc[perm] = v.view(B, HKV, nb, bs, D).permute(0, 2, 3, 1, 4).reshape(B * nb, bs, HKV, D)
    return kc, vc, perm.view(B, nb).to(torch.int32), torch.full((B,), N, dtype=torch.int32, device=k.device)


def shared_prefix_case(B, P, S, bs) -> dict:
    """A cascade case (lecture 9): ``B`` sequences that share a prefix of ``P`` tokens, each with its own suffix of
    ``S`` tokens, in one paged cache of random bf16 keys with shuffled physical blocks. Returns the cache ``kc``,
    ``vc``, the prefix also kept contiguous (``prefix_k``, ``prefix_v``: (P, Hkv, d)), the suffix tables and
    lengths (``suf_tab``, ``suf_len``: what ``cascade_decode`` reads), the whole sequences as one paged batch
    (``full_tab``, ``full_len``: what ``paged_decode`` reads) and the query ``q`` (B, Hq, d)."""
    np_, ns = P // bs, S // bs
    n_blocks = np_ + B * ns
    kc = torch.randn(n_blocks, bs, HKV, D, device=DEVICE, dtype=DTYPE)
    vc = torch.randn(n_blocks, bs, HKV, D, device=DEVICE, dtype=DTYPE)
    perm = torch.randperm(n_blocks, device=DEVICE).to(torch.int32)
    pre_tab, suf_tab = perm[:np_], perm[np_:].view(B, ns).contiguous()
    lens = lambda n: torch.full((B,), n, dtype=torch.int32, device=DEVICE)  # noqa: E731
    return dict(kc=kc, vc=vc, prefix_k=kc[pre_tab.long()].reshape(P, HKV, D),
                prefix_v=vc[pre_tab.long()].reshape(P, HKV, D), suf_tab=suf_tab, suf_len=lens(S),
                full_tab=torch.cat([pre_tab[None].expand(B, -1), suf_tab], 1).contiguous(), full_len=lens(P + S),
                q=torch.randn(B, HQ, D, device=DEVICE, dtype=DTYPE))


def shared_prefix_bytes(B, P, S) -> dict:
    """K and V bytes each pass of ``shared_prefix_case`` reads: the one-launch cascade (the prefix once, every
    suffix), ``paged_decode`` over whole sequences (the prefix B times), and the cascade's two passes."""
    per_token = HKV * D * 2 * 2
    return dict(cascade=(P + B * S) * per_token, paged=B * (P + S) * per_token, prefix_pass=P * per_token,
                suffix_pass=B * S * per_token)


def n_sets(kv_bytes, smoke: bool = False) -> int:
    """Input sets to rotate through in a graph so that one pass over them is >= 3x the L2 cache."""
    if smoke:
        return 1
    l2 = getattr(torch.cuda.get_device_properties(DEVICE), "L2_cache_size", 64 << 20)
    return int(min(32, max(1, math.ceil(3 * l2 / kv_bytes))))


def randn(*shape):
    return torch.randn(*shape, device=DEVICE, dtype=DTYPE)


def cu_of(lens):
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=DEVICE)


def paged_batch(lens, bs):
    """A paged cache holding sequences of ``lens`` tokens in randomly permuted pages; (kc, vc, table)."""
    pages = [-(-n // bs) for n in lens]
    total = sum(pages)
    perm = torch.randperm(total, device=DEVICE).to(torch.int32)
    table = torch.full((len(lens), max(pages)), -1, dtype=torch.int32, device=DEVICE)
    at = 0
    for b, p in enumerate(pages):
        table[b, :p] = perm[at:at + p]
        at += p
    return randn(total, bs, HKV, D), randn(total, bs, HKV, D), table


def contiguous(kc, table, lens):
    """The sequences' keys gathered into packed (sum(lens), Hkv, d)."""
    bs = kc.shape[1]
    return torch.cat([kc[table[b, :-(-n // bs)].long()].reshape(-1, HKV, D)[:n] for b, n in enumerate(lens)])


def prefill_case(B, n, chunk, bs):
    """The prefill inputs of bench_mixed_batch's sweeps: ``B`` chunks of ``chunk`` queries after ``n`` cached keys each, in
    ``bs``-token pages: ``(q, kc, vc, table, cu_q, cu_k, lens, k, v)``, ``k, v`` the contiguous copies of the
    cache (the baseline's inputs)."""
    kc, vc, table = paged_batch([n] * B, bs)
    q = randn(B * chunk, HQ, D)
    cu_q, cu_k = cu_of([chunk] * B), cu_of([n] * B)
    lens = torch.full((B,), n, dtype=torch.int32, device=DEVICE)
    k, v = contiguous(kc, table, [n] * B), contiguous(vc, table, [n] * B)
    return q, kc, vc, table, cu_q, cu_k, lens, k, v
