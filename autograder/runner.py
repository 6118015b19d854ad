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


def call_to_wire(call: Call, gen_seeds=None):
    """``(header, arrays)``: everything the child needs, and nothing about expected outputs (T2).

    ``gen_seeds`` (timed calls): key -> seed for floating-point array arguments; those travel as a generator
    entry (shape, dtype, seed) instead of data, and the child makes fresh standard-normal values from the seed
    (``gen_array``). Integer arrays (seq_lens, block tables) still travel as data.
    """
    arrays = {}
    gen_seeds = gen_seeds or {}

    def desc(key, a):
        if isinstance(a, Arg) and a.is_array:
            base = {"array": key, "torch_dtype": a.torch_dtype, "requires_grad": bool(a.requires_grad)}
            if a.blocks:
                base["blocks"] = True
            if key in gen_seeds and a.value.dtype.kind == "f":
                return dict(base, gen=int(gen_seeds[key]), shape=list(a.value.shape), dtype=str(a.value.dtype))
            arrays[key] = np.ascontiguousarray(a.value)
            return base
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


def gen_array(d, device="cpu"):
    """Fresh standard-normal values for a timed call from the parent's per-rep seed (trusted harness code).

    The student child and the reference child run this same code on the same device, so both see identical
    inputs without shipping them: torch arguments are drawn on the device with a seeded ``torch.Generator``
    (float32, then cast: bf16/fp16 round to nearest even), NumPy arguments with ``np.random.default_rng(seed)``.
    The parent never needs the values: it compares the student's outputs with the reference child's.
    """
    shape = tuple(int(n) for n in d["shape"])
    if d.get("torch_dtype"):
        import torch
        g = torch.Generator(device=device)
        g.manual_seed(int(d["gen"]))
        wide = torch.float64 if d["torch_dtype"] == "float64" else torch.float32
        t = torch.randn(shape, generator=g, device=device, dtype=wide).to(getattr(torch, d["torch_dtype"]))
        if d.get("requires_grad"):
            t.requires_grad_(True)
        return t
    rng = np.random.default_rng(int(d["gen"]))
    dt = np.dtype(d["dtype"])
    if dt == np.float64:
        return rng.standard_normal(shape)
    return rng.standard_normal(shape, dtype=np.float32).astype(dt, copy=False)


_SOURCES = []      # (source, array, log) of the block sources handed out by the current call


def block_source(a: np.ndarray):
    """A read-only stand-in for ``a`` that records how it is read (a streaming test, docs/design.md §6).

    It has ``shape``, ``ndim``, ``size``, ``dtype`` and ``len``, and indexing returns a fresh copy of
    ``a[key]``; ``np.asarray`` works too, but counts as reading the whole array. The log keeps the widest
    read along the last axis (distinct column indices in one access) and the number of whole-array reads.
    The array lives only in this closure (no attribute of the object reaches it)."""
    log = {"widest": 0, "reads": 0, "whole": 0}
    cols = a.shape[-1] if a.ndim else 1

    class BlockSource:
        __slots__ = ()
        shape, ndim, size, dtype = a.shape, a.ndim, a.size, a.dtype

        def __len__(self):
            return len(a)

        def __getitem__(self, key):
            part = np.array(a[key], copy=True)
            idx = np.broadcast_to(np.arange(cols), a.shape)[key] if a.ndim else np.zeros(1, int)
            log["reads"] += 1
            log["widest"] = max(log["widest"], int(np.unique(idx).size))
            return part

        def __array__(self, dtype=None, copy=None):
            log["whole"] += 1
            return np.array(a, dtype=dtype, copy=True)

        def __repr__(self):
            return f"<read-only block source, shape {a.shape}, dtype {a.dtype}>"

    src = BlockSource()
    _SOURCES.append((src, a, log))
    return src


