"""Visible cases run where a crash cannot take the caller down: ``check()`` in a notebook, ``make check`` in pytest
(docs/design.md §6: a crash is a failed test with a diagnosis, never a flag).

A student's kernel that writes past a tensor (an unmasked ``tl.store`` on a ragged tail) corrupts memory, kills or
hangs the process in Triton's interpreter (unless ``interp_bounds``, installed in every worker, stops it first),
and leaves a CUDA context broken on a GPU; one that never ends hangs. So the
cases run in a *worker* process, reused while it is healthy: a case that kills it, or outlives its time limit,
fails with a diagnosis (``diagnose.crash``), and the next case gets a fresh worker. After a CUDA fault the worker
answers, then exits, so that the next case does not inherit the broken context. What the worker wrote to its
stdout/stderr (a "Fatal Python error", the allocator's "free(): invalid pointer") goes to a file, never to the
student's screen; what the function printed comes back and is shown.

- ``ForkWorker`` (``check()``): a forked copy of the notebook's process, so the function, its kernels and the
  notebook's state come along. Fork cannot carry a CUDA context: where this process has initialised CUDA
  already, ``check()`` runs the cases in the notebook's own process, as before (a CUDA fault then breaks the
  notebook's kernel, and the message says to restart it).
- ``SpawnWorker`` (``make check``): a new interpreter (``python -m autograder.check_worker``) that loads the
  notebook's cells itself (``adapter.load``) and answers cases sent over a socket; pytest never runs the
  student's code.

The checker that judges a case (``check.run_case``) is passed in, so this module imports no checker.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection

from . import diagnose

DEFAULT_TIMEOUT = float(os.environ.get("AUTOGRADER_CHECK_TIMEOUT", "300"))


@dataclass
class Died:
    """The worker died (``kind`` "crash") or outlived the case's time limit (``"timeout"``)."""
    kind: str
    reason: str


def case_timeout(task_id: str) -> float:
    """The grader's time limit per case for ``task_id`` (from its spec), or ``DEFAULT_TIMEOUT`` in a release."""
    try:
        from .specs import find_task
        return float(find_task(task_id)[1].case_timeout)
    except Exception:  # noqa: BLE001 -- a student release has no specs
        return DEFAULT_TIMEOUT


def crash_message(task_id: str, fn_name: str, case, died: Died, triton: bool) -> str:
    """The diagnosis of a case that killed or hung its worker (``diagnose.crash``, with the spec's tiled axes
    where the specs are at hand)."""
    tiled, params = (), getattr(case, "params", None)
    try:
        from .specs import find_task
        tiled = find_task(task_id)[1].tiled
    except Exception:  # noqa: BLE001 -- a student release: no tile information, the generic hint
        pass
    if died.kind == "skipped":
        return f"skipped: {died.reason}"
    what = _case_words(params) if params else ""
    return diagnose.crash(fn_name, what, died.kind, died.reason, triton, tiled, params,
                          case_timeout(task_id) if died.kind == "timeout" else None)


def _case_words(params) -> str:
    keep = [f"{k}={v}" for k, v in params.items() if k not in ("torch", "gpu")]
    return ", ".join(keep)


def status_words(status) -> str:
    """``-11`` -> "killed by SIGSEGV"; ``134`` -> "exit status 134" (an abort through a shell's convention)."""
    if status is None:
        return "stopped"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


# -- the worker's side ----------------------------------------------------------------------------------------
def serve(conn, lookup, device_of, run_case):
    """Answer ``("case", task_id, name, case)`` with ``("ok", (passed, err, msg, tol), printed)`` until told to
    stop; exits after a CUDA fault (the context is broken). ``lookup(name)`` -> the student's function;
    ``run_case(case, fn, device)`` judges one case (``check.run_case``, passed in: this module imports no checker)."""
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            return
        if req[0] == "stop":
            return
        _, task_id, name, case = req
        if "triton" in sys.modules:   # the interpreter: a load or store outside its tensors fails the case cleanly
            from . import interp_bounds, interp_fast
            interp_bounds.install()
            interp_fast.install()
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            if case.parent is not None:
                from .local_checks import run_parent_check
                ok, msg = run_parent_check(_parent_check(task_id, case.parent), lookup(name))
                res = (ok, float("inf"), msg, None)
            else:
                res = run_case(case, lookup(name), device_of(task_id))
        conn.send(("ok", res, buf.getvalue()[-20000:]))
        if not res[0] and diagnose.is_cuda_fault(str(res[2])):
            return


def _parent_check(task_id, check):
    """A compile-only check (a7's ``Test.parent_check``), sent by its test's name when it cannot travel itself."""
    if not isinstance(check, str):
        return check
    from .specs import find_task
    spec, _ = find_task(task_id)
    return next(t.parent_check for t in spec.tests if t.name == check)


