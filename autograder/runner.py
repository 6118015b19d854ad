"""Calling a submitted function on one case: the trusted code shared by the in-notebook ``check`` (in-process)
and the sandboxed child (``autograder.child``).

A case travels as a *wire* form: a small JSON header plus named NumPy arrays (``call_to_wire``). Here it is
turned into fresh arguments (NumPy copies, or torch tensors on the grading device), the function is called, and
what it returned is described without trusting it: only an object whose type is *exactly* ``np.ndarray`` or
``torch.Tensor`` is converted to an array (a subclass could run code on conversion, T14). Inputs are hashed
after the call so the parent can see whether they were modified (T6).
"""
from __future__ import annotations

import gc
import hashlib
import numbers
import sys
import threading
import time
import tracemalloc

import numpy as np

from .specs._base import Arg, Call

_clock = time.perf_counter          # bound before any submitted code runs (T15: patched timers do not matter)


def call_to_wire(call: Call):
    """``(header, arrays)``: everything the child needs, and nothing about expected outputs (T2)."""
    arrays = {}

    def desc(key, a):
        if isinstance(a, Arg) and a.is_array:
            arrays[key] = np.ascontiguousarray(a.value)
            return {"array": key, "torch_dtype": a.torch_dtype, "requires_grad": bool(a.requires_grad)}
        v = a.value if isinstance(a, Arg) else a
        return {"scalar": v}
    header = {
        "mode": call.mode,
        "args": [desc(str(i), a) for i, a in enumerate(call.args)],
        "kwargs": {k: desc(k, a) for k, a in call.kwargs.items()},
        "n_outs": len(call.outs),
        "script": call.script,
    }
    return header, arrays


