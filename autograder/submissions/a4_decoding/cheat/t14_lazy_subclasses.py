"""CHEAT T14: return array/tensor subclasses (lazy objects that could compute or lie when they are read)."""
import numpy as np
import torch


class LazyArray(np.ndarray):
    pass


class LazyTensor(torch.Tensor):
    pass


def flash_decoding(q, k, v, num_splits=4, seq_lens=None, scale=None):
    o = np.zeros(q.shape, q.dtype).view(LazyArray)
    return o, np.zeros(q.shape[:-1], np.float32).view(LazyArray)


def flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None):
    return torch.zeros_like(q).as_subclass(LazyTensor)
