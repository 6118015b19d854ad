"""Input checks shared by the NumPy reference (docs/design.md §3).

Every public function validates its inputs with these helpers, so bad input fails early with a message that
names the argument and what was expected. Nothing is silently broadcast.
"""
from __future__ import annotations

import numpy as np

# the checks every part shares; re-exported so the NumPy modules import their checks from one place
from .._args import check_dtype, check_flag, check_gqa, check_positive_int, check_scale  # noqa: F401

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def as_float_array(x, name: str, min_ndim: int = 1) -> np.ndarray:
    """Return ``x`` as a float16/32/64 ndarray, or raise TypeError/ValueError naming ``name``."""
    if isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, (list, tuple)) or np.isscalar(x):
        arr = np.asarray(x)
        if arr.dtype.kind in "iub":
            raise TypeError(f"{name} must be a floating-point array (float16/32/64), got {arr.dtype} values")
        if arr.dtype.kind == "f" and arr.dtype not in FLOAT_DTYPES:
            arr = arr.astype(np.float64)
    else:
        raise TypeError(f"{name} must be a numpy.ndarray of float16/32/64, got {type(x).__name__}")
    check_dtype(arr.dtype.type, FLOAT_DTYPES, name)
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {arr.shape}")
    return arr


def check_float_dtype(dtype) -> np.dtype:
    """A ``dtype=`` argument (a cache's storage dtype): float16, float32 or float64, as an ``np.dtype``."""
    if dtype is None:  # np.dtype(None) would silently mean float64
        raise TypeError("dtype must be float16, float32 or float64, got None")
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype must be float16, float32 or float64, got {dtype!r}") from exc
    if dt not in (np.float16, np.float32, np.float64):
        raise TypeError(f"dtype must be float16, float32 or float64, got {dt}")
    return dt


def compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """Accumulation dtype: the widest input dtype, but at least float32 (docs/design.md §3)."""
    return np.result_type(np.float32, *[a.dtype for a in arrays])


def lse_dtype(*arrays: np.ndarray) -> np.dtype:
    """dtype of returned log-sum-exp values: float64 for float64 inputs, else float32."""
    return np.dtype(np.float64) if any(a.dtype == np.float64 for a in arrays) else np.dtype(np.float32)


def check_qkv(q, k, v):
    """Validate attention inputs and return ``(q, k, v, group)``.

    Layout (docs/design.md §3): single head ``q (Nq, d)``, ``k, v (Nk, d)``; or with leading dims
    ``q (..., Hq, Nq, d)``, ``k, v (..., Hkv, Nk, d)``. Leading dims other than the head axis must match exactly;
    ``Hq % Hkv == 0``
    and query head ``h`` reads kv head ``h // (Hq // Hkv)`` (GQA/MQA). ``group = Hq // Hkv`` (1 for rank 2).
    """
    q = as_float_array(q, "q", min_ndim=2)
    k = as_float_array(k, "k", min_ndim=2)
    v = as_float_array(v, "v", min_ndim=2)
    if not (q.ndim == k.ndim == v.ndim):
        raise ValueError(f"q, k and v must have the same rank, got q {q.shape}, k {k.shape}, v {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (..., Hkv, Nk, d), got k {k.shape} and v {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dimension d, got q d={q.shape[-1]} and k d={k.shape[-1]}")
    if q.shape[-1] == 0:
        raise ValueError(f"head dimension d must be positive, got q shape {q.shape}")
    if k.shape[-2] == 0:
        raise ValueError(f"k and v need at least one key (Nk >= 1), got k shape {k.shape}")
    group = 1
    if q.ndim >= 3:
        hq, hkv = q.shape[-3], k.shape[-3]
        if q.shape[:-3] != k.shape[:-3]:
            raise ValueError(
                f"q and k must have the same batch dimensions, got q {q.shape[:-3]} and k {k.shape[:-3]} "
                f"(shapes q {q.shape}, k {k.shape}); nothing is broadcast")
        group = check_gqa(hq, hkv)
    return q, k, v, group


def repeat_kv(x: np.ndarray, group: int) -> np.ndarray:
    """Expand kv heads to query heads for GQA: query head h reads kv head h // group (docs/design.md §3)."""
    if group == 1 or x.ndim < 3:
        return x
    return np.repeat(x, group, axis=-3)
