"""In-notebook checker: ``check("a1.safe_softmax", safe_softmax) -> bool``.

Runs the VISIBLE cases of one task in the notebook's own process (local feedback, no sandbox), compares with
the grader's float64 oracle and prints one row per case: passed, relative error vs tolerance, message. It never
raises for a failing or unimplemented student function (``NotImplementedError`` -> "not implemented yet") and
returns True iff every case passed. Hidden cases, speed and the sandbox are the grader's business.
"""
from __future__ import annotations

import os
import sys
import traceback

import numpy as np

from . import visible
from .evaluate import evaluate, fmt_err
from .runner import array_hash, execute


def _device(framework) -> str:
    if framework != "torch":
        return "cpu"
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: F811
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_visible(task_id, fn, seed=None):
    """Yield ``(test name, case_label, Verdict-like tuple)`` for every visible case of ``task_id``."""
    device = _device(visible.framework(task_id))
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    rng = np.random.default_rng(seed)
    for case in visible.cases(task_id, rng):
        if case.gpu and device == "cpu":
            continue
        test, label, call, limit = case.test, case.label, case.call, case.memory_limit
        arrays = case.arrays
        sent = {k: array_hash(a) for k, a in arrays.items()}
        try:
            result = execute(fn, case.header, arrays, device, trace_memory=limit is not None)
        except NotImplementedError:
            yield test, label, (False, float("inf"), "not implemented yet")
            continue
        except Exception as exc:  # noqa: BLE001 -- feedback, not a crash
            tb = traceback.extract_tb(exc.__traceback__)
            where = f" (line {tb[-1].lineno} in {tb[-1].name})" if tb else ""
            yield test, label, (False, float("inf"), f"{type(exc).__name__}: {exc}{where}")
            continue
        v = evaluate(call, result, sent, device, limit)
        tol = min((o.tol for o in call.outs), default=0.0)
        msg = v.message or (f"peak {result['peak'] / 2**20:.1f} MiB" if limit else "")
        yield test, label, (v.passed, v.err, msg, tol)


def check(task_id, fn, verbose=True) -> bool:
    """Run the visible cases of ``task_id`` on ``fn`` (a function, or the class for BlockAllocator)."""
    rows, all_ok = [], True
    try:
        for _test, label, res in run_visible(task_id, fn):
            ok, err, msg = res[0], res[1], res[2]
            tol = res[3] if len(res) > 3 else None
            all_ok &= ok
            rows.append((label, "PASS" if ok else "FAIL", fmt_err(err) if err != float("inf") else "-",
                         f"{tol:.0e}" if tol else "-", msg))
    except ValueError as exc:
        print(f"check: {exc}")
        return False
    if verbose:
        _print_table(task_id, rows, all_ok)
    return all_ok


def _print_table(task_id, rows, all_ok):
    head = ("case", "result", "rel. error", "tolerance", "message")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(4)]
    print(f"check {task_id}: {'all passed' if all_ok else 'some cases failed'}")
    print("  ".join(h.ljust(w) for h, w in zip(head[:4], widths)) + "  " + head[4])
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:4], widths)) + "  " + str(r[4]))
