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

from .threats import T1, T2, T3, T4, T10, T13, T17, T18

# module roots a submission may never import, with the threat they belong to
FORBIDDEN_ROOTS = {
    "reference": T10, "experiments": T10, "benchmarks": T10, "flash_attn": T10, "xformers": T10, "vllm": T10, "importlib": T10,
    "runpy": T10, "pkgutil": T10, "zipimport": T10, "code": T10, "codeop": T10,
    "ctypes": T17, "cffi": T17, "subprocess": T17, "multiprocessing": T17, "signal": T17,
    "resource": T17, "pty": T17,
    "threading": T13, "_thread": T13, "concurrent": T13, "asyncio": T13,
    "socket": T18, "ssl": T18, "urllib": T18, "http": T18, "requests": T18, "ftplib": T18,
    "smtplib": T18, "shutil": T18, "tempfile": T18, "glob": T2,
    "pickle": T4, "marshal": T4, "dill": T4, "cloudpickle": T4, "shelve": T4, "copyreg": T4,
    "gc": T3, "inspect": T3, "builtins": T3, "autograder": T3, "tracemalloc": T3, "unittest": T3,
}
# torch internals that switch the op audit off (``autograder.audit``) or compute behind it: importing them is
# refused like a forbidden root (the static scan flags their attribute spellings too)
FORBIDDEN_PREFIXES = {
    "torch._C": T3, "torch.overrides": T3, "torch.utils._python_dispatch": T3, "torch._subclasses": T3,
    "torch._ops": T3, "torch.utils.dlpack": T10, "torch._dynamo": T10, "torch._inductor": T10,
    "torch.fx": T10, "torch.func": T10, "torch._functorch": T10, "functorch": T10, "torch.library": T10,
    "torch._prims": T10, "torch._refs": T10, "torch._decomp": T10, "torch.compiler": T10,
}
# functions that pop or disable the audit's torch modes: refused when the submission calls them
MODE_ESCAPES = [("torch._C", "DisableTorchFunction"), ("torch._C", "_DisableTorchDispatch"),
                ("torch._C", "_pop_torch_function_stack"), ("torch._C", "_pop_torch_dispatch_stack"),
                ("torch._C", "_set_torch_function_mode"), ("torch._C", "_unset_dispatch_mode"),
                ("torch.utils._python_dispatch", "_disable_current_modes"),
                ("torch.utils._python_dispatch", "_pop_mode_temporarily"), ("torch.overrides", "_pop_mode"),
                ("torch.overrides", "_pop_mode_temporarily")]
ALLOWED_SUBMODULES = {"autograder.check"}      # stubbed in the child: check() does nothing there

OS_TRAPS = {
    "system": T17, "popen": T17, "fork": T17, "forkpty": T17, "kill": T17, "killpg": T17,
    "execv": T17, "execve": T17, "execl": T17, "execle": T17, "execlp": T17, "execvp": T17,
    "execvpe": T17, "spawnv": T17, "spawnve": T17, "posix_spawn": T17, "posix_spawnp": T17,
    "setsid": T17, "setpgid": T17, "write": T1, "fdopen": T1, "dup2": T1, "remove": T18,
    "unlink": T18, "rmdir": T18, "rename": T18, "replace": T18, "listdir": T2, "scandir": T2,
    "walk": T2, "getppid": T17, "open": T1,
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
    ("autograder.device_clock", "busy_seconds"), ("autograder.device_clock", "_device_intervals"),
    ("torch.profiler", "profile"),
    ("autograder.protocol", "pack"), ("autograder.protocol", "encode_array"), ("autograder.child", "serve"),
    # a compile child's checks (``gluon_child``) and the compiler they call: a submission that swaps them to forge
    # PTX or a cubin is flagged (the parent also reads the cubin itself, ``gluon_compile``)
    ("autograder.gluon_child", "probe"), ("autograder.gluon_child", "compile_kernel"),
    ("autograder.gluon_child", "plain"), ("triton", "compile"), ("triton.compiler", "compile"),
    ("triton.compiler.compiler", "compile"), ("triton.experimental.gluon._runtime", "GluonASTSource"),
]


# audit events that carry paths (their first two arguments are checked) and calls refused to submitted code
PATH_EVENTS = {"open", "os.listdir", "os.scandir", "os.chdir", "os.mkdir", "os.rename", "os.symlink", "os.link",
               "os.remove", "os.rmdir", "os.truncate", "os.chmod", "os.chown", "os.utime", "os.exec",
               "os.posix_spawn", "os.spawn", "shutil.copyfile", "shutil.copytree", "shutil.rmtree", "glob.glob",
               "ctypes.dlopen"}
