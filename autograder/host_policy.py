"""Deny by default in the host code of Triton parts (docs/design.md §6, T10; notes/host_policy.md).

The Python around a Triton kernel may allocate, view, copy and cast tensors, query shapes, strides, dtypes and
devices, do integer arithmetic for launch sizes, launch kernels, and use ``math`` and the given helpers; the
math of the answer belongs in the kernel. This module enforces that at the language level: every code cell of
a Triton assignment (except the given cells and given functions, which are the course's own code) is
compiled through an AST transform, so the student's host code reaches torch, Triton and the builtins only
through guards:

* **static** (refused when the cell is compiled, a load error naming the rule): dunder attribute names and
  names (``__name__``, ``__init__`` and two more excepted), frame/traceback attributes, ``data_ptr``,
  ``ctypes`` and storages, dunder strings, ``super(...)`` with arguments, dunder methods other than
  ``SAFE_DUNDER_DEFS``; inside ``@triton.jit`` bodies (left to Triton, never transformed) calls of anything
  but ``tl.*``, other kernels and the builtins Triton compiles, and attributes outside the ``tl.tensor`` API;
* **imports** outside ``ALLOWED_IMPORTS`` are refused where they run;
* **attribute access** (``__ag__.a``): on a torch/Triton/NumPy module, a tensor or ``torch.Tensor``, a
  Triton kernel object, through an allow-list; anything else (``torch.exp``, ``x.sum``, ``torch.ops``,
  ``kernel.fn``) comes back as a ``Denied`` object that raises when it is used. Compute is allowed on
  integer and boolean tensors (sequence lengths, block tables: metadata), never on floating ones;
* **operators** (``__ag__.b/u/c/i``): arithmetic, comparison and ``in`` with a floating tensor operand are
  refused (integers, Python floats and integer tensors pass);
* **reflective builtins** (``getattr``, ``vars``, ``globals``, ``eval``...) are guarded or refused whatever
  name they are reached under; numeric builtins (``float(t)``, ``sum``, ``max``) refuse floating tensors;
* **launches** take exactly ``torch.Tensor``, numbers, ``None``, dtypes and ``tl.constexpr`` (no duck-typed
  pointer objects); ``triton.jit`` applies only to functions defined as kernels (``@triton.jit def``);
* **autograd** (a3b): a graded output that requires grad must come out of the student's own
  ``torch.autograd.Function`` (through views and casts only), so the harness's ``backward()`` runs the
  student's backward, never torch's derivative of a torch forward.

A task's ``audit_allow`` (a3b's GQA ``sum``, a3 FP8's ``mm``) extends the lists while that task's call runs.
While a graded call runs (``Guard.begin``) a refusal is also reported (T10); at load time it only raises, so a
scratch cell that compares with torch fails to load and accuses nobody. The op audit (``autograder.audit``)
stays as the second layer: it judges what the call did on input data, whatever the first layer let through.
"""
from __future__ import annotations

import ast
import builtins
import operator
import os
import sys
import types

POLICY_ASSIGNMENTS = frozenset({"a3_triton", "a3b_triton_backward", "a4_decoding", "a5_paged"})
ALLOWED_IMPORTS = frozenset({
    "math", "numpy", "torch", "torch.nn", "torch.nn.functional", "triton", "triton.language", "typing",
    "dataclasses", "functools", "itertools", "collections", "heapq", "numbers", "time", "random", "warnings",
    "__future__", "autograder", "autograder.check", "enum", "abc", "string", "textwrap", "pprint"})
SAFE_DUNDER_DEFS = frozenset({"__init__", "__repr__", "__str__", "__call__", "__len__", "__post_init__",
                              "__enter__", "__exit__", "__iter__", "__next__", "__eq__", "__hash__"})
ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__qualname__", "__doc__", "__init__"})  # super().__init__(...)
DENIED_ATTRS = frozenset({"data_ptr", "ctypes", "f_back", "f_globals", "f_locals", "f_builtins", "f_code",
                          "tb_frame", "tb_next", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame",
                          "ag_code", "func_globals", "untyped_storage", "storage"})

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

