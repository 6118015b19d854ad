"""The runtime side of the host policy of Triton parts (``autograder.host_policy``, docs/design.md §6, T10).

Code compiled by ``host_policy.compile_cell`` calls ``__ag__`` (a ``Guard`` in the submission's namespace) for
every attribute read, write, operator, comparison, reflective or numeric builtin and ``from M import x``;
the guard answers from the allow-lists below and raises ``PolicyError`` (reported as T10 while a graded
call runs) for the rest. Also here: the launch check (kernel arguments, the globals kernels read), a3b's
autograd source check, and ``wrap_call`` (one graded call under the guard).
"""
from __future__ import annotations

import builtins
import operator
import os
import sys
import types
import weakref

from .host_rules import ALLOWED_DUNDER_NAMES, ALLOWED_IMPORTS, DENIED_ATTRS, GUARD, KERNEL_BUILTINS, RULE, PolicyError
from .threats import T10

# torch: what host code may reach (dtypes are recognised by value)
TORCH_OK = frozenset("""
Tensor Size device dtype Generator empty empty_like empty_strided zeros zeros_like ones ones_like full full_like
arange tensor as_tensor randn rand randint randn_like rand_like randint_like manual_seed cat concat concatenate
stack flip roll narrow reshape permute transpose unsqueeze squeeze movedim swapaxes flatten chunk split unbind
index_select broadcast_to gather take take_along_dim masked_select select_scatter slice_scatter rot90 fliplr flipud
moveaxis swapdims is_tensor is_floating_point finfo iinfo no_grad enable_grad inference_mode
set_grad_enabled is_grad_enabled get_default_dtype promote_types cuda autograd nn
""".split())
TORCH_SUB_OK = {
    "torch.cuda": frozenset("is_available get_device_properties get_device_capability get_device_name "
                            "current_device device_count synchronize".split()),
    "torch.autograd": frozenset({"Function", "function"}),
    "torch.autograd.function": frozenset({"Function", "FunctionCtx", "once_differentiable"}),
    "torch.nn": frozenset({"functional"}),
    "torch.nn.functional": frozenset({"pad"}),
}
# tensor attributes that allocate, view, copy, cast or query (any dtype)
TENSOR_OK = frozenset("""
shape dtype device ndim dim size stride numel nelement element_size is_contiguous is_cuda is_cpu is_meta
is_floating_point is_complex storage_offset requires_grad requires_grad_ is_leaf layout T mT grad data
view view_as reshape reshape_as permute transpose t unsqueeze squeeze expand expand_as flatten unflatten narrow
select split chunk unbind movedim swapaxes contiguous clone copy_ to float half bfloat16 double int long short
bool byte char cpu cuda detach detach_ flip fliplr flipud roll index_copy_ index_copy index_select fill_ zero_
new_empty new_zeros new_ones new_full new_tensor new_empty_strided masked_fill_ masked_fill index_put_ index_put
repeat repeat_interleave tile as_strided diagonal unfold get_device type_as gather take take_along_dim
masked_select masked_scatter masked_scatter_ index_fill index_fill_ select_scatter slice_scatter diagonal_scatter
rot90 swapdims moveaxis transpose_ t_ squeeze_ unsqueeze_ as_strided_ narrow_copy
""".split())
# never, on any tensor: raw memory, hooks, host callbacks, autograd's own derivatives
TENSOR_NEVER = frozenset("""
data_ptr untyped_storage storage apply_ map_ map2_ backward register_hook register_post_accumulate_grad_hook
grad_fn share_memory_ pin_memory numpy record_stream retain_grad
""".split())
TRITON_OK = frozenset({"jit", "cdiv", "next_power_of_2", "autotune", "heuristics", "Config", "language",
                       "constexpr"})
NUMPY_NEVER = frozenset({"ctypeslib", "frombuffer", "from_dlpack", "lib", "memmap", "fromfile", "load", "save"})
# Triton runtime objects (kernels, autotuners): a launch, nothing of their Python function
KERNEL_OK = frozenset({"run", "warmup", "__name__"})

LAZY = frozenset({"sum", "min", "max", "sorted", "any", "all"})
_BIN_FN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
           "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
           "<<": operator.lshift, ">>": operator.rshift, "|": operator.or_, "^": operator.xor, "&": operator.and_}
