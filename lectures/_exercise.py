"""Predict-then-run exercises: the student writes a guess, the cell compares it with the value it computes.

Executed headless (the lecture tests), ``guess`` is ``None`` and the cell prints the answer; a student edits the
guess and re-runs the cell. No algorithm lives here: the answer is always computed in the lecture cell itself.
"""
from __future__ import annotations

import math
import numbers


def check_guess(guess, answer, *, rel: float = 0.2, what: str = "answer") -> bool | None:
    """Print how ``guess`` compares with ``answer``; return True/False, or None when no guess was entered.

    Numbers match within relative tolerance ``rel`` (``abs`` 1e-12 around zero); anything else (a string, a
    bool, a tuple) must be equal, strings compared case-insensitively.
    """
    if not (isinstance(rel, numbers.Real) and rel >= 0):
        raise ValueError(f"rel must be a non-negative number, got {rel!r}")
    shown = f"{answer:.4g}" if isinstance(answer, numbers.Real) and not isinstance(answer, bool) else repr(answer)
    if guess is None:
        print(f"{what}: {shown}  (no guess entered: set `guess` in this cell before running it to test yourself)")
        return None
    if isinstance(answer, numbers.Real) and not isinstance(answer, bool):
        if not isinstance(guess, numbers.Real) or isinstance(guess, bool):
            raise TypeError(f"guess must be a number for this question, got {type(guess).__name__}")
        ok = math.isclose(float(guess), float(answer), rel_tol=rel, abs_tol=1e-12)
    elif isinstance(answer, str):
        ok = isinstance(guess, str) and guess.strip().lower() == answer.strip().lower()
    else:
        ok = guess == answer
    print(f"{what}: {shown}; your guess {guess!r}: {'right' if ok else 'not quite -- read the next cell for why'}")
    return ok
