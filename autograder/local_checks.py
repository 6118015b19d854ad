"""``engine.ChildChecks``'s interface in the caller's own process, for ``check()`` and ``make check``: the
compile-only checks of a ``Test.parent_check`` (a7) on the student's own code on the student's own machine (no
sandbox, as every visible check). The helpers and the kernel are read from the graded function's globals (the
notebook's namespace); the verdicts are the functions the grader calls (``gluon_compile``).

Gluon compiles only where Triton was imported with its interpreter off. Where this process runs the
interpreter (``TRITON_INTERPRET=1``: a CPU machine that imported ``reference.triton``, or a test run), the
compile runs in a fresh Python process with the interpreter off, on the notebook's code cells: Jupyter's input
history (``In``) or the cells ``adapter.load`` ran (``__cells__``); ``check`` is a no-op there.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from . import gluon_child
from .specs._base import ChildError
from .where import exc_line, root

NOT_IMPLEMENTED = "not implemented yet"
ROOT = Path(__file__).resolve().parent.parent
CELLS = "__cells__"          # set by ``adapter.load``: the code cells it ran, in order

_FRESH = r"""
import json, linecache, sys, types
import numpy as np
stub = types.ModuleType("autograder.check")
stub.check = lambda *a, **k: None
sys.modules["autograder.check"] = stub
from autograder import gluon_child
job = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__", "__builtins__": __builtins__}
for i, src in enumerate(job["cells"]):
    name = f"<cell {i}>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)     # @gluon.jit reads its source
    try:
        exec(compile(src, name, "exec"), ns)
    except BaseException:
        pass                                  # a cell that needs a GPU or IPython: the rest still runs
try:
    meta, arrs = gluon_child.compile_kernel(ns, job["name"], job["signature"], job["constexprs"],
                                            job["num_warps"], job["maxnreg"])
    np.save(sys.argv[2] + ".ptx.npy", arrs["ptx"]); np.save(sys.argv[2] + ".cubin.npy", arrs["cubin"])
    out = dict(meta)
except BaseException as exc:
    out = {"exc": type(exc).__name__, "msg": str(exc)[-600:]}
json.dump(out, open(sys.argv[2] + ".json", "w"))
"""


def _why(exc) -> str:
    if isinstance(root(exc), NotImplementedError) or "NotImplementedError" in str(exc):
        return f"{NOT_IMPLEMENTED} (NotImplementedError)"
    return exc_line(exc)


def interpreting(ns: dict) -> bool:
    """Whether Triton runs its interpreter in this process (then Gluon cannot compile here)."""
    try:
        from triton import knobs
        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET") == "1"


def cell_sources(ns: dict) -> list[str] | None:
    """The notebook's code cells in order: ``adapter.load``'s, else IPython's input history; None if neither."""
    if isinstance(ns.get(CELLS), list):
        return list(ns[CELLS])
    history = ns.get("In")
    if isinstance(history, list) and history:
        return [s for s in history[1:] if isinstance(s, str) and s.strip()]
    return None


def compile_fresh(cells: list[str], job: dict, timeout: float = 600.0) -> dict:
    """Compile in a fresh process with the interpreter off (no GPU); the same return as ``LocalChecks.compile``."""
    with tempfile.TemporaryDirectory(prefix="a7-local-") as tmp:
        Path(tmp, "job.json").write_text(json.dumps(dict(job, cells=cells)))
        out = os.path.join(tmp, "out")
        env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        try:
            subprocess.run([sys.executable, "-c", _FRESH, os.path.join(tmp, "job.json"), out], env=env, cwd=tmp,
                           capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ChildError(f"{job['name']}: the compile did not finish within {timeout:.0f} s") from None
        if not os.path.exists(out + ".json"):
            raise ChildError(f"{job['name']}: the compile process failed")
        res = json.loads(Path(out + ".json").read_text())
        if "exc" in res:
            msg = (f"{NOT_IMPLEMENTED} (NotImplementedError)" if res["exc"] == "NotImplementedError" or
                   "NotImplementedError" in res["msg"] else f"{res['exc']}: {res['msg']}")
            raise ChildError(f"{job['name']}: {msg}")
        ptx, cubin = np.load(out + ".ptx.npy"), np.load(out + ".cubin.npy")
    return {"ptx": ptx.tobytes().decode("utf-8", "replace"), "cubin": cubin.tobytes(), **res}


class LocalChecks:
    def __init__(self, namespace: dict):
        self.ns = namespace

    def probe(self, name: str, args: list) -> list[int]:
        try:
            return gluon_child.probe(self.ns, name, args)
        except Exception as exc:  # noqa: BLE001 -- feedback, not a crash
            raise ChildError(f"{name}: {_why(exc)}") from None

    def compile(self, name: str, signature: dict, constexprs: dict, num_warps: int, maxnreg=None) -> dict:
        if interpreting(self.ns):
            cells = cell_sources(self.ns)
            if cells is None:
                raise ChildError(f"{name}: Triton's interpreter is on in this process (TRITON_INTERPRET=1) and "
                                 "Gluon does not compile under it; restart without TRITON_INTERPRET=1")
            return compile_fresh(cells, {"name": name, "signature": signature, "constexprs": constexprs,
                                         "num_warps": num_warps, "maxnreg": maxnreg})
        try:
            meta, arrs = gluon_child.compile_kernel(self.ns, name, signature, constexprs, num_warps, maxnreg)
        except Exception as exc:  # noqa: BLE001 -- feedback, not a crash
            raise ChildError(f"{name}: {_why(exc)}") from None
        return {"ptx": arrs["ptx"].tobytes().decode("utf-8", "replace"), "cubin": arrs["cubin"].tobytes(), **meta}


def run_parent_check(check_fn, fn) -> tuple[bool, str]:
    """``(passed, message)`` of a ``Test.parent_check`` on the namespace ``fn`` was defined in."""
    try:
        return check_fn(LocalChecks(getattr(fn, "__globals__", {})))
    except ChildError as exc:
        return False, str(exc)
