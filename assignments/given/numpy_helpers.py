import math
import numbers

import numpy as np


def as_float(x, name):
    """Given: ``x`` as a float16/32/64 ndarray, or a TypeError that names the argument."""
    x = np.asarray(x)
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"{name} must be a float16/float32/float64 array, got dtype {x.dtype}")
    return x


def acc_dtype(*arrays):
    """Given: the accumulation dtype -- the widest input dtype, but at least float32."""
    return np.result_type(np.float32, *[a.dtype for a in arrays])


def lse_dtype(*arrays):
    """Given: float64 for float64 inputs, else float32."""
    return np.float64 if any(a.dtype == np.float64 for a in arrays) else np.float32


def positive_int(value, name):
    """Given: a positive integer (block sizes, split counts), or a TypeError/ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)