# builtins whose every load is guarded (reflection), and the numeric ones guarded where called
REFLECTIVE = frozenset({"getattr", "setattr", "delattr", "hasattr", "vars", "globals", "locals", "eval", "exec",
                        "compile", "breakpoint", "memoryview", "open", "input"})
NUMERIC = frozenset({"int", "float", "bool", "complex", "abs", "round", "pow", "divmod", "sum", "min", "max",
                     "sorted", "any", "all", "type", "bytes", "bytearray"})
LAZY = frozenset({"sum", "min", "max", "sorted", "any", "all"})
KERNEL_BUILTINS = frozenset({"range", "min", "max", "len", "int", "float", "print", "isinstance", "tuple",
                             "bool", "abs", "enumerate", "zip", "list",
                             # a stub's ``raise NotImplementedError(...)``, an unfinished kernel's own checks
                             "NotImplementedError", "ValueError", "TypeError", "RuntimeError", "AssertionError"})

# what a kernel body may read off its values (``tl.tensor``, dtypes, ``tl.constexpr``): the public API of those
# classes in Triton 3.6 plus their instance attributes; the interpreter's ``x.handle.data`` (the NumPy array
# behind a block) is not among them
KERNEL_ATTRS = frozenset("""
FP_TYPES KIND OTHER_TYPES SIGNEDNESS SINT_TYPES STANDARD_FP_TYPES T UINT_TYPES abs advance argmax argmin
associative_scan atomic_add atomic_and atomic_cas atomic_max atomic_min atomic_or atomic_xchg atomic_xor
broadcast_to cast cdiv ceil cos cumprod cumsum erf exp exp2 expand_dims flip floor gather get_block_shapes
get_int_max_value get_int_min_value histogram is_bf16 is_block is_bool is_const is_dtype is_floating is_fp16
is_fp32 is_fp64 is_fp8 is_fp8e4b15 is_fp8e4b8 is_fp8e4nv is_fp8e5 is_fp8e5b16 is_int is_int1 is_int16 is_int32
is_int64 is_int8 is_int_signed is_int_unsigned is_ptr is_standard_floating is_uint16 is_uint32 is_uint64
is_uint8 is_void item kind log log2 logical_and logical_or max min nbytes permute ravel reduce reduce_or reshape
rsqrt scalar sigmoid sin softmax sort split sqrt sqrt_rn store sum to trans view with_element_ty xor_sum
dtype shape type element_ty value numel primitive_bitwidth name fp_mantissa_width int_bitwidth address_space
""".split())

_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
        ast.Pow: "**", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitXor: "^",
        ast.BitAnd: "&"}
_BIN_FN = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
           "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
           "<<": operator.lshift, ">>": operator.rshift, "|": operator.or_, "^": operator.xor, "&": operator.and_}
_IOP_FN = {"+": operator.iadd, "-": operator.isub, "*": operator.imul, "/": operator.itruediv,
           "//": operator.ifloordiv, "%": operator.imod, "**": operator.ipow, "@": operator.imatmul,
           "<<": operator.ilshift, ">>": operator.irshift, "|": operator.ior, "^": operator.ixor,
           "&": operator.iand}
_UN = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}
_UN_FN = {"-": operator.neg, "+": operator.pos, "~": operator.invert}
_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Is: "is",
        ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}
_CMP_FN = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
           ">=": operator.ge, "is": operator.is_, "is not": operator.is_not,
           "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}
# the aten/torch names an ``audit_allow`` entry opens (while that task's call runs)
ALLOW_NAMES = {"mm": {"@", "matmul", "mm", "bmm"}, "sum": {"sum"}}

RULE = "torch may allocate, view, copy and cast here; the math goes in your kernel"
GUARD = "__ag__"


class PolicyError(RuntimeError):
    """A capability outside the host allow-list of a Triton part (raised, and reported while graded)."""


def applies(assignment_id: str) -> bool:
    return assignment_id in POLICY_ASSIGNMENTS


# ------------------------------------------------------------------------------------------------ transform
def _is_kernel(node) -> bool:
    for d in getattr(node, "decorator_list", ()):
        txt = ast.unparse(d)
        if txt.split("(")[0].endswith(("jit", "autotune", "heuristics")):
            return True
    return False


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and len(name) > 4


