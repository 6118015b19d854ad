"""Judging what a call returned (parent side, and in-process for ``check``): types, dtypes, shapes, NaN/inf
positions, relative error, unchanged inputs, memory. Returns a verdict and the anti-cheat flags it raised.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .allocator_check import check_allocator
from .compare import judge

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
            flags.append(("T6", f"the call modified its input {name} (inputs must be left unchanged)"))
            return Verdict(False, float("inf"), f"input {name} was modified by the call", flags)
    if result.get("threads", 0) > 0:
        flags.append(("T13", f"{result['threads']} thread(s) were still running after the function returned "
                             "(work hidden from the timer)"))
        return Verdict(False, float("inf"), "left threads running after returning", flags)
    if result.get("shape_error"):
        return Verdict(False, float("inf"), result["shape_error"])
    worst, msgs = 0.0, []
    for out, info, arr, exp in zip(call.outs, result["outs"], result["arrays"], call.expected):
        want = "numpy.ndarray" if out.framework == "numpy" else "torch.Tensor"
        if info.get("exact") != out.framework:
            if info.get("subclass"):
                flags.append(("T14", f"{out.name} is a {info['type']}, a subclass of {want}; only exactly "
                                     f"{want} is accepted (a subclass can run code when it is read)"))
            return Verdict(False, float("inf"), f"{out.name}: returned {info['type']}, expected exactly {want}",
                           flags)
        if info.get("dtype") == "object":
            flags.append(("T4", f"{out.name} is an array of Python objects (only numbers travel; nothing is "
                                "unpickled)"))
            return Verdict(False, float("inf"), f"{out.name}: array of Python objects", flags)
        if info["dtype"] not in out.dtypes:
            if _WIDTH.get(info["dtype"], 99) < min(_WIDTH.get(d, 0) for d in out.dtypes):
                flags.append(("T12", f"{out.name} returned in {info['dtype']}, lower precision than "
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


TRITON_SHARE = 0.5      # least share of each output's elements that must change when the kernels' stores do


def triton_made(call, poisoned, normal_arrays, poisoned_arrays) -> str | None:
    """None when the outputs were produced by the Triton kernels, else why not (docs/design.md §6).

    ``poisoned`` is the child's report of the same call re-run with every element the Triton kernels stored
    overwritten by NaN right after each launch (``traps.poison_changed``). An output that the kernels
    produced (directly, or through torch post-processing of what they stored: a cast, a merge of partial
    results) changes; one computed by torch beside a launched kernel does not. At least ``TRITON_SHARE`` of
    the elements of every output must change (rows with nothing to attend may be written by torch), except
    an output the assignment's given code computes (``Out.from_kernels`` False: a3b's given forward)."""
    if poisoned is None:
        return None
    if poisoned.get("error"):
        return (f"re-run with the Triton kernels' stores replaced by NaN, it raised {poisoned['error']} "
                "(the output must be computed by the kernels)")
    if not poisoned.get("stores"):
        return "the launched Triton kernels stored nothing into their tensor arguments"
    for out, a, b in zip(call.outs, normal_arrays, poisoned_arrays):
        if not out.from_kernels:
            continue
        if a is None or b is None or np.shape(a) != np.shape(b) or np.size(a) == 0:
            return f"{out.name}: could not compare with the poisoned re-run"
        a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
        share = 1.0 - float(same.mean())
        if share < TRITON_SHARE:
            return (f"{out.name} is not produced by the Triton kernels: with their stores replaced by NaN, only "
                    f"{100 * share:.0f}% of it changed (torch did the work beside a launched kernel?)")
    return None
