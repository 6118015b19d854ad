"""Input generators shared by the specs: non-uniform random data in a given dtype (docs/design.md §6: fresh
random inputs, never zeros or constants, so a partial or constant output cannot pass)."""
from __future__ import annotations

import numpy as np

from ._base import TOL, Arg, Out

NP = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


def randn(rng, shape, dtype="float32", mag=1.0) -> np.ndarray:
    """Standard normal times ``mag`` plus a random per-tensor offset pattern, rounded to ``dtype``.

    bfloat16 values are returned as float32 holding bf16-representable numbers (round to nearest even).
    """
    x = rng.standard_normal(shape) * mag
    if dtype == "bfloat16":
        return bf16_round(x)
    return x.astype(NP[dtype])


def bf16_round(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def arr(x, torch_dtype=None, requires_grad=False, blocks=False) -> Arg:
    return Arg(x, torch_dtype=torch_dtype, requires_grad=requires_grad, blocks=blocks)


def lse_dtypes(dtype: str) -> tuple:
    return ("float64",) if dtype == "float64" else ("float32", "float64")


def out(name, dtype, tol=None, framework="numpy", dtypes=None) -> Out:
    return Out(name, dtypes or (dtype,), TOL[dtype] if tol is None else tol, framework)


def ragged(rng, lo, hi, avoid=(16, 32, 64, 128)) -> int:
    """A length in [lo, hi] that is not a multiple of any common block size (ragged tails)."""
    for _ in range(100):
        n = int(rng.integers(lo, hi + 1))
        if all(n % b for b in avoid if b < n):
            return n
    return int(n)


def multi_tile(rng, tile, max_tiles=2, avoid=(16, 32, 64, 128)) -> int:
    """A length spanning >= 2 whole tiles of ``tile`` plus a ragged tail, at most ``max_tiles`` whole tiles plus
    the tail: in ``(2 tile, (max_tiles + 1) tile)``, not a multiple of ``tile`` (nor of a common block size)."""
    return ragged(rng, 2 * tile + 1, (max_tiles + 1) * tile - 1, avoid=tuple(avoid) + (int(tile),))
