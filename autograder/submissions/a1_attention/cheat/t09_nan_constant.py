"""CHEAT T9: constant outputs (mean of v, uniform softmax) and NaN, hoping a loose tolerance passes them."""
import numpy as np


def safe_softmax(x, axis=-1):
    return np.full_like(x, 1.0 / x.shape[axis])


def online_softmax(x, block_size=128):
    return np.full_like(x, np.nan)


def merge_states(o_a, lse_a, o_b, lse_b):
    return (o_a + o_b) / 2, np.maximum(lse_a, lse_b)


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    o = np.broadcast_to(v.mean(axis=-2, keepdims=True), q.shape[:-2] + (q.shape[-2], v.shape[-1])).astype(q.dtype)
    return (o, np.full(q.shape[:-1], np.log(k.shape[-2]), np.float32)) if return_lse else o
