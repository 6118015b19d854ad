"""CHEAT T14: return a lazy ndarray subclass that could compute (or lie) when it is read."""
import numpy as np


class Lazy(np.ndarray):
    def __array_finalize__(self, obj):
        pass


def safe_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).view(Lazy)


online_softmax = safe_softmax


def merge_states(o_a, lse_a, o_b, lse_b):
    lse = np.logaddexp(lse_a, lse_b)
    return (np.exp(lse_a - lse)[..., None] * o_a + np.exp(lse_b - lse)[..., None] * o_b).view(Lazy), lse.view(Lazy)


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    return np.zeros_like(q).view(Lazy)
