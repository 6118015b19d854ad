"""Runtime traps installed in a submission's child process before its code runs (T10, T11, T1, T17, T18, T3).

A trap replaces a forbidden function by one that first *reports* the call to the parent at once (over the
protocol pipe, so catching the exception -- T11 -- does not hide it) and then raises. Library-internal use is
left alone where it matters: imports and OS calls are trapped only when made from the submission's own code
(its globals dict), torch's softmax/attention functions whenever submitted code is running.

Also here: a snapshot of attributes that must not be monkeypatched (timers, comparison helpers, the harness),
and a counter of Triton kernel launches (a Triton task must launch a kernel, not fall back to torch).

Below these caller-aware wrappers sits an audit hook (``install_audit``, PEP 578: it sees the call whatever
alias or module it was reached through, ``posix.fork`` and ``pathlib.Path.read_text`` included, and cannot be
removed): it refuses every path inside the course checkout (the launcher also hides the checkout from the
child's filesystem view where namespaces exist, ``autograder.launch``), and process, signal and socket calls
made directly by the submission's code. Processes started through a library are not stopped here; they die
with the child's PID namespace and are reported by the grader as left running (``Sandbox.reap_leftovers``).
"""
from __future__ import annotations

import builtins
import importlib
import os
import sys

# module roots a submission may never import, with the threat they belong to
FORBIDDEN_ROOTS = {
    "reference": "T10", "flash_attn": "T10", "xformers": "T10", "vllm": "T10", "importlib": "T10",
    "runpy": "T10", "pkgutil": "T10", "zipimport": "T10", "code": "T10", "codeop": "T10",
    "ctypes": "T17", "cffi": "T17", "subprocess": "T17", "multiprocessing": "T17", "signal": "T17",
    "resource": "T17", "pty": "T17",
    "threading": "T13", "_thread": "T13", "concurrent": "T13", "asyncio": "T13",
    "socket": "T18", "ssl": "T18", "urllib": "T18", "http": "T18", "requests": "T18", "ftplib": "T18",
    "smtplib": "T18", "shutil": "T18", "tempfile": "T18", "glob": "T2",
    "pickle": "T4", "marshal": "T4", "dill": "T4", "cloudpickle": "T4", "shelve": "T4", "copyreg": "T4",
    "gc": "T3", "inspect": "T3", "builtins": "T3", "autograder": "T3", "tracemalloc": "T3", "unittest": "T3",
}
ALLOWED_SUBMODULES = {"autograder.check"}      # stubbed in the child: check() does nothing there

OS_TRAPS = {
    "system": "T17", "popen": "T17", "fork": "T17", "forkpty": "T17", "kill": "T17", "killpg": "T17",
    "execv": "T17", "execve": "T17", "execl": "T17", "execle": "T17", "execlp": "T17", "execvp": "T17",
    "execvpe": "T17", "spawnv": "T17", "spawnve": "T17", "posix_spawn": "T17", "posix_spawnp": "T17",
    "setsid": "T17", "setpgid": "T17", "write": "T1", "fdopen": "T1", "dup2": "T1", "remove": "T18",
    "unlink": "T18", "rmdir": "T18", "rename": "T18", "replace": "T18", "listdir": "T2", "scandir": "T2",
    "walk": "T2", "getppid": "T17", "open": "T1",
}
TORCH_TRAPS = [
    ("torch", "softmax"), ("torch", "log_softmax"), ("torch", "_softmax"),
    ("torch.nn.functional", "softmax"), ("torch.nn.functional", "log_softmax"),
    ("torch.nn.functional", "scaled_dot_product_attention"), ("torch.special", "softmax"),
    ("torch.special", "log_softmax"), ("torch.Tensor", "softmax"), ("torch.Tensor", "log_softmax"),
]
PROTECTED = [
    ("time", "perf_counter"), ("time", "perf_counter_ns"), ("time", "time"), ("time", "time_ns"),
    ("time", "monotonic"), ("time", "monotonic_ns"), ("time", "process_time"),
    ("numpy", "allclose"), ("numpy", "isclose"), ("numpy", "array_equal"), ("numpy", "save"), ("numpy", "load"),
    ("numpy.testing", "assert_allclose"), ("numpy.linalg", "norm"),
    ("torch", "allclose"), ("torch.testing", "assert_close"), ("torch.cuda", "synchronize"), ("torch.cuda", "Event"),
    ("autograder.runner", "execute"), ("autograder.runner", "describe"), ("autograder.runner", "_clock"),
    ("autograder.runner", "sync"), ("autograder.runner", "input_hashes"), ("autograder.runner", "array_hash"),
    ("autograder.runner", "materialise"), ("autograder.runner", "gen_array"), ("autograder.runner", "sample_output"),
    ("autograder.runner", "snapshot_inputs"), ("autograder.runner", "compare_snapshot"),
    ("autograder.protocol", "pack"), ("autograder.protocol", "encode_array"), ("autograder.child", "serve"),
]