_IOP_FN = {"+": operator.iadd, "-": operator.isub, "*": operator.imul, "/": operator.itruediv,
           "//": operator.ifloordiv, "%": operator.imod, "**": operator.ipow, "@": operator.imatmul,
           "<<": operator.ilshift, ">>": operator.irshift, "|": operator.ior, "^": operator.ixor,
           "&": operator.iand}
_UN_FN = {"-": operator.neg, "+": operator.pos, "~": operator.invert}
_CMP_FN = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge, "is": operator.is_, "is not": operator.is_not,
           "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}
# the aten/torch names an ``audit_allow`` entry opens (while that task's call runs)
ALLOW_NAMES = {"mm": {"@", "matmul", "mm", "bmm"}, "sum": {"sum"}}


_MISS = object()
_TENSOR_CHECKED = frozenset({"view", "index_put_", "index_put"})    # allowed, with their arguments checked


class Denied:
    """What a refused attribute gives back: using it in any way raises (and reports while graded)."""
    __slots__ = ("_what", "_guard")

    def __init__(self, what, guard):
        object.__setattr__(self, "_what", what)
        object.__setattr__(self, "_guard", guard)

    def _refuse(self, *a, **k):
        self._guard.refuse(f"{self._what} is not available in a Triton part: {RULE}")

    __call__ = __getitem__ = __iter__ = __enter__ = _refuse

    def __getattr__(self, name):
        self._refuse()

    def __repr__(self):
        return f"<not available in a Triton part: {self._what}>"


class _Checked:
    """A callable allowed only on integer data (a torch function outside the list, ``Tensor.view(dtype)``), or,
    for NumPy and ``math`` functions, never on a floating tensor (its data would leave torch). Its fields are
    private: host code cannot read the function back out."""
    __slots__ = ("_fn", "_what", "_guard", "_mode")

    def __init__(self, fn, what, guard, mode="int"):
        self._fn, self._what, self._guard, self._mode = fn, what, guard, mode

    def __call__(self, *args, **kwargs):
        g, mode = self._guard, self._mode
        if mode == "view":
            if any(isinstance(a, g.torch.dtype) for a in list(args) + list(kwargs.values())):
                g.refuse(f"{self._what}(dtype) (a bit reinterpretation) is not available in a Triton part: {RULE}")
        elif mode == "accumulate":
            if kwargs.get("accumulate") or (len(args) > 2 and args[2]):
                g.refuse(f"{self._what}(..., accumulate=True) adds: not available in a Triton part: {RULE}")
        elif g.floating_in(args) or g.floating_in(kwargs.values()):
            g.refuse(f"{self._what} on a floating-point tensor is not available in a Triton part: {RULE}")
        return self._fn(*args, **kwargs)

    def __getattr__(self, name):                 # a ufunc's methods (``np.add.at``), a function's attributes
        if name[0] == "_":
            raise AttributeError(name)
        return getattr(self._fn, name)


