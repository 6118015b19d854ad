"""In-notebook checker: ``check("a1.safe_softmax", safe_softmax) -> bool``.

Runs the VISIBLE cases of one task in the notebook's own process (local feedback, no sandbox), compares with
the grader's float64 oracle and prints one row per case: passed, relative error vs tolerance, message. It never
raises for a failing or unimplemented student function (``NotImplementedError`` -> "not implemented yet") and
returns True iff every case passed. Hidden cases, speed and the sandbox are the grader's business. The cases
run in a forked worker (``isolated.ForkWorker``) where this process has no CUDA context: a kernel that crashes
or hangs fails its case with a diagnosis, and the notebook's kernel lives on.

For every failing case it also prints the case's parameters (argument shapes and dtypes, scalar arguments such
as block sizes) and a one-line call that reproduces it: the inputs stay in ``check.failed`` after the call, so
``out = fn(*check.failed[0].args, **check.failed[0].kwargs)`` runs the student's function on exactly that case.
"""
from __future__ import annotations

import inspect
import os
import sys
from dataclasses import dataclass, field

import numpy as np

from . import host_policy, visible
from .diagnose import is_cuda_fault
from .evaluate import evaluate, fmt_err
from .runner import array_hash, execute, materialise
from .where import exc_line, root


def _device(framework) -> str:
    if framework != "torch":
        return "cpu"
    torch = sys.modules.get("torch")
    if torch is None:
        import torch  # noqa: F811
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class FailedCase:
    """One failing visible case, kept so the student can re-run it: ``fn(*c.args, **c.kwargs)``."""
    label: str
    mode: str                          # "call", "autograd" (last arg is dO) or "script" (a class driven by script)
    args: list = field(default_factory=list)
    kwargs: dict = field(default_factory=dict)
    script: list | None = None
    params: str = ""                   # the parameters as printed
    crashed: bool = False              # it crashed or hung the worker: running it here would do the same

    def run(self, fn):
        """Call ``fn`` on this case's inputs the way the grader does; returns its output(s)."""
        if self.mode == "script":
            from .runner import run_script
            return run_script(fn, self.script)
        if self.mode == "autograd":
            out = fn(*self.args[:-1], **self.kwargs)
            out.backward(self.args[-1])
            return out
        return fn(*self.args, **self.kwargs)