def array_hash(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _torch():
    return sys.modules.get("torch")


def materialise(header, arrays, device="cpu"):
    """Fresh argument objects: NumPy copies, or torch tensors (dtype cast exactly, on ``device``)."""
    def make(d):
        if "scalar" in d:
            return d["scalar"]
        a = arrays[d["array"]]
        if d.get("torch_dtype"):
            import torch
            t = torch.from_numpy(np.array(a, copy=True)).to(device=device, dtype=getattr(torch, d["torch_dtype"]))
            if d.get("requires_grad"):
                t.requires_grad_(True)
            return t
        return np.array(a, copy=True)
    args = [make(d) for d in header["args"]]
    kwargs = {k: make(d) for k, d in header["kwargs"].items()}
    return args, kwargs


def to_numpy_view(x):
    """Host NumPy copy of an input/output that has an exact trusted type, else None."""
    if type(x) is np.ndarray:
        return x
    torch = _torch()
    if torch is not None and type(x) is torch.Tensor:
        t = x.detach().to("cpu")
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()
    return None


def describe(x):
    """``(info, array)``: the output's exact type, dtype, shape and device, and its host array if trusted."""
    tp = type(x)
    info = {"type": f"{tp.__module__}.{tp.__qualname__}"}
    torch = _torch()
    if isinstance(x, np.ndarray) or (torch is not None and isinstance(x, torch.Tensor)):
        info["subclass"] = tp is not np.ndarray and (torch is None or tp is not torch.Tensor)
    if tp is np.ndarray:
        info.update(dtype=str(x.dtype), shape=list(x.shape), device="cpu", exact="numpy")
        if x.dtype.kind not in "fciub":
            return info, None
        return info, x
    if torch is not None and tp is torch.Tensor:
        info.update(dtype=str(x.dtype).replace("torch.", ""), shape=list(x.shape), device=str(x.device),
                    exact="torch")
        return info, to_numpy_view(x)
    return info, None


def input_hashes(header, args, kwargs):
    """sha256 of every array argument as the function left it (T6)."""
    out = {}
    items = list(zip(header["args"], args)) + [(header["kwargs"][k], kwargs[k]) for k in header["kwargs"]]
    for d, obj in items:
        if "array" in d:
            view = to_numpy_view(obj)
            out[d["array"]] = array_hash(view) if view is not None else "replaced"
    return out


def poison(arrays, device="cpu"):
    """Fill freed memory with NaN so that ``np.empty``/``torch.empty`` outputs hold garbage, not answers (T7)."""
    junk = [np.full(max(1, a.size), np.nan, dtype=np.float32) for a in arrays.values() if a.dtype.kind == "f"]
    torch = _torch()
    if torch is not None and device != "cpu":
        junk += [torch.full((max(1, a.size),), float("nan"), device=device) for a in arrays.values()]
    del junk


def sync(device):
    torch = _torch()
    if torch is not None and device != "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()          # device-wide: work on side streams is waited for too (T13)


def run_script(cls, script):
    """Drive a class (BlockAllocator) through ``script``; each op records ok/value or the exception's name.

    Ops: ``["new", n]``, ``["allocate"]``, ``["free", j]`` / ``["incref", j]`` / ``["refcount", j]`` on the block
    returned by op ``j``, ``["free_raw", b]`` / ``["incref_raw", b]`` on a literal index, ``["num_free"]``
    (attribute or method). Exceptions are caught per op so one failure does not stop the script.
    """
    results, ids, obj = [], [], None
    for op in script:
        name, val, ok = op[0], None, True
        try:
            if name == "new":
                obj = cls(op[1])
            elif name == "allocate":
                val = obj.allocate()
            elif name in ("free", "incref", "refcount"):
                val = getattr(obj, name)(ids[op[1]])
            elif name in ("free_raw", "incref_raw"):
                getattr(obj, name[:-4])(op[1])
            elif name == "num_free":
                nf = obj.num_free
                val = nf() if callable(nf) else nf
            res = {"ok": True, "value": _plain(val) if name in ("allocate", "refcount", "num_free") else None}
        except Exception as exc:  # noqa: BLE001 -- a student's exception is a result, not a grader error
            ok = False
            res = {"ok": False, "exc": type(exc).__name__, "msg": str(exc)[:200]}
        results.append(res)
        ids.append(res.get("value") if (ok and name == "allocate") else None)
    return results


def _plain(v):
    if isinstance(v, bool) or v is None:
        return repr(v) if isinstance(v, bool) else None
    if isinstance(v, numbers.Integral):
        return int(v)
    return f"<{type(v).__name__}>"


def execute(fn, header, arrays, device="cpu", trace_memory=False):
    """Call ``fn`` on fresh arguments built from the wire form; returns a result dict (no judging here).

    Keys: ``outs`` (list of describe infos), ``arrays`` (host arrays or None), ``hashes`` (inputs after the
    call), ``elapsed`` (s, trusted clock, device synchronised), ``peak`` (tracemalloc peak bytes during the
    call, when asked), ``script`` (script results), ``threads`` (threads left running after the call, T13).
    Exceptions raised by ``fn`` propagate to the caller.
    """
    if header["mode"] == "script":
        t0 = _clock()
        res = run_script(fn, header["script"])
        return {"outs": [], "arrays": [], "hashes": {}, "elapsed": _clock() - t0, "peak": None,
                "script": res, "threads": threading.active_count() - 1}
    args, kwargs = materialise(header, arrays, device)
    poison(arrays, device)
    gc.collect()
    threads_before = threading.active_count()
    if trace_memory:
        tracemalloc.start()
        tracemalloc.reset_peak()
    t0 = _clock()
    try:
        if header["mode"] == "autograd":
            out = fn(*args[:-1], **kwargs)
            torch = _torch()
            if type(out) is not torch.Tensor:
                raw = (out,)
            else:
                out.backward(args[-1])
                raw = (out,) + tuple(a.grad for a in args[:-1] if getattr(a, "requires_grad", False))
        else:
            raw = fn(*args, **kwargs)
        sync(device)
        elapsed = _clock() - t0
    finally:
        peak = None
        if trace_memory:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    n = header["n_outs"]
    if header["mode"] == "autograd":
        items = list(raw)
    elif n == 1:
        items = [raw]
    elif isinstance(raw, (tuple, list)) and type(raw) in (tuple, list) and len(raw) == n:
        items = list(raw)
    else:
        tp = type(raw).__name__
        ln = f" of length {len(raw)}" if type(raw) in (tuple, list) else ""
        return {"outs": [], "arrays": [], "hashes": input_hashes(header, args, kwargs), "elapsed": elapsed,
                "peak": peak, "script": None, "threads": threading.active_count() - threads_before,
                "shape_error": f"expected a tuple of {n} outputs, got {tp}{ln}"}
    described = [describe(x) for x in items]
    return {"outs": [d[0] for d in described], "arrays": [d[1] for d in described],
            "hashes": input_hashes(header, args, kwargs), "elapsed": elapsed, "peak": peak, "script": None,
            "threads": threading.active_count() - threads_before}
