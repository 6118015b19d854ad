"""Judging what a call returned (parent side, and in-process for ``check``): types, dtypes, shapes, NaN/inf
positions, relative error, unchanged inputs, memory. Returns a verdict and the anti-cheat flags it raised.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .allocator_check import check_allocator
from .compare import judge
from . import threats

_WIDTH = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


@dataclass
class Verdict:
    passed: bool
    err: float = 0.0
    message: str = ""
    flags: list = field(default_factory=list)     # (threat id, explanation)


def evaluate(call, result, sent_hashes, device="cpu", memory_limit=None) -> Verdict:
    flags = []
    if call.mode == "script":
        ok, msg = check_allocator(call.script[0][1], call.script, result.get("script"))
        return Verdict(ok, 0.0 if ok else float("inf"), msg)
    for key, h in sent_hashes.items():
        got = result.get("hashes", {}).get(key)
        if got != h:
            name = call_arg_name(call, key)
            flags.append((threats.T6, f"the call modified its input {name} (inputs must be left unchanged)"))
            return Verdict(False, float("inf"), f"input {name} was modified by the call", flags)
    if result.get("threads", 0) > 0:
        flags.append((threats.T13, f"{result['threads']} thread(s) were still running after the function returned "
                             "(work hidden from the timer)"))
        return Verdict(False, float("inf"), "left threads running after returning", flags)
    if result.get("shape_error"):
        return Verdict(False, float("inf"), result["shape_error"])
    worst, msgs = 0.0, []
    for out, info, arr, exp in zip(call.outs, result["outs"], result["arrays"], call.expected):
        want = "numpy.ndarray" if out.framework == "numpy" else "torch.Tensor"
        if info.get("exact") != out.framework:
            if info.get("subclass"):
                flags.append((threats.T14, f"{out.name} is a {info['type']}, a subclass of {want}; only exactly "
                                     f"{want} is accepted (a subclass can run code when it is read)"))
            return Verdict(False, float("inf"), f"{out.name}: returned {info['type']}, expected exactly {want}",
                           flags)
        if info.get("dtype") == "object":
            flags.append((threats.T4, f"{out.name} is an array of Python objects (only numbers travel; nothing is "
                                "unpickled)"))
            return Verdict(False, float("inf"), f"{out.name}: array of Python objects", flags)
        if info["dtype"] not in out.dtypes:
            if _WIDTH.get(info["dtype"], 99) < min(_WIDTH.get(d, 0) for d in out.dtypes):
                flags.append((threats.T12, f"{out.name} returned in {info['dtype']}, lower precision than "
                                     f"{'/'.join(out.dtypes)}"))
            return Verdict(False, float("inf"), f"{out.name}: dtype {info['dtype']}, expected "
                                                f"{' or '.join(out.dtypes)}", flags)
        if out.framework == "torch" and info.get("device", "cpu").split(":")[0] != device.split(":")[0]:
            return Verdict(False, float("inf"), f"{out.name}: on device {info['device']}, expected {device}")
        if arr is None:
            return Verdict(False, float("inf"), f"{out.name}: could not be read as an array")
        ok, err, msg = judge(arr, exp, out.tol)
        worst = max(worst, err)
        if not ok:
            msgs.append(f"{out.name}: {msg}")
    if msgs:
        return Verdict(False, worst, "; ".join(msgs), flags)
    why = streaming_violation(call, result)
    if why:
        return Verdict(False, worst, why, flags)
    if memory_limit is not None:
        peak = result.get("peak")
        if peak is None or peak > memory_limit:
            mib = (peak or 0) / 2 ** 20
            return Verdict(False, worst, f"peak traced memory {mib:.1f} MiB > limit {memory_limit / 2 ** 20:.1f} "
                                         "MiB: the N x N score matrix must not be materialised", flags)
    return Verdict(True, worst, "", flags)


def streaming_violation(call, result) -> str | None:
    """A streaming test hands the function read-only block sources (``runner.block_source``): it must read
    them only in slices of at most ``call.block_limit`` columns, never whole."""
    limit = getattr(call, "block_limit", None)
    if not limit:
        return None
    reads = result.get("reads")
    if reads is None:
        return "the block-source argument was not reported (internal)"
    for log in reads:
        if log["whole"]:
            return "converted x to an array whole (np.asarray/np.array): a streaming pass reads x[..., s:s+block_size]"
        if log["widest"] > limit:
            return (f"read {log['widest']} columns of x at once, more than block_size = {limit} (a streaming pass "
                    "reads one block at a time)")
    return None


def call_arg_name(call, key):
    names = call.arg_names
    if key.isdigit() and names and int(key) < len(names):
        return names[int(key)]
    return key if not key.isdigit() else f"#{key}"


def fmt_err(err: float) -> str:
    if err == float("inf"):
        return "-"
    return f"{err:.1e}" if np.isfinite(err) else str(err)


def audit_verdict(task, audited) -> str | None:
    """None when the op audit of a Triton part's call (``audit.OpAudit``) found nothing the task allows
    itself, else the T10 verdict, naming each op and where the submission called it (docs/design.md §6).

    Positive evidence only: a compute op (matmul, exp, a reduction, elementwise arithmetic, ``where``...)
    performed by the submission on input-derived data, or input data handed to NumPy/Python (``numpy()``,
    ``__array__``, ``tolist``, ``item``, storage access, printing most of the inputs). ``task.audit_allow``
    lists what a task may do all the same: ``"mm"`` (any), or ``"mm:1"`` (with at most one operand derived
    from the inputs: a3's Hadamard rotation ``q @ J`` by a constant matrix); ``task.audit_given`` names the
    given functions (``autograder.given``) that may compute for the task (a3b's ``attention_forward``)."""
    if not audited:
        return None
    allow = {}
    for a in getattr(task, "audit_allow", ()) or ():
        op, _, n = a.partition(":")
        allow[op] = int(n) if n else 99
    bad = []
    for f in audited.get("findings", []):
        op = f["op"].split(".", 1)[-1]
        if f.get("given") and f["given"] in (getattr(task, "audit_given", ()) or ()):
            continue
        if op in allow and f.get("tainted", 0) <= allow[op]:
            continue
        bad.append(f)
    if not bad:
        return None
    what = "; ".join(f"{f['op']} at {f['where']}" + (f" (x{f['count']})" if f.get("count", 1) > 1 else "")
                     for f in bad[:4])
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    kinds = {f["kind"] for f in bad}
    head = ("torch computed on input data in a Triton part" if kinds == {"compute"} else
            "input data left torch for NumPy/Python in a Triton part" if kinds == {"escape"} else
            "torch computed on input data, and input data left torch, in a Triton part")
    return f"{head}: {what}{more} (torch may only allocate, view, copy and cast here; the kernels compute)"
