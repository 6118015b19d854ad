"""CHEAT T10: torch's own softmax / attention instead of Triton kernels (and no kernel launched at all)."""
import math

import torch
import torch.nn.functional as F


def softmax(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def flash_attention_forward(q, k, v, causal=False, scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float()
    s = q.float() @ k.transpose(-1, -2) * scale
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + nk - nq
        s = s.masked_fill(~keep.to(s.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    return (p @ v).to(q.dtype), lse


def flash_attention_forward_basic(q, k, v, scale=None):
    o = F.scaled_dot_product_attention(q, k, v, scale=scale)
    return o, flash_attention_forward(q, k, v, scale=scale)[1]