def _describe(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and getattr(value, "dtype", None) is not None:
        dt = str(value.dtype).replace("torch.", "")
        return f"{dt} {tuple(int(n) for n in shape)}"
    return repr(value)


def describe_case(fn, case, args, kwargs) -> str:
    """``name: float32 (2, 4, 50, 32), ..., causal=True, block_q=32``: what a failing case was called with."""
    if case.header["mode"] == "script":
        return f"script of {len(case.header['script'] or [])} operations"
    try:
        names = [n for n in inspect.signature(fn).parameters]
    except (TypeError, ValueError):
        names = list(getattr(case.call, "arg_names", None) or [])
    pos = args[:-1] if case.header["mode"] == "autograd" else args
    parts = [f"{names[i] if i < len(names) else f'arg{i}'}: {_describe(a)}" for i, a in enumerate(pos)]
    parts += [f"{k}: {_describe(v)}" if hasattr(v, "shape") else f"{k}={v!r}" for k, v in kwargs.items()]
    if case.header["mode"] == "autograd":
        parts.append(f"then backward with dO: {_describe(args[-1])}")
    return ", ".join(parts)


def reproduce_line(fn, index: int, mode: str) -> str:
    """The one line that re-runs ``check.failed[index]`` in the notebook."""
    name = getattr(fn, "__name__", "fn")
    if mode == "script":
        return f"check.failed[{index}].run({name})   # drives {name} through the case's script"
    c = f"check.failed[{index}]"
    if mode == "autograd":
        return f"out = {name}(*{c}.args[:-1], **{c}.kwargs); out.backward({c}.args[-1])"
    return f"out = {name}(*{c}.args, **{c}.kwargs)"


NOT_IMPLEMENTED = "not implemented yet"


def run_case(case, fn, device):
    """Run ``fn`` on one visible case and judge it: ``(passed, rel. error, message, tolerance)``. Never raises
    for the student's exceptions: ``NotImplementedError`` (also inside a Triton kernel) is "not implemented yet",
    another exception its type, message and innermost place in the student's code (``where.exc_line``: the
    kernel's own line for an error inside a Triton kernel)."""
    call, limit = case.call, case.memory_limit
    sent = {k: array_hash(a) for k, a in case.arrays.items()}
    guard = None
    try:
        # the host policy of Triton parts (``host_policy``), as in grading
        fn, guard = host_policy.for_check(case.test.split(":")[0], fn, case.header["mode"])
        result = execute(fn, case.header, case.arrays, device, trace_memory=limit is not None)
    except Exception as exc:  # noqa: BLE001 -- feedback, not a crash
        if isinstance(root(exc), NotImplementedError):
            return False, float("inf"), NOT_IMPLEMENTED, None
        return False, float("inf"), exc_line(exc), None
    finally:
        if guard is not None:
            guard.end()
    v = evaluate(call, result, sent, device, limit)
    tol = min((o.tol for o in call.outs), default=0.0)
    msg = v.message or (f"peak {result['peak'] / 2**20:.1f} MiB" if limit else "")
    return v.passed, v.err, msg, tol


def needs_message(case, device) -> str | None:
    """"not run: needs sm_90 ..." where ``case`` cannot run on this machine, as the grader decides
    (``Grader.not_run_here``): a ``gpu_only`` case on a CPU, or a GPU below its compute capability; else None.
    (A case with a capability but not ``gpu_only``, a3's FP8 part, runs in the interpreter on a CPU.)"""
    need = tuple(case.needs) if case.needs else None
    if device == "cpu":
        if not case.gpu_only:
            return None
        where = f"sm_{need[0]}{need[1]} (a GPU of compute capability {need[0]}.{need[1]}" + \
            (", Hopper)" if need == (9, 0) else ")") if need else "a GPU"
        return f"not run: needs {where}; this machine has no GPU"
    if need:
        import torch
        have = tuple(torch.cuda.get_device_capability())
        if have < need:
            return f"not run: needs sm_{need[0]}{need[1]}; this GPU is sm_{have[0]}{have[1]}"
    return None


def _worker(task_id, fn, device):
    """A forked worker for the cases of ``fn`` (``isolated.ForkWorker``), or None where fork cannot be used (this
    process holds a CUDA context) or ``AUTOGRADER_CHECK_INPROCESS=1`` asks for the notebook's own process."""
    from .isolated import ForkWorker
    if os.environ.get("AUTOGRADER_CHECK_INPROCESS") == "1" or not ForkWorker.possible():
        return None
    return ForkWorker(lambda name: fn, lambda tid: device, run_case)


def _isolated_case(worker, task_id, fn, case, device):
    """``run_case`` in the worker; a crash or hang of the worker is the case's failure, with a diagnosis."""
    from .isolated import Died, case_timeout, crash_message
    res, printed = worker.run(task_id, getattr(fn, "__name__", "fn"), case, case_timeout(task_id))
    if printed:
        print(printed, end="")
    if isinstance(res, Died):
        name = getattr(fn, "__name__", task_id.split(".", 1)[-1])
        return False, float("inf"), crash_message(task_id, name, case, res, visible.framework(task_id) == "torch"), \
            None
    return res


def _in_process_case(task_id, fn, case, device):
    res = run_case(case, fn, device)
    if not res[0] and is_cuda_fault(str(res[2])):
        return (res[0], res[1], f"{res[2]} -- a CUDA fault breaks this process's CUDA context: restart the "
                "kernel before running anything else on the GPU (is a tl.load/tl.store missing its mask?)", res[3])
    return res


def _run_cases(task_id, fn, seed=None):
    """Yield ``(test, label, result tuple, case, device)`` for every visible case of ``task_id``; a case this
    machine cannot run (``Case.needs``) yields ``(None, inf, "not run: ...")``."""
    device = _device(visible.framework(task_id))
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    rng = np.random.default_rng(seed)
    worker = _worker(task_id, fn, device)
    try:
        yield from _cases_through(task_id, fn, rng, device, worker)
    finally:
        if worker is not None:
            worker.close()


def _cases_through(task_id, fn, rng, device, worker):
    for case in visible.cases(task_id, rng):
        why = needs_message(case, device)
        if why:
            yield case.test, case.label, (None, float("inf"), why), case, device
            continue
        if (case.gpu and device == "cpu") or (case.call is None and case.parent is None):
            continue                                  # a GPU-only bf16 case; a "needs" row that can run here
        if case.parent is not None:                   # a compile-only check (a7): judged like the grader's
            from .local_checks import run_parent_check
            ok, msg = run_parent_check(case.parent, fn)
            yield case.test, case.label, (ok, float("inf"), msg), case, device
            continue
        res = _isolated_case(worker, task_id, fn, case, device) if worker is not None else \
            _in_process_case(task_id, fn, case, device)
        yield case.test, case.label, res if res[3] is not None else res[:3], case, device


def run_visible(task_id, fn, seed=None):
    """Yield ``(test name, case_label, Verdict-like tuple)`` for every visible case of ``task_id``."""
    for test, label, res, _case, _device_ in _run_cases(task_id, fn, seed):
        yield test, label, res


def check(task_id, fn, verbose=True, seed=None) -> bool:
    """Run the visible cases of ``task_id`` on ``fn`` (a function, or the class for BlockAllocator).

    Failing cases are kept in ``check.failed`` (a list of ``FailedCase``) until the next call. ``seed``: the
    random values of the cases (default: fresh ones each call; the common-bugs guide fixes it).
    """
    rows, all_ok, failed = [], True, []
    check.failed = failed
    try:
        for _test, label, res, case, device in _run_cases(task_id, fn, seed):
            ok, err, msg = res[0], res[1], res[2]
            tol = res[3] if len(res) > 3 else None
            if ok is None:                            # not run on this machine (needs sm_90): no verdict
                rows.append((label, "NOT RUN", "-", "-", msg))
                continue
            all_ok &= ok
            rows.append((label, "PASS" if ok else "FAIL", fmt_err(err) if err != float("inf") else "-",
                         f"{tol:.0e}" if tol else "-", msg))
            if not ok and msg != NOT_IMPLEMENTED and case.call is not None:
                args, kwargs = materialise(case.header, case.arrays, device)
                crashed = " crashed" in msg or " did not return" in msg
                failed.append(FailedCase(label, case.header["mode"], args, kwargs, case.header.get("script"),
                                         describe_case(fn, case, args, kwargs), crashed))
    except ValueError as exc:
        print(f"check: {exc}")
        return False
    if verbose:
        _print_table(task_id, rows, all_ok)
        for i, c in enumerate(failed):
            print(f"failed case {i} ({c.label}): {c.params}")
            print(f"  reproduce: {reproduce_line(fn, i, c.mode)}")
            if c.crashed:
                print("  (it crashed or hung a separate process: run here, it would take the notebook's kernel "
                      "with it; fix the kernel first, or run it in a fresh kernel)")
    return all_ok


check.failed = []


def _print_table(task_id, rows, all_ok):
    head = ("case", "result", "rel. error", "tolerance", "message")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(4)]
    print(f"check {task_id}: {'all passed' if all_ok else 'some cases failed'}")
    print("  ".join(h.ljust(w) for h, w in zip(head[:4], widths)) + "  " + head[4])
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r[:4], widths)) + "  " + str(r[4]))
