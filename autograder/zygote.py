"""The grader's side of the zygote (``zygote_server.py``): start one for many gradings, ask it for a child.

``running()`` starts a zygote for the gradings inside it (the selftest) and names it to the grader processes in
``AUTOGRADER_ZYGOTE`` (``name:token``; never passed on to a child, whose environment is scrubbed). A
``Sandbox`` of a torch child on CPU then calls ``spawn`` instead of ``Popen``; ``spawn`` returns None (the
sandbox spawns as before) when there is no zygote or it does not answer. ``ZygoteProc`` stands in for the
``Popen`` object: ``pid`` (L, the launcher: session leader of the child's processes), ``poll``, ``wait``
(the exit status travels back from the zygote, which is L's parent), ``close``.

Only CPU gradings use it (the GPU machine grades few submissions, and CUDA must not be initialised before a
fork); ``AUTOGRADER_ZYGOTE=0`` in the selftest's environment switches it off.
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


def spawn(launch_cfg: dict, env: dict, cwd: str, rlimits: list, fds: list) -> ZygoteProc | None:
    """Ask the zygote named in ``AUTOGRADER_ZYGOTE`` for a child; None when there is none or it fails."""
    addr = os.environ.get(ENV, "")
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


def _env(tmp):
    env = {k: os.environ[k] for k in isolation.KEEP_ENV if k in os.environ}
    env.update({"HOME": os.path.join(tmp, "home"), "TMPDIR": os.path.join(tmp, "tmp"),
                "TRITON_CACHE_DIR": os.path.join(tmp, "triton"), "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                "LANG": env.get("LANG", "C.UTF-8"), "MPLBACKEND": "Agg", "TRITON_INTERPRET": "1",
                "CUDA_VISIBLE_DEVICES": ""})
    return env


@contextlib.contextmanager
def running(device="cpu"):
    """A zygote for the CPU gradings inside (``AUTOGRADER_ZYGOTE`` set for grader subprocesses); yields why
    there is none, or None. Stopped (with every child it forked) on the way out."""
    if device != "cpu" or os.environ.get(ENV) == "0" or not isolation.namespaces_enabled():
        yield "switched off"
        return
    tmp = tempfile.mkdtemp(prefix="autograder-zygote-")
    proc, why, saved = None, None, os.environ.get(ENV)
    try:
        for sub in ("home", "tmp", "triton"):
            os.makedirs(os.path.join(tmp, sub))
        hide, keep = isolation.hidden_dirs(), isolation.kept_dirs()
        path = [isolation.stage_child_code(os.path.join(tmp, "grader"))] + isolation.child_sys_path(hide, keep)
        name, token = f"autograder-zygote-{secrets.token_hex(8)}", secrets.token_hex(16)
        cfg = {"path": path, "launch": LAUNCH, "server": SERVER, "name": name}
        with open(os.path.join(tmp, "stderr.txt"), "wb") as err:
            proc = subprocess.Popen([isolation.child_python(), "-I", "-S", "-c", ZBOOT, json.dumps(cfg)],
                                    cwd=tmp, env=_env(tmp), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err, start_new_session=True, close_fds=True)
        proc.stdin.write(f"{token}\n".encode())
        proc.stdin.flush()
        r, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT)
        line = proc.stdout.readline() if r else b""
        ans = json.loads(line) if line.strip() else {"ready": False, "why": "no answer"}
        if ans.get("ready"):
            os.environ[ENV] = f"{name}:{token}"
        else:
            why = f"zygote not started: {ans.get('why')}"
        yield why
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()             # the zygote kills its children and exits
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
