"""The sandboxed child: runs ONE submission's code and answers the parent's calls over the protocol pipe.

Started by ``autograder.launch`` as ``python -I -S -c BOOT <config> <rfd> <wfd> <status>`` in its own
namespaces, session, temp dir, scrubbed environment and rlimits; ``config`` holds its import path (a copy of
the child modules and the Python environment, never the course checkout) and the directories it must not
read, which an audit hook enforces (``traps.install_audit``). It never sees expected outputs or the secret seed (T2): it gets inputs,
calls the function, and sends back what came out (``.npy`` + JSON, T4). A *trusted* child (the reference
implementation for speed baselines) runs the same code without traps.

Messages (parent -> child): ``load`` (cells), ``call`` (task, case), ``go`` (start a timed call), ``fetch``
(after a timed call: which outputs to send back, whole or a seeded sample), ``probe`` / ``compile`` (a compile
child's compile-only checks, ``gluon_child``), ``exit``.
Messages (child -> parent): ``hello``, ``loaded``, ``trap`` (at once, T11), ``armed``/``done`` (timed calls),
``result``, ``error``.
"""
from __future__ import annotations

import contextlib
import gc
import linecache
import os
import sys
import threading
import types

import numpy as np

from .device_clock import device_time
from .protocol import ChildChannel
from .runner import _clock, compare_snapshot, describe, execute, materialise, poison, snapshot_inputs, sync
from .where import CELL_LABELS, exc_line, root, student_tb

NS_NAME = "__main__"