def _quiet_fds(path):
    """Send this process's fd 1 and 2 to ``path``: raw crash output never reaches the student's screen."""
    import faulthandler
    faulthandler.disable()             # pytest and Jupyter point it at a duplicate of stderr: no "Fatal Python error"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # and Python's own streams: in a forked Jupyter kernel they are the parent's message channel, never to be used
    sys.stdout = sys.stderr = open(1, "w", closefd=False, buffering=1)


class _Worker:
    """The parent's side: one worker process at a time, replaced after it dies, hangs or hits a CUDA fault. After
    a hang the function's remaining cases are not run (``Died("skipped")``): each would wait the time limit."""
    conn = None
    pid = None
    hung = None

    def run(self, task_id, name, case, timeout):
        """``(passed, err, msg, tol)``, plus what the function printed; or a ``Died``."""
        self.hung = self.hung if self.hung is not None else {}
        if task_id in self.hung:
            return Died("skipped", self.hung[task_id]), ""
        if self.conn is None:
            started = self._start()
            if isinstance(started, Died):
                return started, ""
        try:
            self.conn.send(("case", task_id, name, case))
            if not self.conn.poll(timeout):
                self._kill()
                self.hung[task_id] = f"{name} did not return within {timeout:.0f} s on an earlier case"
                return Died("timeout", f"no answer within {timeout:.0f} s"), ""
            tag, res, printed = self.conn.recv()
        except (EOFError, OSError, pickle.PickleError):
            status = self._reap()
            return Died("crash", f"the process running it was {status_words(status)}"), ""
        if not res[0] and diagnose.is_cuda_fault(str(res[2])):
            self._reap()                                  # it exits by itself: a CUDA fault is sticky
        return res, printed

    def _kill(self):
        if self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
        self._reap()

    def _reap(self):
        status = None
        if self.pid:
            status = self._wait()
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
        self.conn, self.pid = None, None
        return status

    def close(self):
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.send(("stop",))
            deadline = time.monotonic() + 5
            while self.pid and time.monotonic() < deadline and self._poll() is None:
                time.sleep(0.02)
            self._kill()
        with contextlib.suppress(OSError, AttributeError):
            os.unlink(self.log)                       # the workers' raw output: nothing a student reads


class ForkWorker(_Worker):
    """``check()``: the cases run in a forked copy of this process (the notebook's kernel)."""

    def __init__(self, lookup, device_of, run_case):
        self.lookup, self.device_of, self.run_case = lookup, device_of, run_case
        self.log = os.path.join(tempfile.gettempdir(), f"autograder-check-{os.getpid()}.log")

    @staticmethod
    def possible() -> bool:
        """Fork works here: a POSIX system, and no CUDA context in this process (a fork cannot carry one)."""
        if not hasattr(os, "fork"):
            return False
        torch = sys.modules.get("torch")
        try:
            return not (torch is not None and torch.cuda.is_initialized())
        except Exception:  # noqa: BLE001
            return False

    def _start(self):
        a, b = socket.socketpair()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)      # "multi-threaded process, fork()"
            pid = os.fork()
        if pid == 0:                                                  # the worker: never returns
            try:
                a.close()
                _quiet_fds(self.log)
                serve(Connection(b.detach()), self.lookup, self.device_of, self.run_case)
            finally:
                os._exit(0)
        b.close()
        self.pid, self.conn = pid, Connection(a.detach())
        return None

    def _wait(self):
        try:
            _, st = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return None
        return -os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)

    def _poll(self):
        try:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            return None
        self.pid = None
        return -os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st)


class SpawnWorker(_Worker):
    """``make check``: a fresh interpreter loads the submission (``adapter.load``) and answers cases; ``loaded``
    says which graded names failed while loading or are missing."""

    def __init__(self, path, assignment=None, load_timeout=600.0):
        self.path, self.assignment, self.load_timeout = str(path), assignment, load_timeout
        self.log = tempfile.NamedTemporaryFile(prefix="autograder-check-", suffix=".log", delete=False).name
        self.proc = None
        self.loaded = None             # {"failed": {name: why}, "names": [defined names], "output": str}

    def _start(self):
        a, b = socket.socketpair()
        fd = b.detach()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))      # where this autograder lives
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "autograder.check_worker", self.path, str(fd),
                                          self.assignment or ""],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(fd,),
                                         cwd=os.getcwd(), env=env)
        os.close(fd)
        self.pid, self.conn = self.proc.pid, Connection(a.detach())
        try:
            if not self.conn.poll(self.load_timeout):
                self._kill()
                return Died("timeout", f"loading the notebook took more than {self.load_timeout:.0f} s")
            self.loaded = self.conn.recv()
        except (EOFError, OSError):
            status = self._reap()
            return Died("crash", f"loading the notebook crashed the process ({status_words(status)})")
        return None

    def start(self):
        """Load the submission now; a ``Died`` if loading killed or hung the worker."""
        return self._start() if self.conn is None else None

    def _wait(self):
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def _poll(self):
        return self.proc.poll() if self.proc else 0