class Guard:
    """The runtime side of the transform (``__ag__`` in the submission's namespace)."""

    def __init__(self, allow_union=(), report=None):
        import torch
        self.torch = torch
        self.Tensor = torch.Tensor
        self.report = report                   # report(threat, what) while a graded call runs
        self.union = _allow_names(allow_union)
        self.extra = self.union                # what ``audit_allow`` opens now (the union at load time)
        self.task = None
        self._kernel_types = None
        self._mcache = {}                      # (module id, name) -> what ``a`` gives (modules are not written)
        self.plain = False                     # inside ``CellCompiler.plain``: launches are not checked either
        self.launched = {}                     # key -> a launch's kernel signature (``launch_signature``)
        self.kernel_reads = {}                 # (cell file, kernel name) -> global names its body reads
        self._kernels_ok = set()               # kernels whose globals were checked at a launch

    @property
    def kernel_types(self):
        """Triton's kernel objects (looked up once Triton is imported: importing it here, before a notebook
        sets ``TRITON_INTERPRET``, would make Triton's own ``@jit`` library functions compiled ones)."""
        if self._kernel_types is None:
            jit = sys.modules.get("triton.runtime.jit")
            if jit is None:
                return ()
            self._kernel_types = (jit.KernelInterface,)
        return self._kernel_types

    # -- a graded call -------------------------------------------------------------------------------
    def begin(self, task_name, allow=()):
        self.task = task_name
        extra = _allow_names(allow)
        if extra != self.extra:
            self._mcache.clear()
        self.extra = extra

    def end(self):
        self.task = None
        if self.extra != self.union:
            self._mcache.clear()
        self.extra = self.union

    def refuse(self, msg):
        if self.task is not None and self.report is not None:
            try:
                self.report(T10, f"host policy: {msg}")
            except Exception:  # noqa: BLE001 -- reporting must not hide the refusal
                pass
        raise PolicyError(msg)

    # -- helpers ---------------------------------------------------------------------------------------
    def floating(self, x) -> bool:
        return isinstance(x, self.Tensor) and (x.is_floating_point() or x.is_complex())

    def floating_in(self, xs) -> bool:
        for x in xs:
            if self.floating(x):
                return True
            if type(x) in (list, tuple) and any(self.floating(e) for e in x):
                return True
        return False

    # -- attribute access ------------------------------------------------------------------------------
    def a(self, obj, name):
        if name[0] == "_" and name not in ALLOWED_DUNDER_NAMES and not self._own(obj, name):
            return Denied(f"the private attribute .{name}", self)
        if isinstance(obj, self.Tensor):
            if name in TENSOR_OK and name not in _TENSOR_CHECKED:
                return getattr(obj, name)
            return self._tensor_attr(obj, name, self.floating(obj))
        if isinstance(obj, types.ModuleType):
            key = (id(obj), name)
            got = self._mcache.get(key, _MISS)
            if got is _MISS:
                got = self._mcache[key] = self._module_attr(obj, name)
            return got
        if isinstance(obj, type) and issubclass(obj, self.Tensor):
            return self._tensor_attr(obj, name, True)
        kt = self.kernel_types
        if kt and isinstance(obj, kt) and name not in KERNEL_OK:
            return Denied(f"{type(obj).__name__}.{name}", self)
        return getattr(obj, name)

    @staticmethod
    def _own(obj, name) -> bool:
        """A private name the submission itself defined (``self._free`` of its own class)."""
        if isinstance(obj, types.ModuleType):
            return False
        cls = obj if isinstance(obj, type) else type(obj)
        if cls.__module__ != "__main__":
            return False
        d = getattr(obj, "__dict__", None)
        if not isinstance(obj, type) and isinstance(d, dict) and name in d:
            return True
        return any(c.__module__ == "__main__" and name in c.__dict__ for c in cls.__mro__)

    def w(self, obj):
        """The checked target of an attribute write (``__ag__.w(obj)["x"] = v``)."""
        return _Writer(self, obj)

    def _module_attr(self, mod, name):
        mname = getattr(mod, "__name__", "")
        what = f"{mname}.{name}"
        if mname == "torch":
            v = getattr(mod, name, None)
            if name in TORCH_OK or isinstance(v, self.torch.dtype):
                return getattr(mod, name)
            if name in self.extra:
                return getattr(mod, name)
            if type(v).__name__ == "builtin_function_or_method":
                return _Checked(v, what, self)          # an aten function: on integer metadata only
            return Denied(what, self)
        if mname.startswith("torch."):
            ok = TORCH_SUB_OK.get(mname)
            if ok is not None and name in ok:
                return getattr(mod, name)
            return Denied(what, self)
        if mname == "triton":
            if name == "jit":
                return self._checked_jit(mod.jit)
            return getattr(mod, name) if name in TRITON_OK else Denied(what, self)
        if mname.startswith("triton."):
            if not mname.startswith("triton.language"):
                return Denied(what, self)
            v = getattr(mod, name)
            if isinstance(v, types.ModuleType) and not v.__name__.startswith("triton.language") or (
                    callable(v) and not (self.kernel_types and isinstance(v, self.kernel_types))
                    and getattr(v, "__module__", "").startswith(("triton.runtime", "triton.compiler", "triton._C"))):
                return Denied(what, self)                # tl.core.jit is triton.jit; tl.core.ir is the compiler's
            return v
        v = getattr(mod, name)
        if isinstance(v, types.ModuleType):              # a module through another (typing.sys, dataclasses.inspect)
            ok = v.__name__ in ALLOWED_IMPORTS or (v.__name__.startswith("numpy.") and mname.startswith("numpy"))
            return v if ok and name not in NUMPY_NEVER else Denied(what, self)
        if mname == "numpy" or mname.startswith("numpy."):
            if name in NUMPY_NEVER:
                return Denied(what, self)
            if callable(v) and not isinstance(v, type):
                return _Checked(v, what, self, "host")   # NumPy on a floating tensor: its data leaves torch
            return v
        if mname == "math" and callable(v):
            return _Checked(v, what, self, "host")
        return v

    def _tensor_attr(self, obj, name, floating):
        what = f"Tensor.{name}"
        if name in TENSOR_NEVER:
            return Denied(what, self)
        if name == "view":
            return _Checked(getattr(obj, name), what, self, "view")
        if name in ("index_put_", "index_put"):
            return _Checked(getattr(obj, name), what, self, "accumulate")
        if name in TENSOR_OK or name in self.extra:
            return getattr(obj, name)
        if not floating:
            return getattr(obj, name)                   # integer/bool metadata: any public method
        return Denied(what, self)

    def _checked_jit(self, jit):
        """``triton.jit`` reached from host code (not as a kernel's decorator, which Triton reads as written):
        refused, so every kernel is a ``@triton.jit def`` whose body the static kernel rules have seen."""
        return Denied("triton.jit called from host code (define kernels with @triton.jit def ...)", self)

    # -- operators ---------------------------------------------------------------------------------------
    def b(self, op, x, y):
        if (self.floating(x) or self.floating(y)) and op not in self.extra:
            self.refuse(f"the operator {op} on a floating-point tensor is not available in a Triton part: {RULE}")
        return _BIN_FN[op](x, y)

    def i(self, op, x, y):
        if (self.floating(x) or self.floating(y)) and op not in self.extra:
            self.refuse(f"the operator {op}= on a floating-point tensor is not available in a Triton part: {RULE}")
        return _IOP_FN[op](x, y)

    def u(self, op, x):
        if self.floating(x):
            self.refuse(f"the unary {op} on a floating-point tensor is not available in a Triton part: {RULE}")
        return _UN_FN[op](x)

    def c(self, ops, left, rest):
        T = self.Tensor
        x = left
        for op, y in zip(ops, rest):
            if (isinstance(x, T) or isinstance(y, T)) and op not in ("is", "is not") and \
                    (self.floating(x) or self.floating(y)):
                self.refuse(f"comparing floating-point tensors ({op}) is not available in a Triton part: {RULE}")
            r = _CMP_FN[op](x, y)
            if len(ops) == 1 or not r:                  # a chain truth-tests each link, as Python does
                return r
            x = y
        return r

    # -- builtins ----------------------------------------------------------------------------------------
    def n(self, name, value):
        if value is not getattr(builtins, name, None):
            return value                                # the student's own object under that name
        if name in ("getattr", "hasattr"):
            return self._getattr if name == "getattr" else self._hasattr
        return Denied(f"{name}()", self)

    def _getattr(self, obj, name, *default):
        if not isinstance(name, str) or name.startswith("_") or name in DENIED_ATTRS:
            self.refuse(f"getattr(..., {name!r}) is not available in a Triton part (no private or dunder names)")
        try:
            return self.a(obj, name)
        except AttributeError:
            if default:
                return default[0]
            raise

    def _hasattr(self, obj, name):
        try:
            self._getattr(obj, name)
            return True
        except AttributeError:
            return False

    def call(self, name, fn, *args, **kwargs):
        if fn is getattr(builtins, name, None):
            if name == "type" and len(args) != 1:
                self.refuse("type() with three arguments is not available in a Triton part")
            if name in LAZY and len(args) == 1 and not isinstance(args[0], (list, tuple, range, self.Tensor)):
                args = (list(args[0]),)                 # a generator: look at what it yields
            if name != "type" and (self.floating_in(args) or self.floating_in(kwargs.values())):
                self.refuse(f"{name}() on floating-point tensors is not available in a Triton part: {RULE}")
        return fn(*args, **kwargs)

    # -- imports -------------------------------------------------------------------------------------------
    def imp(self, what):
        """An import outside ``ALLOWED_IMPORTS`` (refused where it runs: at load time a load error, inside a
        graded call also a report)."""
        shown = sorted(m for m in ALLOWED_IMPORTS if "." not in m and m[0] != "_" and m != "autograder")
        self.refuse(f"{what if what.startswith('from ') else 'import ' + what} is not available in a Triton "
                    f"part (imports allowed: {', '.join(shown)})")

    def f(self, module, name, value):
        if name[0] == "_":
            return Denied(f"{module}.{name}", self)
        mod = sys.modules.get(module)
        if mod is None or type(mod) is not types.ModuleType:
            return value
        got = self._module_attr(mod, name)
        return value if got is getattr(mod, name, None) else got

    # -- launches ------------------------------------------------------------------------------------------
    def launch_args(self, args, kwargs, kernel=None):
        """A kernel receives tensors (exactly ``torch.Tensor``), numbers, ``None``, strings, dtypes and
        ``tl.constexpr``: no object that merely quacks like a pointer. The globals its body (and the kernels
        it calls) read are modules of Triton, kernels, constexpr values and numbers: no host function that the
        interpreter would run as Python."""
        import triton.language as tl
        ok = (int, float, bool, str, type(None), self.torch.dtype, tl.constexpr, tl.dtype)
        for i, a in enumerate(list(args) + [v for k, v in kwargs.items() if k != "grid"]):
            if type(a) is self.Tensor or isinstance(a, ok):
                continue
            self.refuse(f"a kernel argument of type {type(a).__name__}: a Triton kernel takes tensors "
                        "(exactly torch.Tensor) and numbers in a Triton part")
        if kernel is not None:
            self._kernel_globals(kernel, tl, ok)

    def record_launch(self, kernel, args, kwargs):
        """Keep the launch's kernel signature for the GPU-target compile of the kernel (``compile_frontend``,
        in a compile child; ``host_policy.gpu_compile_check`` in the parent)."""
        if len(self.launched) >= 32:
            return
        try:
            rec = launch_signature(kernel, args, kwargs)
        except Exception:  # noqa: BLE001 -- a launch Triton itself will reject: no record
            rec = None
        if rec is not None:
            self.launched.setdefault(rec["key"], rec)

    def take_launched(self) -> list:
        out, self.launched = list(self.launched.values()), {}
        return out

    def _kernel_globals(self, kernel, tl, ok):
        fn = getattr(kernel, "fn", None)
        code = getattr(fn, "__code__", None)
        if code is None or fn in self._kernels_ok:
            return
        self._kernels_ok.add(fn)
        reads = self.kernel_reads.get((code.co_filename, fn.__name__))
        if reads is None:
            return                                   # given code, compiled as written
        kt = self.kernel_types
        for name in sorted(reads):
            if name in fn.__globals__:
                v = fn.__globals__[name]
            elif name in KERNEL_BUILTINS or name in ("True", "False", "None"):
                continue
            else:
                continue                             # unbound: Triton reports it
            if isinstance(v, types.ModuleType):
                if v.__name__ == "math" or v.__name__.startswith("triton"):
                    continue
            elif kt and isinstance(v, kt):
                self._kernel_globals(v, tl, ok)
                continue
            elif isinstance(v, ok) or type(v).__name__ in ("JITFunction", "InterpretedFunction"):
                continue
            self._kernels_ok.discard(fn)
            self.refuse(f"the kernel {fn.__name__} reads the global {name} ({type(v).__name__}): a kernel may use "
                        "tl.*, other @triton.jit kernels and constexpr values, not host Python")