class _Static(ast.NodeVisitor):
    """Static refusals over one cell (kernel bodies get the kernel rules)."""

    def __init__(self, kernels):
        self.kernels = kernels        # names of @triton.jit functions seen so far (given cells included)
        self.errors = []
        self.kernel_reads = {}        # kernel name -> the global names its body reads

    def err(self, node, msg):
        self.errors.append(f"line {getattr(node, 'lineno', 0)}: {msg}")

    def visit_Attribute(self, node):
        a = node.attr
        if _dunder(a) and a not in ALLOWED_DUNDER_NAMES:
            self.err(node, f"the attribute .{a} is not available in a Triton part (no dunder names)")
        elif a in DENIED_ATTRS:
            self.err(node, f"the attribute .{a} is not available in a Triton part (no raw memory or frames)")
        self.generic_visit(node)

    def visit_Name(self, node):
        if _dunder(node.id) and node.id not in ALLOWED_DUNDER_NAMES:
            self.err(node, f"the name {node.id} is not available in a Triton part")
        self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, str) and _dunder(node.value.strip()) and node.value != "__main__":
            self.err(node, f"the string {node.value!r} names a dunder: not available in a Triton part")

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id == "super" and (node.args or node.keywords):
            self.err(node, "super(...) with arguments is not available in a Triton part (use super())")
        self.generic_visit(node)

    def _def(self, node):
        if (_dunder(node.name) and node.name not in SAFE_DUNDER_DEFS) or node.name in DENIED_ATTRS:
            self.err(node, f"defining {node.name} is not available in a Triton part")
        if _is_kernel(node):
            self.kernels.add(node.name)
            _Kernel(self, node).check()
            for d in node.decorator_list:
                self.visit(d)
            return
        self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _def

    def visit_ClassDef(self, node):
        if _dunder(node.name):
            self.err(node, f"class {node.name} is not available in a Triton part")
        self.generic_visit(node)


class _Kernel:
    """A ``@triton.jit`` body: left to Triton, but it may call only ``tl``/``triton`` functions, other kernels,
    its own local values' methods and the builtins Triton compiles (a GPU compile refuses anything else; the
    interpreter would run it as Python)."""

    def __init__(self, static, node):
        self.s, self.node = static, node
        self.local = {a.arg for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs}
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                self.local.add(n.id)

    def _root(self, f):
        while isinstance(f, ast.Attribute):
            f = f.value
        return f

    def check(self):
        reads = set()
        for n in ast.walk(self.node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in self.local:
                reads.add(n.id)
                if n.id in REFLECTIVE or n.id in ("type", "super"):
                    self.s.err(n, f"{n.id} inside the kernel {self.node.name}")
        self.s.kernel_reads[self.node.name] = reads
        for n in ast.walk(self.node):
            if n is self.node:
                continue
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Global,
                              ast.Nonlocal, ast.Import, ast.ImportFrom, ast.Try, ast.With)):
                self.s.err(n, f"{type(n).__name__} inside the @triton.jit kernel {self.node.name}")
            elif isinstance(n, ast.Attribute) and (n.attr.startswith("_") or (
                    n.attr not in KERNEL_ATTRS and not (isinstance(self._root(n), ast.Name)
                                                        and self._root(n).id in ("tl", "triton", "libdevice")))):
                self.s.err(n, f"the attribute .{n.attr} inside the kernel {self.node.name} (a kernel reads "
                              "tl.* and its blocks' tl.tensor API)")
            elif isinstance(n, ast.Name) and _dunder(n.id):
                self.s.err(n, f"the name {n.id} inside the kernel {self.node.name}")
            elif isinstance(n, ast.Call):
                f = n.func
                root = self._root(f)
                if isinstance(f, ast.Name):
                    ok = f.id in self.s.kernels or f.id in KERNEL_BUILTINS or f.id in self.local
                elif isinstance(root, ast.Name):
                    ok = root.id in ("tl", "triton", "libdevice") or root.id in self.local
                else:
                    ok = True            # a method of a computed value (``x.to(...)``, ``(a + b).to(...)``)
                if not ok:
                    self.s.err(n, f"{ast.unparse(f)}(...) inside the @triton.jit kernel {self.node.name}: a "
                                  "kernel may call tl.* and other @triton.jit functions")