# audit events that carry paths (their first two arguments are checked) and calls refused to submitted code
PATH_EVENTS = {"open", "os.listdir", "os.scandir", "os.chdir", "os.mkdir", "os.rename", "os.symlink", "os.link",
               "os.remove", "os.rmdir", "os.truncate", "os.chmod", "os.chown", "os.utime", "os.exec",
               "os.posix_spawn", "os.spawn", "shutil.copyfile", "shutil.copytree", "shutil.rmtree", "glob.glob",
               "ctypes.dlopen"}
DIRECT_EVENTS = {"os.fork": "T17", "os.forkpty": "T17", "os.exec": "T17", "os.posix_spawn": "T17",
                 "os.spawn": "T17", "os.system": "T17", "os.kill": "T17", "os.killpg": "T17",
                 "subprocess.Popen": "T17", "socket.connect": "T18", "socket.bind": "T18",
                 "socket.getaddrinfo": "T18"}


class _Audit:
    """State of the audit hook: hidden/kept directories, the submission's namespace, the reporter."""
    hide: tuple = ()
    keep: tuple = ()
    ns = None
    report = None
    busy = False

    def hidden(self, arg) -> str | None:
        if isinstance(arg, int) or arg is None:
            return None
        try:
            p = os.fsdecode(os.fspath(arg))
        except TypeError:
            return None
        real = os.path.realpath(p)
        if any(_inside(real, h) for h in self.hide) and not any(_inside(real, k) for k in self.keep):
            return real
        return None

    def __call__(self, event, args):
        if self.busy:
            return
        self.busy = True
        try:
            if event in PATH_EVENTS:
                for a in args[:2]:
                    real = self.hidden(a)
                    if real:
                        self._refuse("T2", f"{event}({real!r}): the course checkout is off limits", PermissionError)
            threat = DIRECT_EVENTS.get(event)
            if threat and self.ns is not None and sys._getframe(1).f_globals is self.ns:
                self._refuse(threat, f"{event} called by the submission", RuntimeError)
        finally:
            self.busy = False

    def _refuse(self, threat, what, exc):
        if self.report is not None and self.ns is not None:
            self.report(threat, what)
        raise exc(f"autograder: {what} is not allowed in a submission")


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


AUDIT = _Audit()


def install_audit(hide, keep):
    """Install the audit hook once, before any submitted code runs (it cannot be removed afterwards)."""
    AUDIT.hide, AUDIT.keep = tuple(hide), tuple(keep)
    sys.addaudithook(AUDIT)


def _resolve(modname, attr):
    mod = sys.modules.get(modname.split(".Tensor")[0] if modname.endswith(".Tensor") else modname)
    if modname == "torch.Tensor":
        torch = sys.modules.get("torch")
        return (torch.Tensor if torch is not None else None), attr
    return mod, attr


