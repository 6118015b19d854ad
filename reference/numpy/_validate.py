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


# lengths, block tables and paged caches (decoding, paged, varlen, mixed, serving)
def check_seq_lens(seq_lens, batch: int, max_len: int, name: str = "seq_lens") -> np.ndarray:
    """Validate per-sequence lengths: ``(batch,)`` integers in ``[0, max_len]``; returns an int64 array."""
    if isinstance(seq_lens, np.ndarray):
        arr = seq_lens
    elif isinstance(seq_lens, (list, tuple)):
        arr = np.asarray(seq_lens)
        if arr.size == 0:
            arr = arr.astype(np.int64)
    else:
        raise TypeError(f"{name} must be a 1-D integer array of shape ({batch},), got {type(seq_lens).__name__}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.shape != (batch,):
        raise ValueError(f"{name} must have shape (B,) = ({batch},), got {arr.shape}")
    if batch and (arr.min() < 0 or arr.max() > max_len):
        raise ValueError(f"{name} entries must lie in [0, {max_len}], got min {arr.min()} and max {arr.max()}")
    return arr.astype(np.int64)


def check_block_tables(block_tables, seq_lens, batch: int, num_blocks: int, block_size: int):
    """Validate a padded block table batch and lengths; returns ``(tables int64, lens int64)``.

    Rules: ``block_tables`` is a 2-D integer array ``(B, max_blocks)``; entries are ``-1`` (padding) or in
    ``[0, num_blocks)``; in a row, ``-1`` only follows valid entries; a row has at least
    ``ceil(seq_len / block_size)`` valid entries.
    """
    if not isinstance(block_tables, np.ndarray):
        raise TypeError(f"block_tables must be a numpy integer array (B, max_blocks), got "
                        f"{type(block_tables).__name__}")
    if block_tables.dtype.kind not in "iu":
        raise TypeError(f"block_tables must hold integers (int32), got dtype {block_tables.dtype}")
    if block_tables.ndim != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must have shape (B, max_blocks) with B={batch}, got {block_tables.shape}")
    tables = block_tables.astype(np.int64)
    width = tables.shape[1]
    lens = check_seq_lens(seq_lens, batch, width * block_size)
    if tables.size and (tables.min() < -1 or tables.max() >= num_blocks):
        raise ValueError(f"block_tables entries must be -1 (padding) or in [0, {num_blocks}), got min "
                         f"{tables.min()} and max {tables.max()}")
    valid = tables >= 0
    n_valid = valid.sum(axis=1)
    if not np.array_equal(valid, np.arange(width)[None, :] < n_valid[:, None]):
        bad = int(np.nonzero((valid != (np.arange(width)[None, :] < n_valid[:, None])).any(axis=1))[0][0])
        raise ValueError(f"block_tables row {bad} has a valid block after a -1; padding must come last")
    need = -(-lens // block_size)
    short = np.nonzero(n_valid < need)[0]
    if short.size:
        b = int(short[0])
        raise ValueError(f"block_tables row {b} has {n_valid[b]} block(s) but seq_lens[{b}]={lens[b]} needs "
                         f"{need[b]} of block_size {block_size}")
    return tables, lens


def check_paged_caches(k_cache, v_cache, d: int, hq: int):
    """``k_cache, v_cache (num_blocks, block_size, Hkv, d)`` float arrays of one shape, matching the queries'
    ``d``, with ``block_size >= 1`` and ``Hq % Hkv == 0`` (GQA); returns them as arrays."""
    k_cache = as_float_array(k_cache, "k_cache")
    v_cache = as_float_array(v_cache, "v_cache")
    if k_cache.ndim != 4:
        raise ValueError(f"k_cache must have shape (num_blocks, block_size, Hkv, d), got {k_cache.shape}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have the shape of k_cache {k_cache.shape}, got {v_cache.shape}")
    _, bs, hkv, dk = k_cache.shape
    if dk != d:
        raise ValueError(f"q and k_cache must have the same head dimension d, got q d={d} and k_cache d={dk}")
    check_gqa(hq, hkv)
    if bs == 0:
        raise ValueError(f"k_cache block_size (axis 1) must be positive, got shape {k_cache.shape}")
    return k_cache, v_cache


def check_cu_seqlens(cu, name: str, total: int, batch: int | None = None) -> np.ndarray:
    """Validate cumulative sequence lengths; return them as int64.

    ``cu`` is a 1-D integer array of ``B + 1 >= 2`` entries with ``cu[0] == 0``, ``cu[b] <= cu[b+1]`` and
    ``cu[-1] == total`` (the packed tensor's token count). ``batch`` (if given) fixes ``B``.
    """
    if isinstance(cu, (list, tuple)):
        cu = np.asarray(cu)
    if not isinstance(cu, np.ndarray):
        raise TypeError(f"{name} must be a 1-D numpy integer array (B + 1,), got {type(cu).__name__}")
    if cu.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (int32), got dtype {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must have shape (B + 1,) with B >= 1, got {cu.shape}")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"{name} must have B + 1 = {batch + 1} entries (as cu_seqlens_q), got {cu.shape[0]}")
    cu = cu.astype(np.int64)
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {name}[0] = {cu[0]}")
    step = np.diff(cu)
    if (step < 0).any():
        b = int(np.nonzero(step < 0)[0][0])
        raise ValueError(f"{name} must be non-decreasing (cumulative lengths), got {name}[{b}] = {cu[b]} > "
                         f"{name}[{b + 1}] = {cu[b + 1]}")
    if cu[-1] != total:
        raise ValueError(f"{name}[-1] must equal the number of packed tokens {total}, got {cu[-1]}")
    return cu
