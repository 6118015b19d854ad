"""The zygote (``autograder/zygote.py``, ``zygote_server.py``): Triton grading children forked from one process
that imported torch and Triton once. Each forked child must be as fresh and as contained as a spawned one: what a
submission changes in one child (module globals, a monkeypatched torch) is not seen by the next, the sandbox
layers hold (namespaces, hidden checkout, no network), killing and timeouts work, and a wrong token gets nothing."""
from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from autograder import isolation, zygote  # noqa: E402
from autograder.sandbox import Limits, Sandbox, SandboxDied  # noqa: E402

pytestmark = pytest.mark.autograder

DIRTY = """import torch, numpy
torch.zygote_mark = 1
numpy.zygote_mark = 1
torch.softmax = lambda *a, **k: None
numpy.allclose = lambda *a, **k: True
import sys
_r = sys.modules["autograder.runner"]
_r.describe = None
_r.ZYGOTE_MARK = 1
"""
LOOK = """import torch, numpy
import sys
_r = sys.modules["autograder.runner"]
if (hasattr(torch, "zygote_mark") or hasattr(numpy, "zygote_mark") or torch.softmax.__name__ == "<lambda>"
        or numpy.allclose.__name__ == "<lambda>" or _r.describe is None or hasattr(_r, "ZYGOTE_MARK")):
    LEAKED = 1
else:
    FRESH = 1
"""


@pytest.fixture(scope="module")
def zyg():
    with zygote.running("cpu", tuple(zygote.KINDS)) as why:
        if why:
            pytest.skip(f"no zygote here: {why}")
        yield


def _child(kind="torch", **kw):
    sb = Sandbox("cpu", Limits(address_space=None), "student", zygote=kind, **kw)
    sb.start()
    assert isinstance(sb.proc, zygote.ZygoteProc), "the sandbox did not use the zygote"
    return sb


def _load(sb, src, names=(), torch=True):
    sb.send({"t": "load", "cells": [[0, src]], "names": list(names), "torch": torch, "device": "cpu"})
    h, _ = sb.recv(60, expect="loaded")
    return h


def test_forked_children_start_fresh_and_contained(zyg):
    first = _child()
    try:
        h = _load(first, DIRTY)
        assert all(c["ok"] for c in h["cells"]), h["cells"]
        assert {"numpy.allclose", "autograder.runner.describe"} <= set(h["patched"]), h["patched"]      # the traps see it as before
        pid1 = first.child_pid
    finally:
        first.stop()
    second = _child()
    try:
        h = _load(second, LOOK, ["LEAKED", "FRESH"])
        assert h["names"] == {"LEAKED": None, "FRESH": "int"}, h
        assert second.child_pid != pid1
        iso = second.isolation
        assert iso["pidns"] and iso["mountns"] and iso["netns"] and iso["locked"], iso
        assert second._pidns          # seen by the parent too: its member list is the launcher's subtree alone
        assert isolation.REPO in iso["hidden"] or any(isolation.inside(isolation.REPO, d) for d in iso["hidden"])
        assert second.network.startswith("off")
    finally:
        second.stop()


def test_numpy_children_come_from_a_zygote_without_torch(zyg):
    """A NumPy assignment's child is forked by the NumPy zygote: NumPy and the harness imported, torch and Triton
    not (a NumPy submission never finds torch in ``sys.modules``), and what one child patches the next does not
    see."""
    src = ("import sys, numpy\nHEAVY = sorted(m for m in ('torch', 'triton') if m in sys.modules)\n"
           "SEEN = hasattr(numpy, 'zygote_mark')\nnumpy.zygote_mark = 1\n")
    for _ in range(2):
        sb = _child("numpy")
        try:
            h = _load(sb, src, ["HEAVY", "SEEN"], torch=False)
            assert all(c["ok"] for c in h["cells"]), h["cells"]
            assert h["names"] == {"HEAVY": "list", "SEEN": "bool"}, h
            ns = sb.isolation
            assert ns["pidns"] and ns["netns"], ns
        finally:
            sb.stop()
    probe = ("import sys\nif 'torch' in sys.modules or 'triton' in sys.modules:\n    HEAVY = 1\nelse:\n    LIGHT = 1\n"
             "import numpy\nif hasattr(numpy, 'zygote_mark'):\n    SEEN = 1\n")
    sb = _child("numpy")
    try:
        h = _load(sb, probe, ["HEAVY", "LIGHT", "SEEN"], torch=False)
        assert h["names"] == {"HEAVY": None, "LIGHT": "int", "SEEN": None}, h
    finally:
        sb.stop()