class _Writer:
    """``obj.x = v`` in host code: refused on modules, library classes and kernel objects (no patching of
    torch, Triton or NumPy); anything else (the student's objects, an autograd ``ctx``) is written."""
    __slots__ = ("g", "obj")

    def __init__(self, g, obj):
        self.g, self.obj = g, obj

    def _check(self, name):
        o = self.obj
        lib_class = isinstance(o, type) and o.__module__ != "__main__"
        if isinstance(o, types.ModuleType) or lib_class or (self.g.kernel_types and
                                                              isinstance(o, self.g.kernel_types)):
            self.g.refuse(f"writing {getattr(o, '__name__', type(o).__name__)}.{name} (patching a library) is "
                          "not available in a Triton part")
        if name[0] == "_" and isinstance(o, self.g.Tensor):
            self.g.refuse(f"writing the private tensor attribute .{name} is not available in a Triton part")

    def __setitem__(self, name, value):
        self._check(name)
        setattr(self.obj, name, value)

    def __delitem__(self, name):
        self._check(name)
        delattr(self.obj, name)


def _allow_names(allow) -> frozenset:
    out = set()
    for a in allow or ():
        out |= ALLOW_NAMES.get(a.split(":")[0], {a.split(":")[0]})
    return frozenset(out)


# ------------------------------------------------------------------------------------------------ hooks
class _Launch:
    """The launch check, wrapped once per process around every kernel launch; active while a guard is."""
    guard = None
    installed = False


