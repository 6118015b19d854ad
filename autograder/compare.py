"""Judging one output array against the float64 oracle (docs/design.md §6 correctness rules).

* the shape must match exactly (nothing is broadcast);
* NaN where the reference has none fails; +inf/-inf positions (e.g. the lse of a fully masked row) must match
  in position and sign;
* the error is relative over the whole tensor, ``||out - ref|| / ||ref||`` on the finite positions, so computing
  only a part of the output (T8) or returning a constant (T9) cannot pass on non-degenerate data.
"""
from __future__ import annotations

import numpy as np


def rel_error(out: np.ndarray, ref: np.ndarray):
    """Return ``(err, message)``: err is inf with a message when NaN/inf positions disagree."""
    a = np.asarray(out, dtype=np.float64)
    b = np.asarray(ref, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf"), f"shape {a.shape}, expected {b.shape}"
    with np.errstate(invalid="ignore", over="ignore"):
        diff = a - b
        dn = float(np.linalg.norm(diff))
    if np.isfinite(dn):          # fast path (large timed outputs): no NaN/inf anywhere, since a - b is finite
        den = float(np.linalg.norm(b))
        return (dn / den if den > 0 else dn), ""
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a & ~nan_b).any():
        n = int((nan_a & ~nan_b).sum())
        return float("inf"), f"{n} NaN value(s) where the reference has none"
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    if not np.array_equal(inf_a, inf_b) or not np.array_equal(np.sign(a[inf_a]), np.sign(b[inf_b])):
        n = int((inf_a != inf_b).sum())
        return float("inf"), f"inf/-inf at the wrong positions ({n} mismatch(es)); e.g. lse of a fully " \
                             "masked row must be -inf and nothing else"
    fin = np.isfinite(b)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.linalg.norm(np.where(fin, a - b, 0.0))
    den = np.linalg.norm(np.where(fin, b, 0.0))
    return (float(diff / den) if den > 0 else float(diff)), ""


def judge(out: np.ndarray, ref: np.ndarray, tol: float):
    """``(passed, err, message)`` for one output."""
    err, msg = rel_error(out, ref)
    if msg:
        return False, err, msg
    if not err <= tol:
        msg = f"relative error {err:.2e} > tolerance {tol:.0e}"
        if tol == 0:  # exact outputs (counts, block tables): say where, not only how much
            wrong = np.argwhere(np.asarray(out, dtype=np.float64) != np.asarray(ref, dtype=np.float64))
            first = tuple(int(i) for i in wrong[0]) if len(wrong) else ()
            msg += f"; {len(wrong)} of {np.size(ref)} entries differ, the first at index {first}"
        return False, err, msg
    return True, err, ""
