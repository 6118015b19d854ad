"""Grade processes forked from one that has already imported the grader, for many gradings on a CPU.

``python -m autograder grade`` spends about 0.4 s of CPU starting Python and importing NumPy and the grader
before it grades anything; the selftest and ``grade-all`` on a CPU start one such process per submission. A
*fork server* (``serve``, started by ``Forks``) imports all that once; each grading is then a ``fork`` of it that
runs the same command line (``python -m autograder``, through ``runpy``) with the same environment, working
directory, output files and exit status as the subprocess it replaces. A grading is still a process of its own: a grader that crashes, or a
submission that kills its grader, stops that grading only.

CPU gradings only (``grade_all.forking``): the server holds one BLAS thread (no thread may run when it forks),
which a grading process on a GPU machine, whose oracles run at the GPU's problem sizes, should not be limited to.

Protocol, JSON lines: the client writes ``{"id", "argv", "env", "cwd", "stdout", "stderr"}`` on the server's
stdin; the server answers ``{"id", "pid"}`` when it has forked and ``{"id", "exit"}`` (``Popen.returncode``'s
convention) when that process has ended. End of input: the server kills the gradings still running and exits.
"""
from __future__ import annotations

import contextlib
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

START_TIMEOUT = 60.0


# -- the server ---------------------------------------------------------------------------------------------
def _run_grading(req) -> int:
    """In the forked process: become ``python -m autograder <argv>`` as the client asked; returns its exit code."""
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.close(null)
    sys.argv = ["-m", *req["argv"]]
    try:
        runpy.run_module("autograder", run_name="__main__", alter_sys=True)     # ``python -m autograder``
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def _child(run, req, wake_fds) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in wake_fds:
        os.close(fd)
    rc = 1
    try:
        rc = run(req)
    except BaseException:  # noqa: BLE001 -- the exit status says it failed; the traceback goes to its stderr
        import traceback
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(rc & 0xFF)


def serve(preload=()) -> None:
    """The fork server: import the grader (and ``preload``: the assignments' ``Spec.parent_imports``), say ready
    (or why not), then fork one grading per request."""
    import gc
    import importlib

    gc.disable()             # the imports make objects, not garbage: collected once, then frozen (``serve_forks``)
    import argparse  # noqa: F401
    import numpy  # noqa: F401
    from . import engine, report, specs  # noqa: F401 -- what ``grade`` imports
    for aid in specs.ASSIGNMENTS:
        specs.load(aid)
    for name in preload:
        importlib.import_module(name)
    serve_forks(_run_grading, sys.stdout)


def serve_forks(run, out, ready=None, kill=os.kill) -> None:
    """The loop of a fork server, once its imports are done: say ``{"ready": true, **ready}`` on ``out`` (or
    ``{"ready": false, "why"}`` where a thread runs, which a fork would not copy), then for each request line
    ``{"id", ...}`` on stdin fork a process that returns ``run(request)`` as its exit status, answering
    ``{"id", "pid"}`` and, when it has ended, ``{"id", "exit"}``. End of input: ``kill(pid, SIGKILL)`` what still
    runs, and return. ``tests/kernel_forks.py`` forks notebook kernels with it."""
    import gc

    def say(msg):
        out.write(json.dumps(msg) + "\n")
        out.flush()

    pid = os.fork()          # OpenBLAS's fork handler stops its thread pool (the next BLAS call starts it again)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        say({"ready": False, "why": f"{threads} threads after the imports (fork would not be safe)"})
        return
    gc.collect()
    gc.freeze()              # the forks do not copy the imported modules' objects by collecting them
    gc.enable()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    say({"ready": True, **(ready or {})})
    running, buf = {}, b""
    stdin = sys.stdin.fileno()
    while True:
        ready_fds, _, _ = select.select([stdin, wake_r], [], [])
        if wake_r in ready_fds:
            os.read(wake_r, 4096)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if pid in running:
                say({"id": running.pop(pid), "exit": os.waitstatus_to_exitcode(status)})
        if stdin in ready_fds:
            data = os.read(stdin, 65536)
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(run, req, (wake_r, wake_w))
                running[pid] = req["id"]
                say({"id": req["id"], "pid": pid})
    for pid in running:
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


# -- the client ---------------------------------------------------------------------------------------------
class ForkError(RuntimeError):
    """The server is gone; the caller runs the grading as a subprocess instead."""


class Forks:
    """A running fork server. ``run`` stands in for ``subprocess.run(["python", "-m", "autograder", *argv],
    cwd=..., env=..., capture_output=True, text=True, timeout=...)`` and is safe to call from several threads.
    Raises ``ForkError`` when the server does not start or has died."""

    def __init__(self, repo, preload=()):
        self._tmp = tempfile.mkdtemp(prefix="autograder-forks-")
        self._lock, self._next = threading.Lock(), 0
        self._waiting: dict[int, dict] = {}
        env = dict(os.environ, PYTHONPATH=repo, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1")
        with open(os.path.join(self._tmp, "server.err"), "wb") as err:
            boot = f"from autograder.grade_forks import serve; serve({tuple(preload)!r})"
            self._proc = subprocess.Popen([sys.executable, "-c", boot],
                                          cwd=repo, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=err, start_new_session=True)
        r, _, _ = select.select([self._proc.stdout], [], [], START_TIMEOUT)
        line = self._proc.stdout.readline() if r else b""
        ans = json.loads(line) if line.strip() else {"ready": False, "why": "no answer"}
        if not ans.get("ready"):
            self.close()
            raise ForkError(f"the fork server did not start: {ans.get('why')}")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self._proc.stdout:
            msg = json.loads(line)
            with self._lock:
                w = self._waiting.get(msg["id"])
            if w is not None:
                w.update(msg)
                if "exit" in msg:
                    w["done"].set()
        with self._lock:                      # the server is gone: nobody waits for it any more
            for w in self._waiting.values():
                w["done"].set()

    def run(self, argv, cwd, env, timeout) -> subprocess.CompletedProcess:
        with self._lock:
            self._next += 1
            rid = self._next
            w = self._waiting[rid] = {"done": threading.Event()}
        out, err = (os.path.join(self._tmp, f"{rid}.{s}") for s in ("out", "err"))
        req = {"id": rid, "argv": list(argv), "env": dict(env), "cwd": cwd, "stdout": out, "stderr": err}
        try:
            try:
                with self._lock:
                    self._proc.stdin.write((json.dumps(req) + "\n").encode())
                    self._proc.stdin.flush()
            except (OSError, ValueError) as exc:
                raise ForkError(f"the fork server is gone: {exc}") from None
            if not w["done"].wait(timeout):
                with contextlib.suppress(OSError, TypeError):
                    os.kill(w.get("pid"), signal.SIGKILL)
                w["done"].wait(10)
                raise subprocess.TimeoutExpired(argv, timeout)
            if "exit" not in w:
                raise ForkError("the fork server died during a grading")
            texts = []
            for path in (out, err):
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
            return subprocess.CompletedProcess(argv, w["exit"], *texts)
        finally:
            with self._lock:
                self._waiting.pop(rid, None)
            for path in (out, err):
                with contextlib.suppress(OSError):
                    os.remove(path)

    def close(self):
        with contextlib.suppress(OSError, ValueError):
            self._proc.stdin.close()          # the server kills what still runs and exits
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self._tmp, ignore_errors=True)


@contextlib.contextmanager
def forks(repo, preload=()):
    """A fork server for the gradings inside, or None where it does not start (they run as subprocesses)."""
    try:
        server = Forks(repo, preload)
    except (ForkError, OSError):
        yield None
        return
    try:
        yield server
    finally:
        server.close()