def install_launch_check():
    if _Launch.installed:
        return
    _Launch.installed = True
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
    for klass in classes:
        orig = klass.run

        def run(self, *args, __orig=orig, **kwargs):
            g = _Launch.guard
            if g is not None and g.task is not None and not g.plain:
                g.launch_args(args, kwargs, self)
                g.record_launch(self, args, kwargs)
            return __orig(self, *args, **kwargs)
        klass.run = run


def install(ns: dict, allow_union=(), report=None) -> Guard:
    """Put a guard into the namespace ``ns`` (before any transformed cell runs there)."""
    g = Guard(allow_union, report)
    ns[GUARD] = g
    _Launch.guard = g
    return g


def student_function_class(fn):
    """The student's ``torch.autograd.Function`` subclass behind a graph node (its ``forward`` written in the
    submission: a ``<cell N>``, the notebook or a ``.py`` of the student's, not a library file), or None."""
    cls = getattr(fn, "_forward_cls", None)
    fwd = getattr(cls, "forward", None)
    code = getattr(fwd, "__code__", None)
    if code is None:
        return None
    name = code.co_filename
    if name.startswith("<cell "):
        return cls
    import sysconfig
    libs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    libs |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    libs.add(os.path.dirname(os.path.dirname(sys.modules["torch"].__file__)))
    return None if name.startswith("<") or any(name.startswith(d) for d in libs) else cls


