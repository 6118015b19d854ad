"""Starting, watching and killing one sandboxed child process (docs/design.md §6, threats T17-T18).

Each child gets: its own session/process group (``start_new_session``), a fresh temp dir as cwd, HOME, TMPDIR
and TRITON_CACHE_DIR (T18: nothing left for the next submission), a scrubbed environment (PATH, LANG and what
numpy/torch/Triton need, plus a per-child token used to find escaped grandchildren), rlimits (CPU seconds,
file size, core dumps, and address space when grading on CPU), death when the parent dies
(``PR_SET_PDEATHSIG``), and stdout/stderr captured to files that are read back truncated. The protocol runs
on two dedicated pipes (``pass_fds``).

Below Python (``launch.py``, ``isolation.py``): new user, mount, PID and network namespaces where the OS
allows; the course checkout (solutions, ``reference``, the grader) covered by an empty tmpfs; the child runs
``python -I -S`` with only a copy of the grader's child modules importable. The child is PID 1 of its PID
namespace, so every descendant dies with it (T17). Where namespaces are unavailable the report says so
(``sandbox.checkout`` / ``sandbox.processes``), an audit hook in the child still refuses paths inside the
checkout, and the launcher is a child subreaper so that escaped descendants stay findable.

Killing is thorough (T17): SIGKILL to the child (PID 1 of its namespace) and to every process of the
launcher's subtree, its process group, and anything whose environment carries the token or whose cwd lies
in the child's temp dir. After every answer of a student child, processes it left running are killed and
reported as a T17 trap. A parent-side watchdog kills the child when the resident memory of its processes
passes a limit.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import isolation, threats
from .protocol import ChannelClosed, ChannelTimeout, ParentChannel, ProtocolError

REPO = str(Path(__file__).resolve().parent.parent)
LAUNCH = str(Path(__file__).resolve().parent / "launch.py")
BOOT = ("import sys, json; cfg = json.loads(sys.argv[1]); sys.path[:0] = cfg['path']; "
        "from autograder.child import main; main()")
PR_SET_PDEATHSIG = 1
KEEP_ENV = isolation.KEEP_ENV
TOKEN_VAR = "AUTOGRADER_SANDBOX_TOKEN"
_NET_PROBE = {}


@dataclass
class Limits:
    cpu_seconds: int = 1800
    file_bytes: int = 64 << 20
    address_space: int | None = 8 << 30       # None: not set (CUDA maps huge virtual ranges)
    rss_bytes: int = 6 << 30                  # parent watchdog on resident memory
    extra_tasks: int = 512                    # RLIMIT_NPROC headroom over the user's current tasks (non-root)
    network_off: bool = True


class SandboxDied(Exception):
    """The child exited, was killed, broke the protocol, or timed out. ``reason`` says which, plainly."""

    def __init__(self, reason: str, kind: str = "crash"):
        super().__init__(reason)
        self.reason, self.kind = reason, kind


def user_tasks() -> int:
    """Processes + threads of this uid (RLIMIT_NPROC counts them all, per user)."""
    uid, n = str(os.getuid()), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/status") as f:
                    st = f.read()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in st.splitlines() if ":" in line)
            if fields.get("Uid", "").split()[:1] == [uid]:
                n += int(fields.get("Threads", "1"))
    return n


def nproc_limit(extra: int) -> int | None:
    """RLIMIT_NPROC for a child: what this user runs now plus ``extra``. None as root, where the kernel does
    not enforce it (the fork/subprocess traps, the process-group kill and the token scan do the work there)."""
    if os.getuid() == 0 or not extra:
        return None
    return user_tasks() + extra


def rlimits(limits: Limits, nproc=None) -> list:
    """``[(RLIMIT name, soft, hard)]`` of a child (set in the child before it runs anything)."""
    out = [("RLIMIT_CORE", 0, 0), ("RLIMIT_CPU", limits.cpu_seconds, limits.cpu_seconds + 5),
           ("RLIMIT_FSIZE", limits.file_bytes, limits.file_bytes)]
    if limits.address_space:
        out.append(("RLIMIT_AS", limits.address_space, limits.address_space))
    if nproc:
        out.append(("RLIMIT_NPROC", nproc, nproc))
    return out


def _preexec(limits: Limits, nproc=None):
    todo = rlimits(limits, nproc)

    def fn():
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for name, soft, hard in todo:
            resource.setrlimit(getattr(resource, name), (soft, hard))
    return fn


def _own_pid_namespace(pid) -> bool:
    """Whether ``pid`` lives in a PID namespace other than this process's (read from ``/proc``, by the parent)."""
    try:
        return bool(pid) and os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