DIRECT_EVENTS = {"os.fork": T17, "os.forkpty": T17, "os.exec": T17, "os.posix_spawn": T17,
                 "os.spawn": T17, "os.system": T17, "os.kill": T17, "os.killpg": T17,
                 "subprocess.Popen": T17, "socket.connect": T18, "socket.bind": T18,
                 "socket.getaddrinfo": T18}
# process-starting events and where their program is, for a compile child's ``exec_allow`` (None: no program)
EXEC_EVENTS = {"subprocess.Popen": lambda a: a[0] if a[0] else (a[1] if isinstance(a[1], (str, bytes)) else
                                                                 (list(a[1]) or [None])[0]),
               "os.exec": lambda a: a[0], "os.posix_spawn": lambda a: a[0], "os.spawn": lambda a: a[1],
               "os.system": lambda a: None, "os.fork": lambda a: None, "os.forkpty": lambda a: None}


class _Audit:
    """State of the audit hook: hidden/kept directories, the submission's namespace, the reporter."""
    hide: tuple = ()
    keep: tuple = ()
    ns = None
    report = None
    busy = False
    exec_allow = None          # a compile child: the only programs any code may start (the wheel's ptxas)

    def allowed_exec(self, event, args) -> bool:
        try:
            prog = EXEC_EVENTS[event](args)
            return prog is not None and os.path.realpath(os.fsdecode(prog)) in self.exec_allow
        except (TypeError, IndexError, ValueError):
            return False

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
                        self._refuse(T2, f"{event}({real!r}): the course checkout is off limits", PermissionError)
            if self.exec_allow is not None and event in EXEC_EVENTS and not self.allowed_exec(event, args):
                self._refuse(T17, f"{event} of a program other than ptxas in a compile child", PermissionError)
            threat = DIRECT_EVENTS.get(event)
            if threat and self.ns is not None and sys._getframe(1).f_globals is self.ns:
                self._refuse(threat, f"{event} called by the submission", RuntimeError)
        finally:
            self.busy = False

    def _refuse(self, threat, what, exc):
        if self.report is not None and self.ns is not None:
            self.report(threat, what)
        raise exc(f"autograder: {what} is not allowed in a submission")


def forbidden_prefix(name: str):
    """The threat of importing ``name`` when it is (inside) one of ``FORBIDDEN_PREFIXES``, else None."""
    for p, threat in FORBIDDEN_PREFIXES.items():
        if name == p or name.startswith(p + "."):
            return threat
    return None


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


AUDIT = _Audit()


def install_audit(hide, keep, exec_allow=None):
    """Install the audit hook once, before any submitted code runs (it cannot be removed afterwards).
    ``exec_allow``: a compile child's list of the only programs any code in it may start (whoever calls)."""
    AUDIT.hide, AUDIT.keep = tuple(hide), tuple(keep)
    AUDIT.exec_allow = None if exec_allow is None else frozenset(os.path.realpath(p) for p in exec_allow)
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
        self.extra = {m: T10 for m in extra_forbidden}
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
        return FORBIDDEN_ROOTS.get(root) or self.extra.get(root) or forbidden_prefix(name)

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
                    threat = T3 if bad else None
                if threat:
                    traps.report(threat, f"import {name}")
                    raise ImportError(f"autograder: importing {name} is not allowed in a submission")
            return real_import(name, globals, locals, fromlist, level)
        builtins.__import__ = guarded_import

        real_import_module = importlib.import_module

        def guarded_import_module(name, package=None):
            if traps._from_submission():
                traps.fire(T10, f"importlib.import_module({name!r})")
            return real_import_module(name, package)
        importlib.import_module = guarded_import_module

        for name, threat in OS_TRAPS.items():
            if hasattr(os, name):
                setattr(os, name, self._guard_caller(getattr(os, name), f"os.{name}", threat))
        builtins.open = self._guard_caller(builtins.open, "open()", T1)
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
        import torch.overrides  # noqa: F401
        import torch.utils._python_dispatch  # noqa: F401
        for modname, attr in MODE_ESCAPES:
            mod = sys.modules.get(modname)
            orig = getattr(mod, attr, None) if mod is not None else None
            if orig is not None:
                setattr(mod, attr, self._guard_caller(orig, f"{modname}.{attr} (switches the op audit off)", T3))
        tr = sys.modules.get("triton")
        if tr is not None:
            self._count_launches()

    def _guard_active(self, orig, what):
        traps = self

        def guard(*args, **kwargs):
            if traps.active:
                traps.fire(T10, f"{what}()")
            return orig(*args, **kwargs)
        return guard

    def _count_launches(self):
        """Count every Triton launch (compiled and interpreted) through the shared launch hook
        (``audit.LaunchHook``), which also shows each launch to the op audit of the current call."""
        from .audit import LaunchHook
        LaunchHook.install()

        def count():
            self.launches += 1
        LaunchHook.count = count

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
