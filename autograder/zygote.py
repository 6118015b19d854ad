"""The grader's side of the zygote (``zygote_server.py``): start one for many gradings, ask it for a child.

``running()`` starts a zygote for the gradings inside it (the selftest) and names it to the grader processes in
``AUTOGRADER_ZYGOTE`` (``name:token``; never passed on to a child, whose environment is scrubbed). A
``Sandbox`` of a torch child on CPU then calls ``spawn`` instead of ``Popen``; ``spawn`` returns None (the
sandbox spawns as before) when there is no zygote or it does not answer. ``ZygoteProc`` stands in for the
``Popen`` object: ``pid`` (L, the launcher: session leader of the child's processes), ``poll``, ``wait``
(the exit status travels back from the zygote, which is L's parent), ``close``.

A second zygote (``AUTOGRADER_ZYGOTE_COMPILE``) forks the compile children (the sm_90a frontend compile of a
submission's kernels), whose Triton must be imported with the interpreter off; spawned, each of them imported
torch and Triton again (1.1 s of CPU per Triton grading). Only CPU gradings use them (the GPU machine grades few
submissions, and CUDA must not be initialised before a fork); ``AUTOGRADER_ZYGOTE=0`` in the selftest's
environment switches them off. A third (``AUTOGRADER_ZYGOTE_NUMPY``) imports NumPy and the child modules only,
and forks the children of NumPy assignments (0.15-0.2 s of CPU each spawned), which must not find torch imported.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import socket
import subprocess
import tempfile
import time

from . import isolation

ENV = "AUTOGRADER_ZYGOTE"
ENV_COMPILE = "AUTOGRADER_ZYGOTE_COMPILE"
ENV_NUMPY = "AUTOGRADER_ZYGOTE_NUMPY"
# kind -> (variable, Triton's interpreter on, torch imported)
KINDS = {"torch": (ENV, True, True), "compile": (ENV_COMPILE, False, True), "numpy": (ENV_NUMPY, True, False)}
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote_server.py")
LAUNCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch.py")
ZBOOT = "import sys, json, runpy; runpy.run_path(json.loads(sys.argv[1])['server'], run_name='__main__')"
START_TIMEOUT = 120.0


class ZygoteProc:
    """A forked child's launcher, as far as ``Sandbox`` needs a ``Popen``: ``returncode`` follows Popen's
    convention (negative: killed by that signal)."""

    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid, self.returncode = sock, pid, None

    def _read(self, timeout):
        if self.returncode is not None or self.sock is None:
            return
        r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not r:
            return
        try:
            data = self.sock.recv(4096)
        except OSError:
            data = b""
        if not data:                       # the zygote died: it took its children with it
            self.returncode = -9
            return
        st = json.loads(data).get("exit")
        if st is not None:
            self.returncode = os.waitstatus_to_exitcode(st)

    def poll(self):
        self._read(0.0)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 3600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired("zygote child", timeout)
            self._read(min(left, 1.0))
        return self.returncode

    def close(self):
        """The zygote kills whatever of this child still runs when the connection closes: from then on the
        child counts as killed (-9), as when the zygote dies (``_read``). Without the connection no exit status
        can arrive, and ``wait`` would spin on a closed socket until its timeout (10 s of CPU in
        ``Sandbox.stop``)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            if self.returncode is None:
                self.returncode = -9