def test_forked_child_escapes_are_killed_and_time_out(zyg):
    sb = _child()
    try:
        src = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(120)\n    os._exit(0)\n"
               "while True:\n    pass\n")
        sb.send({"t": "load", "cells": [[0, src]], "names": [], "torch": True, "trusted": True})   # no traps: fork
        t0 = time.monotonic()
        with pytest.raises(SandboxDied) as exc:
            sb.recv(2.0, expect="loaded")
        assert exc.value.kind == "timeout" and time.monotonic() - t0 < 10
        assert sb._members() == []
        assert sb.proc.returncode is not None and sb.proc.returncode < 0      # killed, as Popen reports it
    finally:
        sb.stop()


def test_closing_the_connection_kills_the_child(zyg):
    """A grader that dies (its end of the zygote connection closes) takes its child with it."""
    sb = _child()
    try:
        launcher = sb.pid
        assert isolation.proc_state(launcher) not in (None, "Z")
        sb.proc.close()
        assert sb.proc.poll() == -9          # counted as killed at once: no wait spins on the closed socket
        deadline = time.monotonic() + 10
        while isolation.proc_state(launcher) not in (None, "Z") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert isolation.proc_state(launcher) in (None, "Z")
    finally:
        sb.stop()


def test_no_zygote_or_a_wrong_token_gets_nothing(zyg, monkeypatch):
    name = os.environ[zygote.ENV].split(":", 1)[0]
    r, w = os.pipe()
    try:
        monkeypatch.setenv(zygote.ENV, f"{name}:not-the-token")
        assert zygote.spawn({"argv": []}, {}, "/", [], [r, w, r, w]) is None
        monkeypatch.delenv(zygote.ENV)
        assert zygote.spawn({"argv": []}, {}, "/", [], [r, w, r, w]) is None
    finally:
        os.close(r)
        os.close(w)
    sb = Sandbox("cpu", Limits(address_space=None), "student", zygote="torch")   # falls back to spawning
    sb.start()
    try:
        assert not isinstance(sb.proc, zygote.ZygoteProc)
    finally:
        sb.stop()


def test_compile_children_come_from_a_zygote_with_the_interpreter_off(zyg):
    """A compile child (``compile_only``: the sm_90a frontend compile) is forked by the second zygote, whose
    Triton was imported with the interpreter off: a ``@triton.jit`` in it is a compilable ``JITFunction``, and a
    grading child's is an ``InterpretedFunction``."""
    src = "import triton\n@triton.jit\ndef k(x):\n    pass\nKIND = type(k).__name__\n"
    look = src + "JIT = 1 if KIND == 'JITFunction' else None\nINTERPRETED = 1 if KIND == 'InterpretedFunction' else None\n"
    for compile_only, want in ((True, "JIT"), (False, "INTERPRETED")):
        sb = _child(compile_only=compile_only)
        try:
            h = _load(sb, look, ["JIT", "INTERPRETED"])
            assert all(c["ok"] for c in h["cells"]), h["cells"]
            assert h["names"][want] == "int", (compile_only, h["names"])
        finally:
            sb.stop()


def test_unknown_kinds_are_named_and_no_kind_starts_nothing():
    with pytest.raises(ValueError, match=r"^kinds must"):
        with zygote.started("cpu", ("torch", "gpu")):
            pass
    with pytest.raises(ValueError, match=r"^kinds must"):
        with zygote.running("cpu", ("numpy", "gpu")):
            pass
    with pytest.raises(ValueError, match=r"^kind must"):
        zygote.spawn({"argv": []}, {}, "/", [], [], kind="gpu")
    before = {k: os.environ.get(k) for k in (zygote.ENV, zygote.ENV_COMPILE, zygote.ENV_NUMPY)}
    with zygote.running("cpu", ()) as why:          # a selftest whose filter matched nothing
        assert why == "no zygote asked for"
        assert {k: os.environ.get(k) for k in before} == before


def test_a_selftest_that_matches_nothing_runs_nothing():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "autograder", "selftest", "--match", "no-such-entry", "--device", "cpu"],
                       cwd=isolation.REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "0/0 as expected" in p.stdout, p.stdout[-500:] + p.stderr[-1500:]
