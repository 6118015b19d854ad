"""What a sandboxed child may see, and the process tree it leaves behind (parent side of ``launch.py``).

* ``stage_child_code``: the only grader code a student child can import is a copy of the child modules
  (``CHILD_MODULES``) in its own temp dir; the course checkout is not on its ``sys.path``.
* ``child_sys_path``: the parent's import path minus everything inside a course checkout, with no ``.pth``
  processing (the child runs with ``python -I -S``), so an editable install of ``reference``/``autograder``
  is not reachable either.
* ``hidden_dirs``/``kept_dirs``: the directories the launcher covers with an empty tmpfs (every course checkout
  on the way to the grader or to the Python environment) and the ones it binds back (the environment itself).
* ``subtree``: a process and all its descendants, from ``/proc`` (the launcher is a child subreaper, so
  orphans stay in its subtree).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = str(HERE.parent)
CHILD_MODULES = ("child.py", "runner.py", "protocol.py", "traps.py", "audit.py", "where.py", "gluon_child.py",
                 "host_policy.py", "host_guard.py", "host_rules.py", "threats.py", "specs/_base.py", "device_clock.py",
                 "interp_bounds.py", "interp_fast.py")
#: the parent's environment variables a grading child keeps (the sandbox's spawned children and the zygote's)
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "TRITON_PTXAS_PATH",
            "TRITON_LIBCUDA_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "SYSTEMROOT")
ENV_SWITCH = "AUTOGRADER_SANDBOX_NAMESPACES"      # "0": no mount/PID namespaces (debugging a new machine)


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def is_checkout(d: str) -> bool:
    """A copy of this course: it has both the grader and the reference package."""
    return os.path.isdir(os.path.join(d, "autograder")) and os.path.isdir(os.path.join(d, "reference"))


def kept_dirs() -> list[str]:
    """The Python installation the child needs (interpreter prefix, venv, import-path directories)."""
    keep = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}
    keep.update(os.path.realpath(p) for p in sys.path
                if p and os.path.isdir(p) and ("site-packages" in p or "dist-packages" in p))
    return sorted(keep)


def git_relatives(d: str) -> list[str]:
    """The other working trees of the git repository checked out at ``d`` (main checkout and worktrees)."""
    git = os.path.join(d, ".git")
    common = git
    try:
        if os.path.isfile(git):                    # a worktree: "gitdir: <main>/.git/worktrees/<name>"
            with open(git) as f:
                wt = f.read().split("gitdir:", 1)[1].strip()
            common = os.path.dirname(os.path.dirname(wt))
        out = [os.path.dirname(common)]
        wts = os.path.join(common, "worktrees")
        for name in os.listdir(wts) if os.path.isdir(wts) else []:
            with open(os.path.join(wts, name, "gitdir")) as f:
                out.append(os.path.dirname(f.read().strip()))
    except (OSError, IndexError):
        return []
    return [os.path.realpath(p) for p in out if is_checkout(p)]


def hidden_dirs(extra=()) -> list[str]:
    """This checkout, every checkout that contains it, the Python environment or an import-path entry, and
    the other git working trees of those checkouts."""
    out = {os.path.realpath(REPO)}
    starts = [REPO, *kept_dirs(), *[p for p in sys.path if p], *extra]
    for s in starts:
        d = os.path.realpath(s)
        while True:
            if is_checkout(d):
                out.add(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
    for d in list(out):
        out.update(git_relatives(d))
    return sorted(d for d in out if d != "/")


def child_sys_path(hide, keep) -> list[str]:
    """The parent's import path without the checkout (kept directories stay)."""
    seen, out = set(), []
    for p in sys.path:
        if not p or not os.path.isdir(p):
            continue
        r = os.path.realpath(p)
        if any(inside(r, h) for h in hide) and not any(inside(r, k) for k in keep):
            continue
        if r not in seen:
            seen.add(r)
            out.append(r)
    return out


