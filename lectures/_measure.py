"""Measurements the lectures print, made so that a rebuilt notebook comes out byte for byte the same."""
from __future__ import annotations

import tracemalloc


def peak_mb(fn, reps=3) -> float:
    """Peak traced allocation of ``fn()`` in MB, to 0.01 MB: the smallest of ``reps`` runs, since tracemalloc
    also counts what the notebook kernel's own threads allocate meanwhile (a few KB, different every run)."""
    peaks = []
    for _ in range(reps):
        tracemalloc.start()
        try:
            fn()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    return round(min(peaks) / 1e6, 2)