PASS_NODES = ("View", "Reshape", "Alias", "ToCopy", "Clone", "Transpose", "Permute", "AsStrided", "Slice",
              "Select", "Unsqueeze", "Squeeze", "Expand", "Contiguous", "Unsafe")


def autograd_source(out) -> str | None:
    """None when ``out``'s gradient comes from the student's own ``autograd.Function`` (reached from
    ``out.grad_fn`` through views and casts only), else why not (docs/design.md §6: gradients must come
    from the student's code, never from torch's derivatives of a torch forward)."""
    fn = getattr(out, "grad_fn", None)
    if fn is None:
        return None                      # no graph: the harness's backward fails on its own
    seen = 0
    while fn is not None and seen < 16:
        if student_function_class(fn) is not None:
            return None
        name = type(fn).__name__
        if not name.startswith(PASS_NODES):
            return (f"the output's gradient would come from torch's autograd ({name}), not from your "
                    "torch.autograd.Function: the backward must be your kernels")
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if len(nxt) != 1:
            return f"the output's gradient would come from torch's autograd ({name}), not from your Function"
        fn, seen = nxt[0], seen + 1
    return "the output's gradient does not come from your torch.autograd.Function"


def wrap_call(guard, fn, task_name, allow=(), mode="call"):
    """``fn`` for one graded call: the guard knows the task (its allowances, reporting); an autograd call's
    output must come from the student's Function. The caller ends the task after the backward."""
    install_launch_check()
    _Launch.guard = guard

    def call(*args, **kwargs):
        guard.begin(task_name, allow)
        out = fn(*args, **kwargs)
        if mode == "autograd" and isinstance(out, guard.Tensor):
            why = autograd_source(out)
            if why:
                guard.refuse(why)
        return out
    call.__name__ = getattr(fn, "__name__", "fn")
    return call


# ------------------------------------------------------------------------------------------------ GPU target
def _kernel_sources(fn, seen=None) -> list:
    """The source of a kernel and of every ``@triton.jit`` function of the cells it reaches through the global
    names its code reads (as Triton finds a kernel's dependencies: by the names it uses)."""
    seen = set() if seen is None else seen
    if fn in seen:
        return []
    seen.add(fn)
    out = [_source(fn), _constants_read(fn)]
    g = fn.__globals__
    for n in _names(fn):
        v = g.get(n)
        inner = getattr(v, "fn", None)
        if type(v).__name__ in ("JITFunction", "InterpretedFunction") and inner is not None and inner is not fn:
            if getattr(inner, "__code__", None) is not None and inner.__code__.co_filename.startswith("<cell "):
                out += _kernel_sources(inner, seen)
    return out


def _names(fn) -> list:
    """The names ``fn``'s code reads (globals, attributes), sorted, once per code object."""
    code = fn.__code__
    hit = _NAMES.get(code)
    if hit is None:
        hit = _NAMES[code] = sorted(set(code.co_names))
    return hit


