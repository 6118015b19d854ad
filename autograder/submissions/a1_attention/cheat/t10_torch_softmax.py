"""CHEAT T10: call torch instead of implementing softmax/attention."""
import numpy as np
import torch
import torch.nn.functional as F


def safe_softmax(x, axis=-1):
    return torch.softmax(torch.from_numpy(x), dim=axis).numpy()


def online_softmax(x, block_size=128):
    return F.softmax(torch.from_numpy(x), dim=-1).numpy()


def merge_states(o_a, lse_a, o_b, lse_b):
    lse = np.logaddexp(lse_a, lse_b)
    return (np.exp(lse_a - lse)[..., None] * o_a + np.exp(lse_b - lse)[..., None] * o_b), lse


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    o = F.scaled_dot_product_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                                       is_causal=causal, scale=scale).numpy()
    return o
