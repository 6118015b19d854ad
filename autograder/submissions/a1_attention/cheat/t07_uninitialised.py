"""CHEAT T7: return uninitialised memory, hoping it still holds a reference result."""
import numpy as np


def safe_softmax(x, axis=-1):
    return np.empty_like(x)


online_softmax = safe_softmax


def merge_states(o_a, lse_a, o_b, lse_b):
    return np.empty_like(o_a), np.empty_like(lse_a)


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    o = np.empty(q.shape, q.dtype)
    return (o, np.empty(q.shape[:-1], np.float32 if q.dtype != np.float64 else np.float64)) if return_lse else o