def materialise(header, arrays, device="cpu"):
    """Fresh argument objects: NumPy copies, or torch tensors (dtype cast exactly, on ``device``); generator
    entries (timed calls) are drawn fresh by ``gen_array``."""
    def make(d):
        if "scalar" in d:
            return d["scalar"]
        if "gen" in d:
            return gen_array(d, device)
        a = arrays[d["array"]]
        if d.get("torch_dtype"):
            import torch
            t = torch.from_numpy(np.array(a, copy=True)).to(device=device, dtype=getattr(torch, d["torch_dtype"]))
            if d.get("requires_grad"):
                t.requires_grad_(True)
            return t
        if d.get("blocks"):
            return block_source(np.array(a, copy=True))
        return np.array(a, copy=True)
    args = [make(d) for d in header["args"]]
    kwargs = {k: make(d) for k, d in header["kwargs"].items()}
    return args, kwargs


def to_numpy_view(x, native=False):
    """Host NumPy copy of an input/output that has an exact trusted type, else None. bfloat16 becomes float32,
    or with ``native`` its raw bits as int16 (half the bytes on the wire; ``from_wire`` undoes it)."""
    if type(x) is np.ndarray:
        return x
    torch = _torch()
    if torch is not None and type(x) is torch.Tensor:
        t = x.detach()
        if t.dtype == torch.bfloat16:
            t = t.contiguous().view(torch.int16) if native else t.float()
        return t.to("cpu").numpy()
    return None


def from_wire(info, a):
    """Parent side: the host float array of an output sent by ``describe(native=True)`` (bf16 bits -> float32).
    Only a reinterpretation of bits; a payload that does not fit its tag is treated as unreadable (None)."""
    if a is None or not isinstance(info, dict) or info.get("wire") != "bf16":
        return a
    if a.dtype != np.int16:
        return None
    return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def sample_output(x, seed, k):
    """``k`` elements of an exactly-typed output at indices drawn from ``seed`` (the parent sends the seed only
    after the timed call is done, so the child cannot know which elements will be checked)."""
    torch = _torch()
    n = int(x.size) if type(x) is np.ndarray else int(x.numel())
    idx = np.random.default_rng(int(seed)).integers(0, max(n, 1), size=min(k, n))
    if type(x) is np.ndarray:
        return x.reshape(-1)[idx]
    return x.detach().reshape(-1)[torch.from_numpy(idx).to(x.device)]


def describe(x, native=False, sample=None):
    """``(info, array)``: the output's exact type, dtype, shape and device, and its host array if trusted.
    ``native``: bf16 travels as int16 bits (``info["wire"] = "bf16"``); ``sample = (seed, k)``: only ``k``
    elements at seeded random indices travel (timed calls)."""
    tp = type(x)
    info = {"type": f"{tp.__module__}.{tp.__qualname__}"}
    torch = _torch()
    if isinstance(x, np.ndarray) or (torch is not None and isinstance(x, torch.Tensor)):
        info["subclass"] = tp is not np.ndarray and (torch is None or tp is not torch.Tensor)
    if tp is np.ndarray:
        info.update(dtype=str(x.dtype), shape=list(x.shape), device="cpu", exact="numpy")
        if x.dtype.kind not in "fciub":
            return info, None
        return info, (x if sample is None else sample_output(x, *sample))
    if torch is not None and tp is torch.Tensor:
        info.update(dtype=str(x.dtype).replace("torch.", ""), shape=list(x.shape), device=str(x.device),
                    exact="torch")
        if native and x.dtype == torch.bfloat16:
            info["wire"] = "bf16"
        return info, to_numpy_view(x if sample is None else sample_output(x, *sample), native)
    return info, None


def input_hashes(header, args, kwargs):
    """sha256 of every array argument as the function left it (T6)."""
    out = {}
    items = list(zip(header["args"], args)) + [(header["kwargs"][k], kwargs[k]) for k in header["kwargs"]]
    for d, obj in items:
        if "array" in d:
            view = to_numpy_view(obj)
            if d.get("blocks"):
                view = next((a for src, a, _ in _SOURCES if src is obj), None)
            out[d["array"]] = array_hash(view) if view is not None else "replaced"
    return out