_NAMES: dict = {}                           # code object -> its sorted names: ``_names``
_SIGNATURES = weakref.WeakKeyDictionary()   # function -> (its code object, ``inspect.signature``): ``launch_signature``


_SOURCES = weakref.WeakKeyDictionary()      # function -> (its code object, its source): ``_source``


def _source(fn) -> str:
    """``inspect.getsource(fn)`` (its code's bytes where there is no source), once per function and code object:
    every launch keys its verdict on it, and tokenising the cell again per launch was a quarter of an
    interpreted grading's launch time."""
    import inspect
    hit = _SOURCES.get(fn)
    if hit is not None and hit[0] is fn.__code__:
        return hit[1]
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        src = fn.__code__.co_code.hex()
    _SOURCES[fn] = (fn.__code__, src)
    return src


def _constants_read(fn) -> str:
    """The plain values (numbers, strings, ``tl.constexpr``, dtypes) of the globals a kernel's body reads: the
    compiler folds them into the kernel, so two launches that differ only there must not share a verdict."""
    import triton.language as tl
    out, g = [], fn.__globals__
    for n in _names(fn):
        if n not in g:
            continue
        v = g[n]
        v = v.value if type(v) is tl.constexpr else v
        v = v.name if type(v) is tl.dtype else v
        if v is None or type(v) in (bool, int, float, str):      # exact types: their repr is the builtin one
            out.append(f"{n}={v!r}")
    return ";".join(out)


def launch_signature(kernel, args, kwargs) -> dict | None:
    """``{"kernel", "key", "signature", "constexprs"}`` of one launch, as Triton's compiler takes them
    (``"*fp32"``, ``"i32"``, ``"constexpr"``...), JSON-able; ``key`` hashes it with the kernel's source and the
    sources of the kernels it calls (a verdict is cached per key). None when it cannot be read."""
    import hashlib
    import inspect
    import json

    import triton.language as tl
    from triton.runtime.jit import mangle_type
    fn = getattr(kernel, "fn", None)
    code = getattr(fn, "__code__", None)
    if code is None or not code.co_filename.startswith("<cell "):
        return None                                  # given code (compiled as written) or not a kernel
    hit = _SIGNATURES.get(fn)
    if hit is None or hit[0] is not code:
        hit = _SIGNATURES[fn] = (code, inspect.signature(fn))
    sig = hit[1]
    bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    bound.apply_defaults()
    types_, consts = {}, {}
    for name, p in sig.parameters.items():
        if name not in bound.arguments:
            return None
        v = bound.arguments[name]
        ann = p.annotation
        if ann is tl.constexpr or (isinstance(ann, str) and "constexpr" in ann) or v is None or \
                isinstance(v, tl.constexpr):
            v = getattr(v, "value", v)
            if isinstance(v, tl.dtype):
                v = ["dtype", v.name]
            elif not (v is None or isinstance(v, (bool, int, float, str))):
                return None
            types_[name], consts[name] = "constexpr", v
        else:
            types_[name] = mangle_type(v)
    body = json.dumps([fn.__name__, types_, consts], sort_keys=True) + "".join(_kernel_sources(fn))
    return {"kernel": fn.__name__, "key": hashlib.sha256(body.encode()).hexdigest()[:24], "signature": types_,
            "constexprs": consts}


def compile_frontend(ns: dict, name: str, signature: dict, constexprs: dict) -> bool:
    """Compile ``ns[name]`` through Triton's frontend for sm_90a (``ASTSource.make_ir``: the kernel's Python
    read as Triton, no PTX), in a compile child (``TRITON_INTERPRET=0``, no GPU). Raises what Triton raises:
    a kernel body that only the interpreter would run (Python objects, host functions) does not compile."""
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    kernel = ns.get(name)
    names = list(getattr(kernel, "arg_names", None) or [])
    if not names or type(kernel).__name__ != "JITFunction":
        raise TypeError(f"{name} is not a @triton.jit kernel")
    consts = {}
    for k, v in constexprs.items():
        if isinstance(v, list) and len(v) == 2 and v[0] == "dtype":
            v = getattr(tl, {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64",
                             "i32": "int32", "i64": "int64", "i1": "int1", "i8": "int8", "i16": "int16",
                             "u8": "uint8", "fp8e4nv": "float8e4nv", "fp8e5": "float8e5"}.get(v[1], v[1]))
        consts[(names.index(k),)] = v
    src = ASTSource(kernel, {n: signature[n] for n in names}, consts)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
    return True
