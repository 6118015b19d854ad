"""One compile-only child per test process for the sm_90a compile tests.

The Hopper kernels are compiled for sm_90a in a process started with ``TRITON_INTERPRET=0`` and no visible GPU
(``reference.triton.hopper._aot``: under the interpreter the compiler rejects Gluon's ``@jit`` helpers). Each
test used to start its own ``python -m ...`` / ``python -c ...`` for that, and every start imported torch and
Triton again (about 2.5 CPU-s, more than many of the compiles). ``run`` hands the same command line to one child
that stays up for the whole test process and runs it as ``python`` would (``runpy`` for ``-m``, ``exec`` for
``-c``, with ``sys.argv`` set), returning its stdout, its Python-level stderr and an exit status; the same command
line asked twice in a test process is answered from memory (a compile is deterministic).

A command that raises returns status 1 with its traceback; one that kills the child (a crash in the compiler)
returns the child's status and stderr tail, and the next call starts a fresh child; one that runs past
``timeout`` raises ``subprocess.TimeoutExpired`` as ``subprocess.run`` did.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import runpy
import select
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Result:
    """What the tests read of a finished command (the fields of ``subprocess.CompletedProcess`` they used)."""
    returncode: int
    stdout: str
    stderr: str


_child: subprocess.Popen | None = None
_child_err = None  # the child's own stderr (compiler warnings written to fd 2), read on a crash
_memo: dict = {}
_cpu = [0.0]  # CPU seconds the child reported for the commands of this test process (``cpu_seconds``)


def cpu_seconds() -> float:
    """CPU time the child spent on this process's commands so far (its own user + sys per command, sent back with
    each result): the child is reaped only when the test process ends, so ``tests/cpu_report.py`` reads this to
    charge each test its compiles."""
    return _cpu[0]


def _start() -> subprocess.Popen:
    global _child, _child_err
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    _child_err = tempfile.TemporaryFile()
    _child = subprocess.Popen([sys.executable, "-m", "tests.sm90_compile"], cwd=ROOT, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=_child_err)
    return _child


def _stop() -> None:
    global _child
    if _child is not None:
        _child.kill()
        _child.wait()
        _child = None


atexit.register(_stop)


def run(argv, timeout: float = 300) -> Result:
    """Run ``python *argv`` (``["-m", module, *args]`` or ``["-c", code, *args]``) in the compile-only child."""
    argv = tuple(str(a) for a in argv)
    if not argv or argv[0] not in ("-m", "-c") or len(argv) < 2:
        raise ValueError(f"argv must start with '-m', module or '-c', code; got {argv[:2]!r}")
    if argv in _memo:
        return _memo[argv]
    child = _child if _child is not None and _child.poll() is None else _start()
    child.stdin.write((json.dumps(argv) + "\n").encode())
    child.stdin.flush()
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    if not ready:
        _stop()
        raise subprocess.TimeoutExpired([sys.executable, *argv], timeout)
    line = child.stdout.readline()
    if not line:  # the child died during the command
        status = child.wait()
        _child_err.seek(0)
        err = _child_err.read().decode(errors="replace")
        _stop()
        return Result(status or -1, "", err)
    out = json.loads(line)
    _cpu[0] += out.get("cpu_s", 0.0)
    result = Result(out["returncode"], out["stdout"], out["stderr"])
    if result.returncode == 0:
        _memo[argv] = result
    return result


def _execute(argv) -> dict:
    """One command, as ``python *argv`` would run it, with its stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    saved = sys.argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if argv[0] == "-m":
                    sys.argv = [argv[1], *argv[2:]]
                    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = ["-c", *argv[2:]]
                    exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=err)
            except BaseException:  # noqa: BLE001 - reported to the test like a child's traceback
                traceback.print_exc(file=err)
                code = 1
    finally:
        sys.argv = saved
    return {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _serve() -> None:
    """The child's loop: one JSON command line in, one JSON result line out, on a pipe of its own (anything the
    compiler writes to fd 1 goes to stderr instead, so it cannot break a result line)."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", closefd=False)
    for line in sys.stdin:
        t0 = _own_cpu()
        reply = _execute(json.loads(line))
        reply["cpu_s"] = _own_cpu() - t0
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def _own_cpu() -> float:
    """This process's CPU and its finished children's (``ptxas``, ``cuobjdump``), user + sys."""
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    _serve()