def poison(arrays, device="cpu", header=None):
    """Fill freed memory with NaN so that ``np.empty``/``torch.empty`` outputs hold garbage, not answers (T7).
    Sizes come from the shipped arrays plus the generator entries of ``header`` (timed calls)."""
    sizes = [(a.size, a.dtype.kind == "f") for a in arrays.values()]
    if header is not None:
        sizes += [(int(np.prod(d["shape"])), True) for d in _entries(header) if "gen" in d]
    junk = [np.full(max(1, n), np.nan, dtype=np.float32) for n, fl in sizes if fl]
    torch = _torch()
    if torch is not None and device != "cpu":
        junk += [torch.full((max(1, n),), float("nan"), device=device) for n, _ in sizes]
    del junk


def _entries(header):
    return list(header["args"]) + list(header["kwargs"].values())


def snapshot_inputs(header, args, kwargs):
    """Copies of the array arguments of a timed call, taken before the call (on the device for tensors)."""
    items = list(zip(header["args"], args)) + [(header["kwargs"][k], kwargs[k]) for k in header["kwargs"]]
    snap = []
    for d, obj in items:
        if "array" in d:
            copy = obj.detach().clone() if hasattr(obj, "detach") else np.array(obj, copy=True)
            snap.append((d["array"], obj, copy))
    return snap


def compare_snapshot(snap):
    """key -> "same" | "modified" | "replaced" for every array argument (T6), compared on the device."""
    torch = _torch()
    out = {}
    for key, obj, copy in snap:
        if type(obj) is np.ndarray:
            same = obj.shape == copy.shape and obj.dtype == copy.dtype and bool(np.array_equal(obj, copy))
        elif torch is not None and type(obj) is torch.Tensor:
            same = bool(torch.equal(obj.detach(), copy))
        else:
            out[key] = "replaced"
            continue
        out[key] = "same" if same else "modified"
    return out


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


def call_inputs(args, kwargs):
    """The argument objects of a call, positional then keyword (what the op audit taints)."""
    return list(args) + list(kwargs.values())


def execute(fn, header, arrays, device="cpu", trace_memory=False, native=False, audit=None):
    """Call ``fn`` on fresh arguments built from the wire form; returns a result dict (no judging here).

    Keys: ``outs`` (list of describe infos), ``arrays`` (host arrays or None), ``hashes`` (inputs after the
    call), ``elapsed`` (s, trusted clock, device synchronised), ``peak`` (tracemalloc peak bytes during the
    call, when asked), ``script`` (script results), ``threads`` (threads left running after the call, T13),
    ``audit`` (with an ``audit.OpAudit``: the torch ops on input data and the Triton launches of the call).
    Exceptions raised by ``fn`` propagate to the caller.
    """
    if header["mode"] == "script":
        t0 = _clock()
        res = run_script(fn, header["script"])
        return {"outs": [], "arrays": [], "hashes": {}, "elapsed": _clock() - t0, "peak": None,
                "script": res, "threads": threading.active_count() - 1}
    _SOURCES.clear()
    args, kwargs = materialise(header, arrays, device)
    poison(arrays, device, header)
    gc.collect()
    threads_before = threading.active_count()
    if trace_memory:
        tracemalloc.start()
        tracemalloc.reset_peak()
    audited = None
    if audit is not None:
        audit.begin(call_inputs(args, kwargs))
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
        if audit is not None:
            audited = audit.end()
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
                "shape_error": f"expected a tuple of {n} outputs, got {tp}{ln}", "audit": audited}
    described = [describe(x, native) for x in items]
    res = {"outs": [d[0] for d in described], "arrays": [d[1] for d in described],
           "hashes": input_hashes(header, args, kwargs), "elapsed": elapsed, "peak": peak, "script": None,
           "threads": threading.active_count() - threads_before, "audit": audited}
    if _SOURCES:
        res["reads"] = [dict(log) for _, _, log in _SOURCES]
    return res