class Child:
    def __init__(self, chan: ChildChannel):
        self.chan = chan
        self.ns = {"__name__": NS_NAME, "__builtins__": __builtins__}
        self.traps = None
        self.device = "cpu"
        self.flush_buf = None
        self.audit = None          # audit.OpAudit of the graded calls of Triton parts (torch assignments)
        self.frozen = False        # gc.freeze() done (first load)
        self.policy = None         # host_policy.CellCompiler: deny by default in Triton parts' host code

    def report(self, threat, what):
        try:
            self.chan.send({"t": "trap", "threat": threat, "what": what})
        except OSError:
            pass

    def load(self, h):
        self.device = h.get("device", "cpu")
        if h.get("torch"):
            import torch
            import triton  # noqa: F401
            import triton.language  # noqa: F401
            if self.device.startswith("cuda"):
                torch.cuda.init()
                self.flush_buf = torch.empty(256 << 20, dtype=torch.int8, device=self.device)
        if not self.frozen:
            # what the harness imported (torch, Triton: 200k objects) stays for the child's life: out of the
            # collector's sight, ``runner.execute``'s gc.collect() before every call costs microseconds, not 0.1 s
            gc.collect()
            gc.freeze()
            self.frozen = True
        if h.get("compile_only"):
            from . import gluon_child  # noqa: F401 -- imported before the snapshot: patching it is seen (T3)
            import triton.experimental.gluon._runtime  # noqa: F401
        if h.get("torch"):
            from .audit import LaunchHook, OpAudit
            LaunchHook.install()
            self.audit = OpAudit(h.get("given"))
            LaunchHook.audit = self.audit
            if self.device == "cpu":             # the interpreter: an access outside the tensors is an error
                from . import interp_bounds, interp_fast
                interp_bounds.install()
                interp_fast.install()
        stub = types.ModuleType("autograder.check")
        stub.check = lambda *a, **k: True
        sys.modules["autograder.check"] = stub
        if not h.get("trusted"):
            from .traps import Traps
            self.traps = Traps(self.ns, self.report, h.get("forbidden", ()))
            self.traps.install()
            self.traps.take_snapshot()
        if h.get("policy") is not None and not h.get("trusted"):   # host_policy: Triton parts' host code
            from .host_policy import CellCompiler
            self.policy = CellCompiler(self.ns, h["policy"], self.report)
        cells = []
        t0 = _clock()
        for i, cell in enumerate(h["cells"]):
            index, src = cell[0], cell[1]
            ok, err = True, None
            fname = f"<cell {index}>"
            if len(cell) > 2 and cell[2]:
                CELL_LABELS[fname] = cell[2]         # messages name the cell as Jupyter shows it: "cell [5]"
            try:
                # register the cell's text like Jupyter does, so inspect.getsource works (Triton's @jit needs it
                # on a GPU, and tracebacks show the line)
                linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
                code = self.policy.compile(index, src, fname) if self.policy else compile(src, fname, "exec")
                self._active(True)
                try:
                    exec(code, self.ns)  # noqa: S102 -- running the submission is the point
                finally:
                    self._active(False)
            except BaseException as exc:  # noqa: BLE001 -- a failing cell is recorded, the rest still runs
                ok, err = False, _exc_line(exc)
            cells.append({"index": index, "ok": ok, "error": err})
        names = {}
        for name in h.get("names", ()):
            obj = self.ns.get(name)
            names[name] = None if obj is None else ("class" if isinstance(obj, type) else
                                                    "callable" if callable(obj) else type(obj).__name__)
        self.chan.send({"t": "loaded", "cells": cells, "names": names, "load_time": _clock() - t0,
                        "patched": self.traps.patched() if self.traps else [],
                        "threads": threading.active_count() - 1})

    def _active(self, on):
        if self.traps is not None:
            self.traps.active = on

    def call(self, h, arrays):
        fn = self.ns.get(h["name"])
        header = h["header"]
        if self.policy is not None:              # host_policy: the task's allowances, autograd's source
            fn = self.policy.wrap(fn, h["name"], header["mode"])
        if self.traps:
            self.traps.launches = 0
        try:
            if h.get("timed"):
                result = self._timed(fn, header, arrays, self.audit if h.get("audit") else None)
            else:
                self._active(True)
                try:
                    result = execute(fn, header, arrays, self.device, trace_memory=h.get("trace_memory", False),
                                     native=True, audit=self.audit if h.get("audit") else None)
                finally:
                    self._active(False)
        except BaseException as exc:  # noqa: BLE001 -- the student's exception is the answer
            self._active(False)
            if self.policy is not None:
                self.policy.end()
            r = root(exc)                    # a Triton InterpreterError: the kernel's own exception
            self.chan.send({"t": "error", "exc": type(r).__name__, "msg": str(r)[:500],
                            "tb": _student_tb(exc), "launches": self.traps.launches if self.traps else None,
                            "patched": self.traps.patched() if self.traps else []})
            return
        if self.policy is not None:
            self.policy.end()
            result["kernels"] = self.policy.guard.take_launched()   # for the GPU-target compile check
        arrs = {str(i): a for i, a in enumerate(result.pop("arrays"))}
        result.update(t="result", launches=self.traps.launches if self.traps else None,
                      patched=self.traps.patched() if self.traps else [])
        self.chan.send(result, arrs)

    def checked(self, h):
        """A compile child's request (``probe`` / ``compile``, ``gluon_child``): run with the traps active, send
        back raw material (ints, PTX and cubin bytes) for the parent to judge."""
        from . import gluon_child
        self._active(True)
        try:
            if h["t"] == "probe":
                out, arrs = {"values": gluon_child.probe(self.ns, h["name"], h["args"])}, None
            elif h["t"] == "tcompile":           # host_policy: a Triton kernel through the sm_90a frontend
                from .host_guard import compile_frontend
                out, arrs = {"compiled": compile_frontend(self.ns, h["name"], h["signature"], h["constexprs"])}, None
            else:
                out, arrs = gluon_child.compile_kernel(self.ns, h["name"], h["signature"], h["constexprs"],
                                                       h["num_warps"], h.get("maxnreg"))
        except BaseException as exc:  # noqa: BLE001 -- the submission's exception is the answer
            self._active(False)
            r = root(exc)
            self.chan.send({"t": "error", "exc": type(r).__name__, "msg": str(r)[-500:], "tb": _student_tb(exc),
                            "patched": self.traps.patched() if self.traps else []})
            return
        self._active(False)
        out.update(t="result", patched=self.traps.patched() if self.traps else [])
        self.chan.send(out, arrs)

    def _timed(self, fn, header, arrays, audit=None):
        """A timed call: arguments ready (drawn here from the parent's seeds, nothing large travels), caches
        flushed, then the parent says go and its clock runs too. After ``done`` the parent says which outputs
        to send: all of them, or a sample at indices from a seed the child could not know in advance (T16)."""
        args, kwargs = materialise(header, arrays, self.device)
        snap = snapshot_inputs(header, args, kwargs)
        poison(arrays, self.device, header)
        if self.flush_buf is not None:
            self.flush_buf.zero_()               # flush L2 between timed runs
        sync(self.device)
        self.chan.send({"t": "armed"})
        go, _ = self.chan.recv()
        if go.get("t") != "go":
            raise RuntimeError("protocol: expected go")
        threads_before = threading.active_count()
        audited = None
        if audit is not None:
            audit.begin(list(args) + list(kwargs.values()))
        # the device's own clock (every kernel, copy and fill of the call, on any stream) around the host clock:
        # the parent grades the ratio of device times where both children have them (device_clock.py).
        # host_policy: the unaudited timed reps run the submission's code as written (the guards' cost is not
        # the student's); the audited warm-up rep runs guarded
        plain = self.policy.plain() if self.policy is not None and audit is None else contextlib.nullcontext()
        with device_time(self.device) as dev:
            self._active(True)
            try:
                plain.__enter__()
                t0 = _clock()
                if header["mode"] == "autograd":     # forward + backward, as training would run it
                    out = fn(*args[:-1], **kwargs)
                    if type(out) is sys.modules["torch"].Tensor:
                        out.backward(args[-1])
                    raw = (out,) + tuple(a.grad for a in args[:-1] if getattr(a, "requires_grad", False))
                else:
                    raw = fn(*args, **kwargs)
                sync(self.device)                    # device-wide: side streams are waited for (T13)
                elapsed = _clock() - t0
            finally:
                plain.__exit__(None, None, None)
                self._active(False)
                if audit is not None:
                    audited = audit.end()
        self.chan.send({"t": "done", "elapsed": elapsed, "device_s": dev["s"], "device_error": dev["error"]})
        threads = threading.active_count() - threads_before
        fetch, _ = self.chan.recv()
        if fetch.get("t") != "fetch":
            raise RuntimeError("protocol: expected fetch")
        sample = None if fetch.get("full") else (int(fetch["seed"]), int(fetch["k"]))
        multi = header["n_outs"] > 1 or header["mode"] == "autograd"
        items = list(raw) if multi and type(raw) in (tuple, list) else [raw]
        if len(items) != header["n_outs"]:
            return {"outs": [], "arrays": [], "hashes": compare_snapshot(snap), "elapsed": elapsed, "peak": None,
                    "script": None, "threads": threads, "shape_error": f"expected {header['n_outs']} outputs",
                    "audit": audited}
        described = [describe(x, True, None if sample is None else (sample[0] + i, sample[1]))
                     for i, x in enumerate(items)]
        return {"outs": [d[0] for d in described], "arrays": [d[1] for d in described],
                "hashes": compare_snapshot(snap), "elapsed": elapsed, "peak": None, "script": None,
                "threads": threads, "audit": audited}

    def serve(self, isolation=None):
        self.chan.send({"t": "hello", "pid": os.getpid(), "net": _netns(), "uid": os.getuid(),
                        "isolation": isolation})
        while True:
            h, arrays = self.chan.recv()
            t = h.get("t")
            if t == "load":
                self.load(h)
            elif t == "call":
                self.call(h, arrays)
            elif t in ("probe", "compile", "tcompile"):
                self.checked(h)
            elif t == "exit":
                return


def _netns():
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def _exc_line(exc) -> str:
    """``ValueError: msg (cell [5], line 12, in f)``: the innermost place in the submission's cells (inside a
    Triton kernel when the kernel raised: ``where.py``)."""
    return exc_line(exc)


def _student_tb(exc) -> str:
    """The traceback lines inside the submission's cells (not the harness), through Triton's wrapped errors."""
    return student_tb(exc)


def main(argv=None):
    import json
    from .traps import AUDIT, install_audit
    argv = sys.argv if argv is None else argv
    cfg, rfd, wfd, status = json.loads(argv[1]), int(argv[2]), int(argv[3]), json.loads(argv[4])
    if cfg.get("hide") or cfg.get("exec_allow") is not None:
        install_audit(cfg.get("hide", []), cfg.get("keep", []), cfg.get("exec_allow"))
    np.seterr(all="ignore")
    child = Child(ChildChannel(rfd, wfd))
    AUDIT.report = child.report
    child.serve(status)
    os._exit(0)


if __name__ == "__main__":
    main()
