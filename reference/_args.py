"""Argument checks every part of ``reference`` shares (NumPy, Triton, the IO model, the Hopper models, the
fragmentation simulator), written once so that each rule and each message has one home.

Every check returns the normalised value (a Python ``int``/``float``/``bool``) or raises ``TypeError`` (wrong
type) / ``ValueError`` (right type, wrong value) with a message that starts with the argument's name and says
what was expected (``docs/design.md §3``). Array and tensor checks stay with their backend
(``reference.numpy._validate``, ``reference.triton._checks``); this module needs neither torch nor an array.

The bool rule: a flag such as ``causal`` accepts ``True``/``False`` and NumPy's ``np.True_``/``np.False_``
(what indexing or comparing a NumPy array gives back), and nothing else: ``1``, ``"no"``, ``None`` and
tensors are rejected, since a truthy stand-in usually means an argument landed in the wrong slot.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["check_positive_int", "check_positive_real", "check_nonneg_real", "check_rng", "check_flag", "check_scale",
           "check_gqa", "check_dtype"]


def check_positive_int(value, name: str) -> int:
    """A block size, split count, length or similar: a positive Python/NumPy integer (bool rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def check_positive_real(value, name: str) -> float:
    """A size, bandwidth or mean: a finite real number > 0 (bool rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(float(value)) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return float(value)


def check_nonneg_real(value, name: str) -> float:
    """A cost, byte count or standard deviation: a finite real number >= 0 (bool rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_rng(rng):
    """A ``numpy.random.Generator`` (the simulations take one so that every draw is reproducible)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def check_flag(value, name: str) -> bool:
    """An on/off option (``causal``, ``validate``, ``return_lse``): ``bool`` or ``np.bool_``, as a Python bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool (True or False), got {value!r}")
    return bool(value)


def check_scale(scale, d: int) -> float:
    """The softmax scale: ``None`` means ``1/sqrt(d)``; otherwise a finite real number."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {scale!r}")
    if not math.isfinite(float(scale)):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def check_gqa(hq: int, hkv: int, q_name: str = "Hq", kv_name: str = "Hkv") -> int:
    """GQA/MQA head counts: ``hq`` query heads share ``hkv`` kv heads, so ``hkv >= 1`` divides ``hq``; query head
    ``h`` reads kv head ``h // group``. Returns ``group = hq // hkv``."""
    if hkv <= 0 or hq % hkv != 0:
        raise ValueError(f"the number of query heads {q_name}={hq} must be a multiple of the kv heads "
                         f"{kv_name}={hkv} (GQA)")
    return hq // hkv


def _dtype_name(dtype) -> str:
    name = getattr(dtype, "__name__", None) if isinstance(dtype, type) else None
    return name or str(dtype).replace("torch.", "")


def check_dtype(dtype, allowed, name: str):
    """``dtype`` (of argument ``name``) is one of ``allowed`` (NumPy scalar types or torch dtypes)."""
    if dtype not in allowed:
        names = [_dtype_name(d) for d in allowed]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise TypeError(f"{name} must have dtype {listed}, got {_dtype_name(dtype)}")
    return dtype