def spawn(launch_cfg: dict, env: dict, cwd: str, rlimits: list, fds: list,
          compile_only: bool = False, kind: str = "torch") -> ZygoteProc | None:
    """Ask the zygote named in ``AUTOGRADER_ZYGOTE`` (a compile child: ``AUTOGRADER_ZYGOTE_COMPILE``; ``kind``
    ``"numpy"``: ``AUTOGRADER_ZYGOTE_NUMPY``) for a child; None when there is none or it fails."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    addr = os.environ.get(KINDS["compile" if compile_only else kind][0], "")
    if ":" not in addr:
        return None
    name, token = addr.split(":", 1)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.settimeout(10.0)
        s.connect("\0" + name)
        msg = json.dumps({"token": token, "launch": launch_cfg, "env": env, "cwd": cwd, "rlimits": rlimits})
        socket.send_fds(s, [msg.encode()], fds)
        pid = json.loads(s.recv(4096))["pid"]
        s.settimeout(None)
        return ZygoteProc(s, int(pid))
    except (OSError, ValueError, KeyError):
        s.close()
        return None


def _env(tmp, interpret: bool):
    env = {k: os.environ[k] for k in isolation.KEEP_ENV if k in os.environ}
    env.update({"HOME": os.path.join(tmp, "home"), "TMPDIR": os.path.join(tmp, "tmp"),
                "TRITON_CACHE_DIR": os.path.join(tmp, "triton"), "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                "LANG": env.get("LANG", "C.UTF-8"), "MPLBACKEND": "Agg", "TRITON_INTERPRET": "1" if interpret else "0",
                "CUDA_VISIBLE_DEVICES": ""})
    return env


def _start(tmp: str, interpret: bool, torch: bool = True):
    """One zygote server in ``tmp`` (Triton's interpreter on for the grading children, off for the compile
    children: Triton decides it when it is imported; ``torch``: whether it imports torch and Triton at all):
    ``(process, name, token)``."""
    for sub in ("home", "tmp", "triton"):
        os.makedirs(os.path.join(tmp, sub))
    hide, keep = isolation.hidden_dirs(), isolation.kept_dirs()
    path = [isolation.stage_child_code(os.path.join(tmp, "grader"))] + isolation.child_sys_path(hide, keep)
    name, token = f"autograder-zygote-{secrets.token_hex(8)}", secrets.token_hex(16)
    cfg = {"path": path, "launch": LAUNCH, "server": SERVER, "name": name, "torch": torch}
    with open(os.path.join(tmp, "stderr.txt"), "wb") as err:
        proc = subprocess.Popen([isolation.child_python(), "-I", "-S", "-c", ZBOOT, json.dumps(cfg)],
                                cwd=tmp, env=_env(tmp, interpret), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, start_new_session=True, close_fds=True)
    proc.stdin.write(f"{token}\n".encode())
    proc.stdin.flush()
    return proc, name, token


def _ready(proc) -> tuple[bool, str]:
    r, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
    line = proc.stdout.readline() if r else b""
    ans = json.loads(line) if line.strip() else {"ready": False, "why": "no answer"}
    return bool(ans.get("ready")), str(ans.get("why"))


def _stop(proc):
    with contextlib.suppress(OSError):
        proc.stdin.close()             # the zygote kills its children and exits
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def started(device="cpu", kinds=tuple(KINDS)):
    """Start the zygotes of ``kinds`` (``KINDS``: torch grading children, compile children, NumPy children);
    yield ``(addresses, why)``: ``{ENV: "name:token", ...}`` of those that answered (for a caller to put in the
    environment of the grader processes it starts; ``os.environ`` is left alone) and why the first kind has no
    zygote (None: it has). Stopped, with every child they forked, on the way out."""
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds must be a non-empty list of {sorted(KINDS)}, got {list(kinds)!r}")
    if device != "cpu" or os.environ.get(ENV) == "0" or not isolation.namespaces_enabled():
        yield {}, "switched off"
        return
    tmp = tempfile.mkdtemp(prefix="autograder-zygote-")
    procs, why, addresses = [], None, {}
    try:
        started_ = []
        for kind in kinds:
            var, interpret, torch = KINDS[kind]
            proc, name, token = _start(os.path.join(tmp, var.lower()), interpret, torch)
            procs.append(proc)
            started_.append((var, proc, name, token))
        for i, (var, proc, name, token) in enumerate(started_):
            ok, reason = _ready(proc)
            if ok:
                addresses[var] = f"{name}:{token}"
            elif i == 0:
                why = f"zygote not started: {reason}"
        yield addresses, why
    finally:
        for proc in procs:
            _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def running(device="cpu", kinds=("torch", "compile")):
    """Zygotes for the CPU gradings inside, their variables set for grader subprocesses; by default the two of a
    Triton assignment (``AUTOGRADER_ZYGOTE``: the grading children, interpreter on; ``AUTOGRADER_ZYGOTE_COMPILE``:
    the compile children, interpreter off, for the sm_90a frontend compile), ``("numpy",)`` the one of a NumPy
    assignment. Yields why the first has none, or None; a zygote that does not start leaves its children spawned
    as before. Where the environment already names the first kind's zygote (a caller's ``started``: the test
    suite starts one set per worker for all its selftest runs), those serve and none is started."""
    if not kinds:
        yield "no zygote asked for"
        return
    if any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds must name zygotes of {sorted(KINDS)}, got {list(kinds)!r}")
    if device == "cpu" and ":" in os.environ.get(KINDS[kinds[0]][0], ""):
        yield None
        return
    saved = {KINDS[k][0]: os.environ.get(KINDS[k][0]) for k in kinds}
    with started(device, kinds) as (addresses, why):
        os.environ.update(addresses)
        try:
            yield why
        finally:
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
