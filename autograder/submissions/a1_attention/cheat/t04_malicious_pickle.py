"""CHEAT T4: return objects whose unpickling runs code."""
import numpy as np


class Evil:
    def __reduce__(self):
        return (print, ("pwned: this ran in the grader",))


def safe_softmax(x, axis=-1):
    return np.array([Evil()] * x.size, dtype=object).reshape(x.shape)


online_softmax = safe_softmax


def merge_states(o_a, lse_a, o_b, lse_b):
    return Evil(), Evil()


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    return (Evil(), Evil()) if return_lse else Evil()