class Traps:
    def __init__(self, ns: dict, report, extra_forbidden=()):
        self.ns = ns
        self.report = report                  # report(threat, what) -> sends a message to the parent
        self.active = False
        self.launches = 0
        self.poison = False                   # poison mode of the Triton launch wrapper (``_count_launches``)
        self.stores = 0                       # elements changed by Triton kernels in poison mode
        self.extra = {m: "T10" for m in extra_forbidden}
        self.snapshot = {}

    # -- helpers ------------------------------------------------------------------------------------------
    def _from_submission(self, depth=2) -> bool:
        try:
            return sys._getframe(depth).f_globals is self.ns
        except ValueError:
            return False

    def fire(self, threat, what):
        self.report(threat, what)
        raise RuntimeError(f"autograder: {what} is not allowed in a submission")

    def forbidden_module(self, name: str):
        if name in ALLOWED_SUBMODULES:
            return None
        root = name.split(".")[0]
        return FORBIDDEN_ROOTS.get(root) or self.extra.get(root)

    # -- installation -------------------------------------------------------------------------------------
    def install(self):
        traps = self
        AUDIT.ns = self.ns
        real_import = builtins.__import__

        def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
            if globals is traps.ns and level == 0:
                threat = traps.forbidden_module(name)
                if threat is None and name == "autograder" and fromlist:
                    bad = [f for f in fromlist if f"autograder.{f}" not in ALLOWED_SUBMODULES]
                    threat = "T3" if bad else None
                if threat:
                    traps.report(threat, f"import {name}")
                    raise ImportError(f"autograder: importing {name} is not allowed in a submission")
            return real_import(name, globals, locals, fromlist, level)
        builtins.__import__ = guarded_import

        real_import_module = importlib.import_module

        def guarded_import_module(name, package=None):
            if traps._from_submission():
                traps.fire("T10", f"importlib.import_module({name!r})")
            return real_import_module(name, package)
        importlib.import_module = guarded_import_module

        for name, threat in OS_TRAPS.items():
            if hasattr(os, name):
                setattr(os, name, self._guard_caller(getattr(os, name), f"os.{name}", threat))
        builtins.open = self._guard_caller(builtins.open, "open()", "T1")
        for fn in ("exec", "eval", "compile", "__import__"):
            pass                                # static scan covers these; exec/eval are needed by libraries
        self.install_torch()

    def _guard_caller(self, orig, what, threat):
        traps = self

        def guard(*args, **kwargs):
            if traps._from_submission():
                traps.fire(threat, f"{what}")
            return orig(*args, **kwargs)
        guard.__wrapped_by_autograder__ = True
        return guard

    def install_torch(self):
        torch = sys.modules.get("torch")
        if torch is None:
            return
        import torch.nn.functional  # noqa: F401
        for modname, attr in TORCH_TRAPS:
            obj, _ = _resolve(modname, attr)
            orig = getattr(obj, attr, None) if obj is not None else None
            if orig is None:
                continue
            setattr(obj, attr, self._guard_active(orig, f"{modname}.{attr}"))
        tr = sys.modules.get("triton")
        if tr is not None:
            self._count_launches()

    def _guard_active(self, orig, what):
        traps = self

        def guard(*args, **kwargs):
            if traps.active:
                traps.fire("T10", f"{what}()")
            return orig(*args, **kwargs)
        return guard

    def _count_launches(self):
        """Wrap every Triton launch (compiled and interpreted): count it, and in *poison mode* overwrite with
        NaN every floating-point element that the kernel changed in its tensor arguments, right after it ran.
        The grader runs each Triton task's call once more in poison mode: a result that does not change (is
        not NaN where the kernels wrote) was not produced by the Triton kernels (a launched kernel that does
        nothing, or writes a scratch buffer, while torch computes the answer)."""
        traps = self
        classes = []
        try:
            from triton.runtime.jit import JITFunction
            classes.append(JITFunction)
        except ImportError:
            pass
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            orig = cls.run

            def run(self, *args, __orig=orig, **kwargs):
                if kwargs.get("warmup", False):
                    return __orig(self, *args, **kwargs)
                traps.launches += 1
                if not traps.poison:
                    return __orig(self, *args, **kwargs)
                tensors = _float_tensors(list(args) + list(kwargs.values()))
                before = [t.detach().clone() for t in tensors]
                out = __orig(self, *args, **kwargs)
                traps.stores += poison_changed(tensors, before)
                return out
            cls.run = run

    # -- monkeypatch detection ----------------------------------------------------------------------------
    def take_snapshot(self):
        self.snapshot = {}
        for modname, attr in PROTECTED:
            mod = sys.modules.get(modname)
            if mod is not None and hasattr(mod, attr):
                self.snapshot[(modname, attr)] = getattr(mod, attr)

    def patched(self):
        out = []
        for (modname, attr), obj in self.snapshot.items():
            mod = sys.modules.get(modname)
            if mod is None or getattr(mod, attr, None) is not obj:
                out.append(f"{modname}.{attr}")
        return out


def _float_tensors(objs):
    """Floating-point torch tensors among kernel arguments (a TMA descriptor's ``base`` counts too)."""
    torch = sys.modules.get("torch")
    out = []
    for a in objs:
        t = a if torch is not None and isinstance(a, torch.Tensor) else getattr(a, "base", None)
        if torch is not None and isinstance(t, torch.Tensor) and t.is_floating_point() and t.element_size() > 1:
            out.append(t)
    return out


def poison_changed(tensors, before) -> int:
    """Set to NaN the elements of ``tensors`` that differ from ``before`` (NaN == NaN); return how many."""
    torch = sys.modules["torch"]
    n = 0
    if tensors and tensors[0].is_cuda:
        torch.cuda.synchronize()
    with torch.no_grad():
        for t, b in zip(tensors, before):
            d = t.data
            changed = (d != b) & ~(torch.isnan(d) & torch.isnan(b))
            k = int(changed.sum())
            if k:
                d.masked_fill_(changed, float("nan"))
                n += k
    return n


class nan_filled_allocations:
    """Inside: every floating-point tensor from ``torch.empty``, ``empty_like``, ``empty_strided`` and
    ``Tensor.new_empty`` starts as NaN (fp8 types excluded, as in ``_float_tensors``).

    Used for the poison-mode re-run: ``poison_changed`` sees a store only where it changes memory, and an
    uninitialised output of the re-run may reuse the freed buffer of the normal run (the caching allocator on
    a GPU, malloc on a CPU), which already holds the values the kernel writes again. A correct solution was
    flagged that way (a3b's dK/dV: 2% of dv "changed"). Starting from NaN, every non-NaN store counts."""

    NAMES = (("torch", "empty"), ("torch", "empty_like"), ("torch", "empty_strided"), ("torch.Tensor", "new_empty"))

    def __enter__(self):
        torch = sys.modules.get("torch")
        self.saved = []
        if torch is None:
            return self
        owners = {"torch": torch, "torch.Tensor": torch.Tensor}
        for owner, attr in self.NAMES:
            obj = owners[owner]
            orig = getattr(obj, attr)

            def nan_first(*args, __orig=orig, **kwargs):
                t = __orig(*args, **kwargs)
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.element_size() > 1:
                    t.fill_(float("nan"))
                return t
            self.saved.append((obj, attr, orig))
            setattr(obj, attr, nan_first)
        return self

    def __exit__(self, *exc):
        for obj, attr, orig in reversed(self.saved):
            setattr(obj, attr, orig)
        return False
