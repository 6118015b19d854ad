"""Jupyter kernels for the tests, forked from a template process that has already imported the heavy libraries.

A notebook test starts a fresh ``python -m ipykernel_launcher`` kernel; about 2 CPU-s of each start is importing
NumPy, torch, Triton, matplotlib and IPython, and the suite starts some thirty kernels. Here a *template* process,
started once per test process and per kernel environment, imports those libraries (never the course's own
packages: their import-time output and state belong to the notebook) and then forks one kernel per request. The
fork becomes ``python -m ipykernel_launcher -f CONNECTION_FILE`` through ``runpy``: same command-line arguments,
environment, working folder, ``sys.path`` and a process session of its own, as ``jupyter_client`` would start it.
Each notebook still gets a fresh kernel process with an empty namespace; only the imported library modules are
shared (copy-on-write).

``manager_class()`` is what a test passes to nbclient (``kernel_manager_class=``). A kernel is forked only when
its environment equals the template's (``JPY_*`` variables aside) and its command is the standard
``python -m ipykernel_launcher``; otherwise, or with ``COURSE_KERNEL_FORKS=0``, or when the template could not
start or holds a thread, the kernel is started as Jupyter starts it. ``tests/test_kernel_forks.py`` compares a
forked kernel with a started one.

The template is a fork server (``autograder.grade_forks.serve_forks``): the client writes
``{"id", "argv", "env", "cwd", "log"}`` on its stdin; it answers ``{"id", "pid"}`` when it has forked and
``{"id", "exit"}`` when that kernel has ended. End of input: it kills the kernels still running and exits.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

# not ``ipykernel.kernelapp``: its option defaults read the kernel's own JPY_PARENT_PID when it is imported
PRELOAD = ("numpy", "torch", "triton", "triton.language", "matplotlib", "matplotlib.pyplot", "IPython", "zmq",
           "ipykernel.ipkernel")
PER_KERNEL_IMPORTS = ("ipykernel.kernelapp",)
START_TIMEOUT = 120.0
PR_SET_PDEATHSIG = 1
_IMPORTS_SET: dict = {}         # in the template: environment variables its imports set or changed ...
_IMPORTS_UNSET: list = []       # ... and removed


def _per_kernel(key: str) -> bool:
    """Variables that differ from kernel to kernel and that no preloaded library reads when it is imported."""
    return key.startswith("JPY_") or key == "PYTEST_CURRENT_TEST"


def _same_env(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if not _per_kernel(k)} == {k: v for k, v in b.items() if not _per_kernel(k)}


# -- the template (its own process) ---------------------------------------------------------------------------
def _become_kernel(req) -> int:
    """In the fork: ``python -m ipykernel_launcher <argv>`` in ``req["cwd"]`` with ``req["env"]``."""
    import ctypes
    import runpy

    os.setsid()                                   # jupyter_client starts kernels in a session of their own
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    os.environ.update(_IMPORTS_SET)               # what the imports would have set in a started kernel
    for key in _IMPORTS_UNSET:
        os.environ.pop(key, None)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    sys.path.insert(0, os.getcwd())               # what ``python -m`` puts first
    sys.argv = ["-m", *req["argv"]]
    try:
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def serve() -> None:
    import ctypes
    import gc
    import importlib

    from autograder.grade_forks import serve_forks

    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    gc.disable()                                  # until ``serve_forks`` collects once and freezes the imports
    before = dict(os.environ)
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 -- the client starts kernels as Jupyter does
        print(json.dumps({"ready": False, "why": f"importing the libraries failed: {exc!r}"}), flush=True)
        return
    early = [m for m in PER_KERNEL_IMPORTS if m in sys.modules]
    if early:
        print(json.dumps({"ready": False, "why": f"the imports also imported {early}, which must see each kernel's "
                                                 "environment"}), flush=True)
        return
    _IMPORTS_SET.update({k: v for k, v in os.environ.items() if before.get(k) != v})
    _IMPORTS_UNSET.extend(k for k in before if k not in os.environ)
    serve_forks(_become_kernel, sys.stdout, ready={"env": before}, kill=_kill_group)


def _kill_group(pid, sig):
    """A kernel's process group (it leads one, as a started kernel does), or the kernel alone if it is not yet."""
    try:
        os.killpg(pid, sig)
    except OSError:
        os.kill(pid, sig)


# -- the client (the test process) ----------------------------------------------------------------------------
class ForkedKernel:
    """The ``subprocess.Popen`` surface that ``LocalProvisioner`` uses, for a kernel forked by a template."""

    stdin = stdout = stderr = None

    def __init__(self, template: "Template", rid: int, pid: int, log: str):
        self.template, self.rid, self.pid, self.log, self.returncode = template, rid, pid, log, None

    def poll(self):
        if self.returncode is None:
            self.returncode = self.template.exit_code(self.rid)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["ipykernel", str(self.pid)], timeout)
            time.sleep(0.02)
        self._show_log()
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def _show_log(self):
        """What the kernel wrote on its stdout/stderr goes to this process's stderr, as a started kernel's would."""
        with contextlib.suppress(OSError):
            with open(self.log, encoding="utf-8", errors="replace") as f:
                text = f.read()
            os.unlink(self.log)
            if text:
                sys.stderr.write(text)