class _Rewrite(ast.NodeTransformer):
    """Host code through the guards (``__ag__``); kernel bodies and given functions untouched."""

    def __init__(self, skip_lines=()):
        self.skip = skip_lines            # (first, last) line ranges of given functions

    def _g(self, attr, node, *args):
        call = ast.Call(ast.Attribute(ast.Name(GUARD, ast.Load()), attr, ast.Load()), list(args), [])
        return ast.copy_location(call, node)

    def _skipped(self, node):
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return any(lo <= first <= hi for lo, hi in self.skip)

    def visit_FunctionDef(self, node):
        if _is_kernel(node) or self._skipped(node):
            return node
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.ctx, ast.Load):
            return self._g("a", node, node.value, ast.Constant(node.attr))
        # ``obj.x = v`` / ``del obj.x`` -> ``__ag__.w(obj)["x"] = v``: the write is checked (no module, library
        # class or kernel object is patched), in any target position (tuples, for, with)
        return ast.copy_location(ast.Subscript(self._g("w", node, node.value), ast.Constant(node.attr), node.ctx),
                                 node)

    def visit_BinOp(self, node):
        self.generic_visit(node)
        return self._g("b", node, ast.Constant(_BIN[type(node.op)]), node.left, node.right)

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if type(node.op) in _UN:
            return self._g("u", node, ast.Constant(_UN[type(node.op)]), node.operand)
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        ops = ast.Tuple([ast.Constant(_CMP[type(o)]) for o in node.ops], ast.Load())
        rest = ast.Tuple(list(node.comparators), ast.Load())
        return self._g("c", node, ops, node.left, rest)

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        t = node.target
        if isinstance(t, ast.Name):
            load = ast.Name(t.id, ast.Load())
        elif isinstance(t, ast.Attribute):
            load = self._g("a", t, t.value, ast.Constant(t.attr))
        else:
            load = ast.Subscript(t.value, t.slice, ast.Load())
        value = self._g("i", node, ast.Constant(_BIN[type(node.op)]), ast.copy_location(load, t), node.value)
        return ast.copy_location(ast.Assign([t], value), node)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in REFLECTIVE:
            return self._g("n", node, ast.Constant(node.id), node)
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Name) and f.id in NUMERIC:
            new = ast.Call(ast.Attribute(ast.Name(GUARD, ast.Load()), "call", ast.Load()),
                           [ast.Constant(f.id), f] + list(node.args), node.keywords)
            return ast.copy_location(new, node)
        return node

    def visit_Import(self, node):
        bad = [a.name for a in node.names if a.name not in ALLOWED_IMPORTS]
        if not bad:
            return node
        return ast.copy_location(ast.Expr(self._g("imp", node, ast.Constant(bad[0]))), node)

    def visit_ImportFrom(self, node):
        if node.module == "__future__":
            return node
        mod = node.module or ""
        if node.level or mod not in ALLOWED_IMPORTS or any(a.name == "*" for a in node.names):
            what = f"from {'.' * node.level}{mod} import {', '.join(a.name for a in node.names)}"
            return ast.copy_location(ast.Expr(self._g("imp", node, ast.Constant(what))), node)
        out = [node]
        for a in node.names:
            name = a.asname or a.name
            value = self._g("f", node, ast.Constant(node.module or ""), ast.Constant(a.name),
                            ast.Name(name, ast.Load()))
            out.append(ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], value), node))
        return out


def given_cell_dumps() -> frozenset:
    """``ast.dump`` of every given file (a cell identical to one is the course's code: not transformed)."""
    try:
        from .given import GIVEN_DIRS
    except ImportError:
        return frozenset()
    out = set()
    for d in GIVEN_DIRS:
        for p in sorted(d.glob("*.py")) if d.is_dir() else ():
            try:
                out.add(ast.dump(ast.parse(p.read_text())))
            except SyntaxError:
                continue
    return frozenset(out)


def is_given_cell(source: str, dumps) -> bool:
    try:
        return ast.dump(ast.parse(source)) in dumps
    except SyntaxError:
        return False


