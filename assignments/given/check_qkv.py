def check_qkv(q, k, v):
    """Given: validate shapes (``q (..., Hq, Nq, d)``, ``k, v (..., Hkv, Nk, d)``, ``Hq % Hkv == 0``) and return
    ``(q, k, v, group)`` with ``group = Hq // Hkv``."""
    q, k, v = as_float(q, "q"), as_float(k, "k"), as_float(v, "v")
    if q.ndim < 2 or not q.ndim == k.ndim == v.ndim:
        raise ValueError(f"q, k, v must have the same rank >= 2, got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape or q.shape[-1] != k.shape[-1] or k.shape[-2] == 0:
        raise ValueError(f"expected q (..., Nq, d) and k, v (..., Nk, d) with Nk >= 1, got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    group = 1
    if q.ndim >= 3:
        hq, hkv = q.shape[-3], k.shape[-3]
        if q.shape[:-3] != k.shape[:-3] or hkv == 0 or hq % hkv:
            raise ValueError(f"q heads Hq={hq} must be a multiple of k heads Hkv={hkv} and batch dims must "
                             f"match, got q {q.shape} and k {k.shape}")
        group = hq // hkv
    return q, k, v, group