class Template:
    """One template process and the kernels it forked."""

    def __init__(self, env: dict):
        self.start_env = env
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1)
        self.lock = threading.Lock()
        self.requests = 0
        self.exits: dict[int, int] = {}           # request id -> exit status
        self.pids: dict[int, int] = {}            # request id -> pid
        self.cond = threading.Condition(self.lock)
        line = self.proc.stdout.readline() if select.select([self.proc.stdout], [], [], START_TIMEOUT)[0] else ""
        first = json.loads(line or '{"ready": false, "why": "no answer (it exited, or its imports hung)"}')
        self.ready, self.why = first.get("ready", False), first.get("why", "")
        if self.ready and first.get("env") != env:
            self.ready, self.why = False, "its environment is not the one it was started with"
        if self.ready:
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.close()

    def _read(self):
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.cond:
                if "pid" in msg:
                    self.pids[msg["id"]] = msg["pid"]
                else:
                    self.exits[msg["id"]] = msg["exit"]
                self.cond.notify_all()
        with self.cond:                      # the template is gone, and its kernels with it
            self.ready = False
            self.cond.notify_all()

    def fork(self, argv, env, cwd, log) -> tuple[int, int] | None:
        """``(request id, pid)`` of a kernel forked with these arguments, or None."""
        with self.cond:
            if not self.ready:
                return None
            self.requests += 1
            rid = self.requests
            self.proc.stdin.write(json.dumps({"id": rid, "argv": argv, "env": env, "cwd": cwd, "log": log}) + "\n")
            self.proc.stdin.flush()
            self.cond.wait_for(lambda: rid in self.pids or not self.ready, START_TIMEOUT)
            return (rid, self.pids[rid]) if rid in self.pids else None

    def exit_code(self, rid):
        with self.lock:
            if rid in self.exits:
                return self.exits[rid]
            if not self.ready:                # its template died: the kernel was killed with it
                return self.exits.setdefault(rid, -signal.SIGKILL)
        return None

    def close(self):
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_TEMPLATES: list[Template] = []
_TEMPLATES_LOCK = threading.Lock()


def template_for(env: dict) -> Template | None:
    """The running template whose environment is ``env`` (started on first use); None where forking is off."""
    if os.environ.get("COURSE_KERNEL_FORKS", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    with _TEMPLATES_LOCK:
        for t in _TEMPLATES:
            if _same_env(t.start_env, env):
                return t if t.ready else None           # a template that failed is not tried again
        t = Template({k: v for k, v in env.items() if not _per_kernel(k)})
        if not t.ready:
            sys.stderr.write(f"kernel template did not start ({t.why}): kernels start as Jupyter starts them\n")
        _TEMPLATES.append(t)
        return t if t.ready else None


@atexit.register
def close_all():
    with _TEMPLATES_LOCK:
        for t in _TEMPLATES:
            t.close()
        _TEMPLATES.clear()


@functools.cache
def manager_class():
    """An ``AsyncKernelManager`` whose kernels come from a template where they can (module docstring)."""
    import tempfile
    import uuid

    from jupyter_client import AsyncKernelManager
    from jupyter_client.provisioning import LocalProvisioner

    class ForkingProvisioner(LocalProvisioner):
        async def launch_kernel(self, cmd, **kwargs):
            env, cwd = dict(kwargs.get("env") or os.environ), str(kwargs.get("cwd") or os.getcwd())
            env["JPY_PARENT_PID"] = str(os.getpid())       # as ``jupyter_client.launcher.launch_kernel`` sets it
            standard = len(cmd) > 3 and cmd[1:3] == ["-m", "ipykernel_launcher"] and \
                os.path.realpath(cmd[0]) == os.path.realpath(sys.executable)
            template = template_for(env) if standard else None
            if template is not None:
                fd, log = tempfile.mkstemp(prefix="kernel-", suffix=".log")
                os.close(fd)
                forked = template.fork(cmd[3:], env, cwd, log)
                if forked is not None:
                    rid, pid = forked
                    self.process = ForkedKernel(template, rid, pid, log)
                    self.pid = self.pgid = pid
                    self.cwd = cwd
                    return self.connection_info
                os.unlink(log)
            return await super().launch_kernel(cmd, **kwargs)

    class ForkingKernelManager(AsyncKernelManager):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.kernel_id = self.kernel_id or str(uuid.uuid4())
            self.provisioner = ForkingProvisioner(kernel_id=self.kernel_id, kernel_spec=self.kernel_spec, parent=self)

    return ForkingKernelManager


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    sys.path.pop(0)                                # the tests folder: nothing of it is imported by the template
    serve()