def compile_cell(source: str, filename: str, kernels: set, skip_lines=(), exempt=False, first_line=1,
                 kernel_reads=None):
    """The code object of one cell under the policy (``exempt``: a given cell, compiled as written; its
    kernels are still registered). Raises ``PolicyError`` (the static refusals) or ``SyntaxError``.
    ``first_line``: where ``source`` starts in its file (a notebook function recompiled by ``for_check``)."""
    tree = ast.parse(source, filename)
    if first_line != 1:
        ast.increment_lineno(tree, first_line - 1)
    st = _Static(kernels)
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_kernel(n):
            kernels.add(n.name)
    if exempt:
        return compile(tree, filename, "exec")
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(lo <= n.lineno <= hi
                                                                         for lo, hi in skip_lines):
            if _is_kernel(n):
                kernels.add(n.name)
            continue
        st.visit(n)
    if kernel_reads is not None:
        kernel_reads.update({(filename, k): v for k, v in st.kernel_reads.items()})
    if st.errors:
        raise PolicyError("; ".join(st.errors[:3]) + (f" (and {len(st.errors) - 3} more)" if len(st.errors) > 3
                                                      else ""))
    tree = ast.fix_missing_locations(_Rewrite(skip_lines).visit(tree))
    return compile(tree, filename, "exec")


# ------------------------------------------------------------------------------------------------ runtime
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
                self.report("T10", f"host policy: {msg}")
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


# ------------------------------------------------------------------------------------------------ loading
# each Triton task's ``audit_allow`` (specs), for ``check()`` in the student release where the specs are not
# shipped; tests/test_host_policy.py keeps it equal to the specs
TASK_ALLOW = {
    "a3.flash_attention_forward_fp8": ("mm:1",),
    "a3b.flash_bwd_dkdv": ("sum",), "a3b.flash_attention_backward": ("sum",), "a3b.flash_attention": ("sum",),
}


def config(spec, cells) -> dict | None:
    """What the grading child needs to load a submission under the policy (None: not a policy assignment):
    the Triton tasks and their allowances, the cells identical to a given file, the given functions."""
    if not applies(spec.id):
        return None
    from .given import given_functions
    dumps = given_cell_dumps()
    return {"tasks": {t.name: list(t.audit_allow) for t in spec.tasks.values() if t.framework == "torch"},
            "exempt": [c.index for c in cells if is_given_cell(c.source, dumps)],
            "given": {str(k): [[lo, hi] for lo, hi, _ in v] for k, v in given_functions(cells).items()}}


class CellCompiler:
    """Compiles a submission's cells into ``ns`` under the policy and wraps its graded Triton calls."""

    def __init__(self, ns, cfg, report=None):
        self.tasks = {k: tuple(v) for k, v in cfg["tasks"].items()}
        union = sorted({a for v in self.tasks.values() for a in v})
        self.guard = install(ns, union, report)
        self.exempt = set(cfg.get("exempt", ()))
        self.skip = {int(k): [tuple(r[:2]) for r in v] for k, v in cfg.get("given", {}).items()}
        self.kernels = set()
        self.ns = ns
        self.plain_codes = {}                  # (file, qualname, first line) -> the code as written

    def compile(self, index, source, filename):
        code = compile_cell(source, filename, self.kernels, self.skip.get(index, ()), index in self.exempt,
                            kernel_reads=self.guard.kernel_reads)
        if index not in self.exempt:
            _index_codes(compile(source, filename, "exec"), self.plain_codes)
        return code

    def plain(self):
        """A context in which the submission's functions run their code as written, without the guards: the
        timed reps of a speed test (the guards cost the wrapper hundreds of microseconds a call on a CPU,
        which the reference does not pay). Correctness calls and the audited warm-up rep run guarded."""
        return _Plain(self)

    def wrap(self, fn, name, mode="call"):
        if name not in self.tasks or fn is None:
            return fn
        return wrap_call(self.guard, fn, name, self.tasks[name], mode)

    def end(self):
        self.guard.end()


def _index_codes(code, out):
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out[(c.co_filename, c.co_qualname, c.co_firstlineno)] = c
            _index_codes(c, out)