@dataclass
class Sandbox:
    device: str = "cpu"
    limits: Limits = field(default_factory=Limits)
    label: str = "student"
    proc: subprocess.Popen | None = None
    chan: ParentChannel | None = None
    tmp: str | None = None
    token: str = ""
    network: str = "unknown"
    pid: int | None = None                    # the launcher (its session and process group leader)
    child_pid: int | None = None              # the child proper (PID 1 of its namespace when there is one)
    trusted: bool = False                     # the reference child: sees the checkout, no leftover check
    isolation: dict | None = None             # what the launcher achieved (launch.py ``status``)
    zygote: str = ""                          # "torch" / "numpy": forked by that zygote when one runs (zygote.py)
    # a compile child (``gluon_child``): on CPU with the Triton interpreter OFF and no GPU, so that Triton compiles
    # for sm_90a; every isolation layer of a student child, and the wheel's ptxas is the only program it may start
    compile_only: bool = False
    _last_watch: float = 0.0

    def __post_init__(self):
        self.trusted = self.trusted or self.label == "reference"

    def start(self, timeout=60.0):
        self.tmp = tempfile.mkdtemp(prefix=f"autograder-{self.label}-")
        for sub in ("home", "tmp", "triton"):
            os.makedirs(os.path.join(self.tmp, sub))
        self.token = secrets.token_hex(16)
        env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        env.update({
            "HOME": os.path.join(self.tmp, "home"), "TMPDIR": os.path.join(self.tmp, "tmp"),
            "TRITON_CACHE_DIR": os.path.join(self.tmp, "triton"), TOKEN_VAR: self.token,
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "LANG": env.get("LANG", "C.UTF-8"),
            "MPLBACKEND": "Agg",
        })
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "0" if self.compile_only else "1"
            env["CUDA_VISIBLE_DEVICES"] = ""
        if self.compile_only:
            if self.device != "cpu" or self.trusted:
                raise ValueError("a compile child runs a submission on the CPU (device='cpu', not trusted)")
            env.pop("TRITON_PTXAS_PATH", None)          # the wheel's ptxas, the one exec_allow names
        r_req, w_req = os.pipe()
        r_resp, w_resp = os.pipe()
        self.out_path = os.path.join(self.tmp, "stdout.txt")
        self.err_path = os.path.join(self.tmp, "stderr.txt")
        hide = [] if self.trusted else isolation.hidden_dirs()
        keep = isolation.kept_dirs()
        if self.trusted:
            path = [REPO] + isolation.child_sys_path([], keep)
        else:
            path = [isolation.stage_child_code(os.path.join(self.tmp, "grader"))] + isolation.child_sys_path(hide, keep)
        child_cfg = {"path": path, "hide": hide, "keep": keep}
        if self.compile_only:
            ptxas = isolation.triton_ptxas()
            child_cfg["exec_allow"] = [ptxas] if ptxas else []
        launch_cfg = {"argv": [isolation.child_python(), "-I", "-S", "-c", BOOT, json.dumps(child_cfg),
                               str(r_req), str(w_resp)],
                      "fds": [r_req, w_resp], "hide": hide, "keep": keep, "stage": self.tmp,
                      "network_off": self.limits.network_off, "namespaces": isolation.namespaces_enabled()}
        nproc = nproc_limit(self.limits.extra_tasks)
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = None
            if self.zygote and self.device == "cpu" and not self.trusted:
                from . import zygote
                self.proc = zygote.spawn(launch_cfg, env, self.tmp, rlimits(self.limits, nproc),
                                         [r_req, w_resp, out.fileno(), err.fileno()], self.compile_only,
                                         kind=self.zygote)
            if self.proc is None:
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", LAUNCH, json.dumps(launch_cfg)],
                    cwd=self.tmp, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    pass_fds=(r_req, w_resp), start_new_session=True,
                    preexec_fn=_preexec(self.limits, nproc), close_fds=True)
        os.close(r_req)
        os.close(w_resp)
        self.pid = self.proc.pid
        self.chan = ParentChannel(r_resp, w_req)
        self.chan.on_wait = self.watch
        h, _ = self.recv(timeout, expect="hello")
        kids = [p for p in isolation.subtree(self.pid) if p != self.pid]
        self.child_pid = min(kids) if kids else None    # nothing else runs yet: the launcher's one child
        self._pidns = _own_pid_namespace(self.child_pid)
        self.isolation = h.get("isolation") or {}
        mine = os.readlink("/proc/self/ns/net")
        self.network = "off (separate network namespace)" if h.get("net") and h["net"] != mine else \
            "on (could not create a network namespace here)"
        return h

    # -- messaging ----------------------------------------------------------------------------------------
    def send(self, header, arrays=None, timeout=60.0):
        try:
            self.chan.send(header, arrays, timeout)
        except (ChannelClosed, ChannelTimeout) as exc:
            raise self._died(str(exc), "timeout" if isinstance(exc, ChannelTimeout) else "crash") from None

    def recv(self, timeout, expect=None, on_trap=None):
        """Next message that is not a trap report (traps go to ``on_trap`` as they arrive)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                h, arrays = self.chan.recv(max(0.0, deadline - time.monotonic()))
            except ChannelTimeout:
                raise self._died(f"timed out after {timeout:.0f} s (time limit per case)", "timeout") from None
            except ChannelClosed:
                raise self._died("exited or closed its pipe to the grader", "crash") from None
            except ProtocolError as exc:
                raise self._died(f"broke the grading protocol ({exc})", "crash") from None
            if h.get("t") == "trap":
                if on_trap:
                    on_trap(h)
                continue
            if expect and h.get("t") not in ((expect,) if isinstance(expect, str) else expect):
                raise self._died(f"sent {h.get('t')!r} where {expect!r} was expected", "crash")
            if h.get("t") in ("loaded", "result", "error") and not self.trusted:
                self.reap_leftovers(on_trap)
            return h, arrays

    def leftovers(self) -> list[int]:
        """Live processes of this child other than the launcher and the child itself."""
        if self.pid is None:
            return []
        killed = getattr(self, "_killed_leftovers", set())
        return [p for p, st in isolation.subtree(self.pid).items()
                if p not in (self.pid, self.child_pid) and p not in killed and st not in ("Z", "X")]

    def reap_leftovers(self, on_trap=None):
        """Kill what the child left running after answering (a forked or spawned process: T17), reporting it
        as a trap. Nothing of a submission may outlive the call that started it."""
        left = self.leftovers()
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        # A killed process is not gone at once (on a loaded machine it can still read as running at the next
        # answer): remember it, so that it is charged to the call that started it and never to a later one.
        self._killed_leftovers = getattr(self, "_killed_leftovers", set()) | set(left)
        if on_trap:
            on_trap({"t": "trap", "threat": threats.T17,
                     "what": f"{len(left)} process(es) left running by the submission (killed)"})

    def _died(self, why, kind):
        time.sleep(0.05)                       # let a process that is exiting finish, to report its status
        before = self.proc.poll() if self.proc is not None else None
        self.kill()
        detail = ""
        if getattr(self, "_rss_killed", False):
            detail = f" -- killed: resident memory above {self.limits.rss_bytes >> 20} MiB"
        elif before is not None and before < 0:
            sig = -before
            name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
            detail = {signal.SIGXFSZ: " -- killed by SIGXFSZ: file size limit (output or disk flood)",
                      signal.SIGXCPU: " -- killed by SIGXCPU: CPU time limit"}.get(sig, f" -- killed by {name}")
        elif before not in (None, 0):
            detail = f" -- exit status {before}"
        tail = self.stderr_tail(600)
        if "MemoryError" in tail and not detail:
            detail = " -- out of memory (address-space limit)"
        return SandboxDied(f"the sandboxed process {why}{detail}", kind)

    # -- watching and killing -----------------------------------------------------------------------------
    def _members(self):
        """PIDs of this child's processes: the launcher's subtree and process group, plus anything with our
        token or cwd (escaped ones). Where the child is the init of a PID namespace of its own (seen from here,
        not reported by it), nothing of it can leave the launcher's subtree, so the scan of every process of
        the machine for escaped ones is skipped (it runs every 0.5 s while the grader waits)."""
        pids = [p for p in isolation.subtree(self.pid) if p != os.getpid()] if self.pid else []
        if getattr(self, "_pidns", False):
            return [p for p in pids if (isolation.proc_state(p) or "Z") not in "ZX"]
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            pid = int(d)
            if pid == os.getpid() or pid in pids:
                continue
            try:
                if os.getpgid(pid) == self.pid:
                    pids.append(pid)
                    continue
            except OSError:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if self.token.encode() in f.read():
                        pids.append(pid)
                        continue
            except OSError:
                pass
            try:
                if self.tmp and os.readlink(f"/proc/{pid}/cwd").startswith(self.tmp):
                    pids.append(pid)
            except OSError:
                pass
        return [p for p in pids if (isolation.proc_state(p) or "Z") not in "ZX"]    # zombies are dead already

    def rss(self) -> int:
        total = 0
        for pid in self._members():
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                pass
        return total

    def watch(self):
        """Called while the parent waits: kill on resident memory above the limit (checked every 0.5 s)."""
        now = time.monotonic()
        if now - self._last_watch < 0.5 or self.proc is None:
            return
        self._last_watch = now
        if self.rss() > self.limits.rss_bytes:
            self._rss_killed = True
            self.kill_all()

    def kill_all(self):
        for _ in range(3):
            if self.child_pid and self.child_pid in isolation.subtree(self.pid):   # not a recycled pid
                try:
                    os.kill(self.child_pid, signal.SIGKILL)   # PID 1 of its namespace: takes all with it
                except OSError:
                    pass
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, TypeError):
                pass
            members = self._members()
            for pid in members:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not members:
                break
            time.sleep(0.05)

    def kill(self):
        """Kill everything of this child; return its exit status (negative: signal)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.kill_all()
        else:
            self.kill_all()
        try:
            status = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            status = None
        return status

    def stop(self):
        """Ask politely, then kill; remove the temp dir."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.chan.send({"t": "exit"}, timeout=2)
                self.proc.wait(timeout=2)
            except Exception:  # noqa: BLE001 -- we kill below anyway
                pass
        self.kill()
        if hasattr(self.proc, "close"):          # a zygote's child: drop the connection to the zygote
            self.proc.close()
        if self.chan:
            self.chan.close()
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def floods(self):
        """Files of this child that reached the file-size limit (output or disk flood, T17)."""
        hits = []
        for base in (self.tmp,):
            for dirpath, _, files in os.walk(base or "/nonexistent"):
                for f in files:
                    p = os.path.join(dirpath, f)
                    try:
                        if os.path.getsize(p) >= self.limits.file_bytes:
                            hits.append(os.path.relpath(p, self.tmp))
                    except OSError:
                        pass
        return hits

    def stderr_tail(self, n=2000) -> str:
        return _tail(getattr(self, "err_path", None), n)


def _tail(path, n) -> str:
    if not path or not os.path.exists(path):
        return ""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size > n:
                f.seek(size - n)
            data = f.read(n)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    if size > n:
        text = "... " + text + f" [{size} bytes in all, truncated]"
    return text
