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
import contextlib
import json
import os
import types

from .host_rules import (ALLOWED_DUNDER_NAMES, ALLOWED_IMPORTS, DENIED_ATTRS, GUARD, KERNEL_ATTRS,  # noqa: F401
                         KERNEL_BUILTINS, NUMERIC, POLICY_ASSIGNMENTS, REFLECTIVE, RULE, SAFE_DUNDER_DEFS,
                         PolicyError)

_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
        ast.Pow: "**", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitXor: "^",
        ast.BitAnd: "&"}
_UN = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}
_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Is: "is",
        ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}

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
        from .host_guard import install
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
        from .host_guard import wrap_call
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
    from .host_guard import wrap_call
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
    from .host_guard import install
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
        if "<locals>" in getattr(target, "__qualname__", ""):
            continue    # a closure some call stored in the namespace (Triton's interpreter does): not a cell's
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


# ------------------------------------------------------------------------------------------------ GPU target
# key (kernel, signature, its sources and those of the kernels it calls, the constants it reads) -> None (compiles)
# or the error: one verdict per process, so a grade-all compiles each distinct kernel once
_COMPILED: dict = {}
#: a folder the grader processes of one run of the bundled submissions share their verdicts through (the selftest
#: and the test suite set it; a grading of students' work never does: their kernels' keys come from their children)
CACHE_ENV = "AUTOGRADER_COMPILE_CACHE"


def shared_read(name: str):
    """``(True, value)`` of the JSON file ``name`` in the run's shared folder (``CACHE_ENV``), ``(False, None)``
    when there is none. Parent side only (the folder's name never reaches a child's environment)."""
    folder = os.environ.get(CACHE_ENV)
    if not folder or not name.replace("-", "").isalnum():
        return False, None
    try:
        with open(os.path.join(folder, name + ".json")) as f:
            return True, json.load(f)["value"]
    except (OSError, ValueError, KeyError):
        return False, None


def shared_write(name: str, value) -> None:
    """Store a JSON-able ``value`` as ``name`` in the run's shared folder, if there is one."""
    folder = os.environ.get(CACHE_ENV)
    if not folder or not name.replace("-", "").isalnum():
        return
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{name}.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump({"value": value}, f)
        os.replace(tmp, os.path.join(folder, name + ".json"))        # atomic: a reader sees all of it or none


def note_kernels(grader, task, h) -> None:
    """Keep the kernel signatures a graded call of ``task`` launched (``host_guard.launch_signature``)."""
    kernels = h.get("kernels") if isinstance(h, dict) else None
    if not kernels:
        return
    seen = grader.__dict__.setdefault("_policy_kernels", {})
    for k in kernels[:32]:
        if isinstance(k, dict) and isinstance(k.get("key"), str):
            seen.setdefault(k["key"], (k, set()))[1].add(task.id)


def gpu_compile_check(grader) -> None:
    """On a CPU (where kernels ran in Triton's interpreter), put every kernel a Triton part launched through
    Triton's sm_90a frontend in a compile child (``host_guard.compile_frontend``). A kernel that does not
    compile zeroes the tasks that launched it, with the compiler's message: Python inside a ``@triton.jit``
    body runs only through the interpreter. On a GPU every kernel was compiled for real already."""
    kernels = grader.__dict__.get("_policy_kernels")
    if not kernels or grader.device != "cpu" or not applies(grader.spec.id):
        return
    for key, (k, tasks) in sorted(kernels.items()):
        if key not in _COMPILED:
            hit, why = shared_read(key)
            if hit:
                _COMPILED[key] = why
        if key not in _COMPILED:
            try:
                sb = grader.compile_child()
                sb.send({"t": "tcompile", "name": k["kernel"], "signature": k["signature"],
                         "constexprs": k["constexprs"]})
                h, _ = sb.recv(120, expect=("result", "error"), on_trap=grader._on_trap)
            except Exception as exc:  # noqa: BLE001 -- the check never fails a grading by itself
                grader.log(f"GPU-target compile of {k['kernel']} not made: {exc}")
                return
            lines = [ln.strip() for ln in str(h.get("msg", "")).splitlines() if ln.strip() and ln.strip() != "^"]
            _COMPILED[key] = None if h.get("t") == "result" else \
                f"{h.get('exc')}: {(lines[-1] if lines else '')[:300]}"
            shared_write(key, _COMPILED[key])
        why = _COMPILED[key]
        if why is not None:
            for t in sorted(tasks):
                grader.zeroed.setdefault(t, f"the kernel {k['kernel']} does not compile for a GPU (sm_90a): {why}")