class _Plain:
    """Swaps the ``__code__`` of the namespace's functions (and its classes' methods) for the code compiled as
    written, and back on exit."""

    def __init__(self, cc):
        self.cc, self.swapped = cc, []

    def _swap(self, fn):
        code = getattr(fn, "__code__", None)
        if code is None or not code.co_filename.startswith("<cell "):
            return
        plain = self.cc.plain_codes.get((code.co_filename, code.co_qualname, code.co_firstlineno))
        if plain is not None and plain is not code and plain.co_freevars == code.co_freevars:
            fn.__code__ = plain
            self.swapped.append((fn, code))

    def __enter__(self):
        self.cc.guard.plain = True
        for obj in list(self.cc.ns.values()):
            if isinstance(obj, types.FunctionType):
                self._swap(obj)
            elif isinstance(obj, type) and obj.__module__ == "__main__":
                for v in list(vars(obj).values()):
                    self._swap(getattr(v, "__func__", v))
        return self

    def __exit__(self, *exc):
        for fn, code in reversed(self.swapped):
            fn.__code__ = code
        self.swapped = []
        self.cc.guard.plain = False


def cells_config(assignment_id, cells) -> dict | None:
    """``config`` without the specs (``make check`` in the student release): the task table of ``visible``."""
    if not applies(assignment_id):
        return None
    from . import visible
    tasks = {}
    for tid, name in visible.tasks(assignment_id).items():
        if visible.framework(tid) == "torch":
            tasks[name] = list(TASK_ALLOW.get(tid, ()))
    from .given import given_functions
    dumps = given_cell_dumps()
    return {"tasks": tasks, "exempt": [c.index for c in cells if is_given_cell(c.source, dumps)],
            "given": {str(k): [[lo, hi] for lo, hi, _ in v] for k, v in given_functions(cells).items()}}


SHORT = {"a3": "a3_triton", "a3b": "a3b_triton_backward", "a4": "a4_decoding", "a5": "a5_paged"}


def for_check(task_id: str, fn, mode="call"):
    """``(fn, guard)`` for one visible case (``check.run_case``): the same policy as grading. A function loaded
    by ``adapter.load`` already runs under a guard; a notebook's own function (Jupyter compiled its cells) is
    recompiled from its source, with every function and class of its namespace, into a guarded copy of that
    namespace. ``(fn, None)`` when the policy does not apply."""
    short = task_id.split(".")[0]
    if not applies(SHORT.get(short, short)) or not callable(fn):
        return fn, None
    ns = getattr(fn, "__globals__", None)
    if not isinstance(ns, dict):
        return fn, None
    guard = ns.get(GUARD)
    if guard is None:
        name = getattr(fn, "__name__", None)
        ns = _shadow(ns)
        guard = ns[GUARD]
        fn = ns.get(name, fn)
    name = getattr(fn, "__name__", task_id.split(".", 1)[-1])
    return wrap_call(guard, fn, name, TASK_ALLOW.get(task_id, ()), mode), guard


def _shadow(ns: dict) -> dict:
    """A copy of a notebook namespace whose functions and classes are recompiled under the policy (the given
    ones, recognised by fingerprint, stay as they are)."""
    import inspect
    import textwrap
    from .given import _fingerprint, given_fingerprints
    known = given_fingerprints()
    new = dict(ns)
    install(new, sorted({a for v in TASK_ALLOW.values() for a in v}))
    kernels = {k for k, v in ns.items() if type(v).__name__ in ("JITFunction", "InterpretedFunction",
                                                                 "Autotuner", "Heuristics")}
    main = ns.get("__name__", "__main__")
    for k, obj in list(ns.items()):
        if k.startswith("__") or (not isinstance(obj, (types.FunctionType, type)) and k not in kernels):
            continue
        target = getattr(obj, "fn", obj) if k in kernels else obj
        if getattr(target, "__module__", None) != main:
            continue
        try:
            src = textwrap.dedent(inspect.getsource(target))
            first = inspect.getsourcelines(target)[1]
            filename = inspect.getsourcefile(target) or "<notebook>"
        except (OSError, TypeError):
            continue
        tree = ast.parse(src)
        if tree.body and isinstance(tree.body[0], ast.FunctionDef) and _fingerprint(tree.body[0]) in known:
            continue
        code = compile_cell(src, filename, kernels, first_line=first, kernel_reads=new[GUARD].kernel_reads)
        exec(code, new)  # noqa: S102 -- the student's own notebook, recompiled under the policy
    return new