def child_python() -> str:
    """The interpreter path the child is exec'd with: the venv's, by its resolved prefix (the symlinked
    prefix may lie in a directory the child cannot see)."""
    if sys.prefix != sys.base_prefix:
        cand = os.path.join(os.path.realpath(sys.prefix), "bin", os.path.basename(sys.executable))
        if os.path.exists(cand):
            return cand
    return sys.executable


def stage_child_code(dest: str) -> str:
    """Copy the child modules into ``dest/autograder`` (a package with empty ``__init__`` files)."""
    root = os.path.join(dest, "autograder")
    os.makedirs(os.path.join(root, "specs"))
    for init in ("__init__.py", "specs/__init__.py"):
        Path(root, init).write_text('"""Copy of the grader\'s child code for one sandboxed child."""\n')
    for m in CHILD_MODULES:
        shutil.copyfile(HERE / m, os.path.join(root, m))
    return dest


def triton_ptxas() -> str | None:
    """The ``ptxas`` shipped in the Triton wheel (resolved), the one program a compile child may start (T17); found
    without importing Triton. None when there is none."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", "ptxas")
    return os.path.realpath(path) if os.path.isfile(path) else None


def namespaces_enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def _stat(pid: str):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return rest[0], int(rest[1])               # state, ppid
    except (OSError, IndexError, ValueError):
        return None


def proc_state(pid: int) -> str | None:
    """The one-letter state of a process (R, S, Z, ...), None when it is gone."""
    st = _stat(str(pid))
    return st[0] if st else None


def _children_files() -> bool:
    """Whether this kernel lists a task's children (``/proc/<pid>/task/<tid>/children``, CONFIG_PROC_CHILDREN)."""
    global _CHILDREN_FILES
    if _CHILDREN_FILES is None:
        _CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")
    return _CHILDREN_FILES


_CHILDREN_FILES = None


def subtree(root: int) -> dict[int, str]:
    """pid -> state of ``root`` and all its descendants.

    Walked down from ``root`` through each task's ``children`` file: the grader asks after every answer of
    every child, and the scan of every process's ``stat`` (the fallback, ``subtree_by_scan``) cost an a1
    grading 6400 file reads with 60 processes on the machine, and more on a busy one. An orphan is found
    either way: it is reparented inside the tree (to the PID namespace's init, or to the launcher, a child
    subreaper)."""
    if not _children_files():
        return subtree_by_scan(root)
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        st = _stat(str(p))
        if st is None:
            continue
        out[p] = st[0]
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
    return out


def subtree_by_scan(root: int) -> dict[int, str]:
    """``subtree`` from every process's parent link (one read of ``/proc/<pid>/stat`` per process)."""
    kids, state = {}, {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(d)
            if st:
                state[int(d)] = st[0]
                kids.setdefault(st[1], []).append(int(d))
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        if p in out or p not in state:
            continue
        out[p] = state[p]
        todo.extend(kids.get(p, []))
    return out


def describe(status: dict | None) -> dict:
    """Plain-words summary of the launcher's status for the report JSON (``sandbox.checkout/processes``)."""
    if not status:
        return {"checkout": "unknown", "processes": "unknown"}
    why = "; ".join(status.get("why", [])) or "not available here"
    if status.get("hidden") and status.get("locked") and status.get("proc"):
        checkout = "hidden (empty tmpfs over the course checkout in a mount namespace)"
    elif status.get("hidden"):
        checkout = (f"hidden by a mount namespace, partly ({why}); submitted code cannot open it "
                    "(audit hook)")
    else:
        checkout = f"visible to the child's processes ({why}); submitted Python code cannot open it (audit hook)"
    if status.get("pidns"):
        procs = "PID namespace: every process of the submission dies with it"
    else:
        procs = f"no PID namespace ({why}): killed by process group and subreaper descendant scan"
    return {"checkout": checkout, "processes": procs}
