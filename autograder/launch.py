"""Launcher of one sandboxed child: namespaces below Python, then ``exec`` of the grader's child code.

Run by ``autograder.sandbox`` as ``python -I -S launch.py CONFIG_JSON`` (standard library only; it imports
nothing from the course checkout). What it does, each step best effort, the outcome reported to the child in
its argv (and from there to the grader in the ``hello`` message):

1. ``unshare`` a new user, mount, PID and network namespace (the network one: no network, T18). Without
   user namespaces it falls back to no namespace at all, and says so.
2. It becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``) and forks the real child C, which is PID 1 of
   the new PID namespace: when C dies the kernel kills every process left in the namespace, whatever session,
   process group or name it took (T17). Without a PID namespace, orphans of C are re-parented to this
   launcher instead of ``init``, so the grader still finds them as its descendants, and the launcher kills
   what is left when C exits.
3. In C: a fresh ``/proc`` (processes outside the namespace, the grader's ``/proc/PID/cwd`` and ``root``
   included, are gone), an empty read-only ``tmpfs`` over every directory in ``hide`` (the course checkout:
   solutions, ``reference``, the grader's oracles) with the ``keep`` directories (the Python environment,
   when it lives inside a checkout) bind-mounted back, then a second user + mount namespace, so that these
   mounts are *locked*: the child cannot unmount the tmpfs to uncover what is under it (mount_namespaces(7)).
4. ``exec`` of the child command, the pipe descriptors kept open.

The launcher waits for C and exits with C's status (a signal is re-raised on itself), so the grader sees the
same exit statuses as before (SIGXFSZ, SIGXCPU, ...).
"""
import ctypes
import json
import os
import signal
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _enc(s):
    return None if s is None else os.fsencode(s)


def _ok(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags):
    _ok(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(src, target, fstype, flags, data=None):
    _ok(_libc.mount(_enc(src), _enc(target), _enc(fstype), flags, _enc(data)), f"mount {target}")


def map_ids(uid, gid):
    """Map uid/gid 0 of the user namespace just entered onto ``uid``/``gid`` of the one outside."""
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
    except FileNotFoundError:
        pass
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def hide_paths(hide, keep, stage_root):
    """tmpfs over each ``hide`` directory, with the ``keep`` directories inside them bound back."""
    hide = [h for h in sorted(set(hide), key=len) if os.path.isdir(h)]
    hide = [h for i, h in enumerate(hide) if not any(_inside(h, o) for o in hide[:i])]   # outermost only
    kept = [k for k in sorted(set(keep)) if os.path.isdir(k) and any(_inside(k, h) for h in hide)]
    kept = [k for i, k in enumerate(kept) if not any(_inside(k, o) for o in kept[:i])]
    staged = []
    for i, k in enumerate(kept):
        stage = os.path.join(stage_root, f".keep{i}")
        os.mkdir(stage)
        mount(k, stage, None, MS_BIND | MS_REC)
        staged.append((k, stage))
    for h in hide:
        mount("tmpfs", h, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for k, stage in staged:
        os.makedirs(k, exist_ok=True)
        mount(stage, k, None, MS_BIND | MS_REC)
        _libc.umount2(_enc(stage), MNT_DETACH)
        os.rmdir(stage)
    for h in hide:
        try:
            mount("tmpfs", h, "tmpfs", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
        except OSError:
            pass
    return hide


def setup_child(cfg, status):
    """In C (PID 1 of the new namespaces when they exist): /proc, hiding, locking. Fills ``status``."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)       # C dies with the launcher (which dies with the grader)
    if not status["mountns"]:
        return
    mount(None, "/", None, MS_REC | MS_PRIVATE)          # nothing done here propagates to the host
    if status["pidns"]:
        try:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            status["proc"] = True
        except OSError as exc:
            status["why"].append(f"fresh /proc: {exc.strerror}")
    if cfg.get("hide"):
        try:
            status["hidden"] = hide_paths(cfg["hide"], cfg.get("keep", []), cfg["stage"])
        except OSError as exc:
            status["why"].append(f"hiding the checkout: {exc.strerror}")
    try:
        unshare(CLONE_NEWUSER | CLONE_NEWNS)              # lock the mounts above (less privileged namespace)
        map_ids(0, 0)
        status["locked"] = True
    except OSError as exc:
        status["why"].append(f"locking mounts: {exc.strerror}")


def main():
    run(json.loads(sys.argv[1]))


def run(cfg, start=None):
    """Steps 1-4 of the module docstring for ``cfg``; ``start(argv)`` (the zygote, ``autograder.zygote``) runs
    the child command in this process instead of ``exec`` (its interpreter already holds torch and Triton)."""
    status = {"userns": False, "mountns": False, "pidns": False, "netns": False, "proc": False, "hidden": [],
              "locked": False, "why": []}
    uid, gid = os.getuid(), os.getgid()
    net = CLONE_NEWNET if cfg.get("network_off", True) else 0
    attempts = [(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | net, ("userns", "mountns", "pidns")),
                (CLONE_NEWUSER | net, ("userns",))]
    if not cfg.get("namespaces", True):
        attempts = attempts[1:]
        status["why"].append("mount/PID namespaces switched off (AUTOGRADER_SANDBOX_NAMESPACES=0)")
    for flags, got in attempts:
        try:
            unshare(flags)
        except OSError as exc:
            status["why"].append(f"unshare({'+'.join(got)}): {exc.strerror}")
            continue
        for k in got:
            status[k] = True
        status["netns"] = bool(net)
        try:
            map_ids(uid, gid)
        except OSError as exc:
            status["why"].append(f"uid map: {exc.strerror}")
        break
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    fds = cfg["fds"]
    pid = os.fork()
    if pid == 0:
        try:
            setup_child(cfg, status)
        except Exception as exc:  # noqa: BLE001 -- report and go on without that layer
            status["why"].append(f"setup: {exc}")
        argv = list(cfg["argv"]) + [json.dumps(status)]
        if start is None:
            os.execv(argv[0], argv)
        try:
            start(argv)
        except BaseException:  # noqa: BLE001 -- say why on stderr (captured), then go as an exec failure would
            import traceback
            traceback.print_exc()
            sys.stderr.flush()
        os._exit(1)
    for fd in fds:                                       # only C holds the protocol pipes: EOF when C dies
        os.close(fd)
    code = None
    while True:
        try:
            wpid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if wpid == pid:
            code = st
        if code is not None:
            _kill_children()          # no PID namespace: orphans were re-parented to us; none may outlive C
    if code is None:
        os._exit(1)
    if os.WIFSIGNALED(code):
        sig = os.WTERMSIG(code)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(code) if os.WIFEXITED(code) else 1)


def _kill_children():
    me = str(os.getpid())
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = f.read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if ppid == me:
            try:
                os.kill(int(d), signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    main()
