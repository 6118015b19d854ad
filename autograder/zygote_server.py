"""The zygote: one process that imports torch, Triton and the child modules once, then forks a sandboxed child
per grading (the grader's side is ``autograder.zygote``). A Triton grading's child spent about 1.8 s of CPU
importing torch and Triton (notes/test_suite.md); forked from here it starts with both imported. With
``"torch": false`` in its config it imports NumPy and the child modules only and forks the children of NumPy
assignments (a child of a NumPy assignment never finds torch already imported).

Run as ``python -I -S -c ZBOOT CONFIG`` (``zygote.start``) with the scrubbed environment a child gets, cwd in
its own temp dir, and the secret token on stdin. ``CONFIG``: ``path`` (a staged copy of the child modules and
the Python environment, as a child's), ``launch`` (the path of ``launch.py``), ``name`` (an abstract Unix
socket: it lives in this network namespace, which no child with its own network namespace can reach).

Per request (a SOCK_SEQPACKET message: JSON ``token``, ``launch`` config, ``env``, ``cwd``, ``rlimits``, and
four descriptors: the two protocol pipes, stdout, stderr) it forks L, which does what ``Popen`` + ``launch.py``
do for a spawned child: a new session, stdio, cwd, the child's environment, rlimits, no other descriptor, then
``launch.run`` (namespaces, subreaper, C = PID 1 with the checkout hidden), and in C the child's ``main``
instead of ``exec``. This process answers ``{"pid": L}``, later ``{"exit": wait status}`` when L is reaped, and
kills L's process group when the grader closes the connection (the grader died or is done).

What a child could inherit from here, and why it does not matter or is reset: nothing of a submission ever
ran here (a fresh fork per grading, never reused); Python's ``random`` and NumPy's global generator are
reseeded from the OS (as in a fresh process); the environment, cwd, stdio, rlimits, session and descriptors
are the child's own; no thread runs here (``fork`` after importing torch is safe: checked at start, refused
otherwise); the token stays in memory, but the socket is unreachable from a child's network namespace, and the
zygote is not used where that namespace cannot be made (``probe_namespaces``).
"""
import contextlib
import ctypes
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import traceback

PR_SET_PDEATHSIG = 1
CHILD = ("child", "runner", "protocol", "traps", "audit", "where", "host_policy", "host_guard", "specs._base")
MAX_MSG = 1 << 20


def _load_launch(path):
    spec = importlib.util.spec_from_file_location("autograder_launch", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def probe_namespaces(launch):
    """Whether a forked process can enter new user + mount + PID + network namespaces (what the zygote relies on
    to keep its socket out of the children's reach)."""
    pid = os.fork()
    if pid == 0:
        try:
            launch.unshare(launch.CLONE_NEWUSER | launch.CLONE_NEWNS | launch.CLONE_NEWPID | launch.CLONE_NEWNET)
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(1)
    _, st = os.waitpid(pid, 0)
    return os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0


def _start_child(argv, base_path):
    """In C: what ``python -I -S -c BOOT CFG RFD WFD STATUS`` would do, with the modules already imported."""
    import random

    import numpy as np
    cfg = json.loads(argv[5])
    sys.argv = ["-c"] + list(argv[5:])
    sys.path[:] = list(cfg["path"]) + base_path
    random.seed()
    np.random.seed()
    from autograder.child import main
    main(["-c"] + list(argv[5:]))


def _fork_child(req, fds, launch, base_path, closing):
    r, w, out, err = fds
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for s in closing:
            s.close()
        os.setsid()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import tempfile
        tempfile.tempdir = None
        import resource
        for name, soft, hard in req["rlimits"]:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        keep = {0, 1, 2, r, w}
        for fd in [int(f) for f in os.listdir("/proc/self/fd")]:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        cfg = dict(req["launch"])
        cfg["fds"] = [r, w]
        cfg["argv"] = list(cfg["argv"][:-2]) + [str(r), str(w)]
        launch.run(cfg, start=lambda argv: _start_child(argv, base_path))
    except BaseException:  # noqa: BLE001 -- say why on the child's stderr
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


def serve(lst, token, launch, base_path):
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    conns = {}                         # connection -> L's pid (None: no request yet, 0: L reaped)
    while True:
        ready, _, _ = select.select([lst, sys.stdin, wake_r, *conns], [], [], 1.0)
        for s in ready:
            if s is sys.stdin:
                if not sys.stdin.readline():             # the grader that started us is gone
                    for pid in conns.values():
                        if pid:
                            _kill(pid)
                    return
            elif s is wake_r:
                os.read(wake_r, 4096)
            elif s is lst:
                c, _ = lst.accept()
                conns[c] = None
            elif conns[s] is None:
                try:
                    msg, fds, _, _ = socket.recv_fds(s, MAX_MSG, 4)
                    req = json.loads(msg) if msg else None
                except (OSError, ValueError):
                    req, fds = None, []
                if not req or req.get("token") != token or len(fds) != 4:
                    for fd in fds:
                        os.close(fd)
                    s.close()
                    del conns[s]
                    continue
                pid = _fork_child(req, fds, launch, base_path, [lst, *conns, sys.stdin])
                for fd in fds:
                    os.close(fd)
                conns[s] = pid
                s.send(json.dumps({"pid": pid}).encode())
            else:
                try:
                    data = s.recv(64)
                except OSError:
                    data = b""
                if not data:                                 # the grader closed: nothing of this child stays
                    if conns[s]:
                        _kill(conns[s])
                    s.close()
                    del conns[s]
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            for c, p in conns.items():
                if p == pid:
                    conns[c] = 0
                    try:
                        c.send(json.dumps({"exit": st}).encode())
                    except OSError:
                        pass


def _kill(pid):
    for f in (os.killpg, os.kill):
        try:
            f(pid, signal.SIGKILL)
        except OSError:
            pass


def main():
    cfg = json.loads(sys.argv[1])
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    token = sys.stdin.readline().strip()
    base_path = list(sys.path)
    sys.path[:0] = cfg["path"]
    launch = _load_launch(cfg["launch"])

    def answer(ok, why=""):
        sys.stdout.write(json.dumps({"ready": ok, "why": why}) + "\n")
        sys.stdout.flush()

    if not probe_namespaces(launch):
        return answer(False, "no user/mount/PID/network namespaces here")
    import gc
    gc.disable()         # importing torch makes objects, not garbage: no collection walks them until the freeze
    import numpy  # noqa: F401
    if cfg.get("torch", True):          # the NumPy zygote (``"torch": false``) forks NumPy assignments' children
        import torch  # noqa: F401
        import triton  # noqa: F401
        import triton.language  # noqa: F401
        # what a child's first launch imports (triton.runtime.jit.mangle_type -> gluon): 0.15 s of CPU per child
        with contextlib.suppress(ImportError):
            import triton.experimental.gluon  # noqa: F401
        # what the first backward of an autograd grading imports (torch.autograd._make_grads): sympy, 1.7 s of CPU
        import torch.fx.experimental.symbolic_shapes  # noqa: F401
    for m in CHILD:
        importlib.import_module(f"autograder.{m}")
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        return answer(False, f"{threads} threads after importing torch (fork would not be safe)")
    gc.collect()
    gc.freeze()          # no child's collector traverses (and copies on write) the imported modules' objects
    gc.enable()
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    lst.bind("\0" + cfg["name"])
    lst.listen(64)
    answer(True)
    serve(lst, token, launch, base_path)


if __name__ == "__main__":
    main()
