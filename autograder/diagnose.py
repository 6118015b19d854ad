"""What to tell a student whose function crashed, hung, ran out of memory or hit a CUDA fault (docs/design.md §6,
T17/T20): a failed test with a diagnosis they can act on, never a flag.

A crash says nothing about intent: an unmasked ``tl.store`` on a ragged tail (the commonest Triton bug) writes
past the end of a tensor, which in Triton's interpreter corrupts memory or kills the process and on a GPU is an
illegal address. So the message names the case (shapes, lengths) and, for a tiled task, the axis whose length is
not a whole number of tiles, with the likely cause. Used by the grader (``engine``), ``check()`` and ``make check``
(``isolated``).
"""
from __future__ import annotations

import re

from .interp_bounds import MASK_HINT

# a CUDA fault leaves the process's CUDA context unusable ("sticky"): the next task needs a fresh process
CUDA_FAULT = re.compile(r"CUDA error|illegal memory access|illegal address|misaligned address|device-side assert|"
                        r"unspecified launch failure|CUDA_ERROR_|an illegal instruction", re.I)
SIGNALS = {"SIGSEGV": "a segmentation fault (a read or write outside the memory it owns)",
           "SIGBUS": "a bus error (a misaligned or out-of-range access)",
           "SIGABRT": "an abort (the C allocator found corrupted memory, often after a write past a buffer's end)",
           "SIGFPE": "an arithmetic fault", "SIGILL": "an illegal instruction"}


def is_cuda_fault(message: str) -> bool:
    """Whether an exception message is a CUDA fault (after which the process's CUDA context is broken)."""
    return bool(message) and bool(CUDA_FAULT.search(message))


def ragged_axes(tiled, params) -> list[str]:
    """``"key length Nk = 37, not a multiple of a block of 64"`` for every tiled axis of ``params`` that ends in a
    partial tile: for the spec's largest tile, or the power of two a kernel would pick for a shorter length."""
    out = []
    for t in tiled or ():
        try:
            n, tile = int(t.length(params)), int(t.tile(params))
        except (KeyError, TypeError, ValueError, IndexError):
            continue
        block = min(tile, 1 << max(0, n - 1).bit_length())
        if block > 1 and n % block:
            out.append(f"{t.axis} = {n}, not a multiple of a block of {block}")
    return out


def _what(reason: str) -> str:
    for sig, words in SIGNALS.items():
        if sig in reason:
            return words
    if "exit status 134" in reason or "exit status -6" in reason:
        return SIGNALS["SIGABRT"]
    if "exit status 139" in reason:
        return SIGNALS["SIGSEGV"]
    return ""


def out_of_bounds(fn: str, case: str, reason: str, tiled=(), params=None) -> str:
    """The failed test's output for a load or store outside every tensor of its launch, caught by the
    interpreter's bounds check (``interp_bounds``) before it could corrupt the process: ``reason`` is the
    exception's message; when it is a tile running over an edge, the ragged axes of ``case`` join its hint."""
    at = f" on {case}" if case else ""
    if f": {MASK_HINT}" not in reason:
        return f"{fn} failed{at}: {reason}"
    axes = ragged_axes(tiled, params or {})
    detail = reason.split(f": {MASK_HINT}")[0]
    return f"{fn} failed{at}: {detail}" + (f"; {'; '.join(axes)}" if axes else "") + f": {MASK_HINT}"


def crash(fn: str, case: str, kind: str, reason: str, triton: bool, tiled=(), params=None,
          timeout: float | None = None) -> str:
    """The failed test's output for a process that died (``kind`` "crash"), hung (``"timeout"``), was killed for
    memory, or raised a CUDA fault while running ``fn`` on ``case`` (its parameters, as the table prints them)."""
    axes = ragged_axes(tiled, params or {})
    at = f" on {case}" if case else ""
    if kind == "timeout":
        limit = f" within {timeout:.0f} s" if timeout else ""
        hint = ("a loop whose bound never holds (a `while`, or a `range` over the wrong length), or a kernel "
                "waiting on something that never comes?") if triton else "a loop that never ends?"
        return f"{fn} did not return{limit}{at} (the case was stopped): is there {hint}"
    if "resident memory" in reason or "out of memory" in reason or "MemoryError" in reason:
        return (f"{fn} ran out of memory{at} ({reason.split(' -- ')[-1]}): does it build a tensor much larger "
                "than the inputs (an N x N matrix, a copy per tile)?")
    cuda = is_cuda_fault(reason)
    fault = CUDA_FAULT.search(reason) if cuda else None
    what = f"a CUDA fault ({reason[fault.start():][:120].strip()})" if fault else \
        (_what(reason) or "a crash of the process running it")
    msg = f"{fn} crashed{at}: {what}"
    if triton:
        if axes:
            msg += (f"; {'; '.join(axes)}: is a tl.load/tl.store missing its mask for the last, partial tile "
                    "(e.g. `mask=offs < n`)?")
        else:
            msg += "; is a tl.load/tl.store reading or writing outside its tensor (a mask, a stride or an offset)?"
    if cuda:
        msg += " (the rest runs in a fresh process: a CUDA fault breaks the one it happened in)"
    return msg
