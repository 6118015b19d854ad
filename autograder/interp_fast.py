"""Triton's interpreter without its repeated language patching, its unread overflow checks, its rebuilt type
objects and its rebuilt dtype table: the same results for less CPU (about a third less from the first; the second
took an a3 + a5 selftest from 48.2 to 40.3 CPU-s; the third, a third less on an a3 solution's kernels; the fourth,
0.45-0.62 -> 0.40 CPU-s on the reference kernels of tests/test_interp_fast.py; notes/test_suite.md).

Triton 3.6's interpreter patches ``triton.language`` (every builtin of ``tl``, ``tl.tensor``, ``tl.math``,
``tl.core``, found with ``inspect.getmembers``) when a launch starts, and again on *every* call of a
``@triton.jit`` helper inside the kernel, for every program of the grid: a kernel whose key loop calls a helper
per key block re-walks those modules thousands of times per launch, and the walks were a quarter or more of a
small kernel's interpreter time (cProfile: ``_patch_builtin`` under ``_patch_lang``). Inside a launch the modules
are already patched, so a helper's call finds nothing new to do; ``install`` skips it when the helper sees no
language module that the launch has not patched. The launch's own patching, and its undoing when the launch
ends, are untouched.

Second: the interpreter's integer overflow sanitizer. Every ``+``, ``-`` and ``*`` of 32-bit integers (each
offset and index of a kernel) also computes the result in int64 and compares it with the int32 range
(``binary_op_sanitize_overflow_impl``), and hands the verdict to ``device_assert``, which is a no-op unless the
builder's ``debug`` option is on, and the interpreter's never is. A quarter of a grading child's interpreter time
went to computing verdicts nobody reads; ``install`` turns ``sanitize_overflow`` off while ``debug`` is off, so
what the kernel computes (and what it would have asserted: nothing) is unchanged.

Third: the interpreter builds Python objects for each value's type. Every ``+``, ``*``, ``where`` or ``load``
constructs a ``tl.block_type`` (its shape a ``tl.tuple`` whose own type is recomputed from its items, its name an
f-string) and a ``tl.tensor`` (its shape another ``tl.tuple`` of ``tl.constexpr``), for the same few shapes
thousands of times per launch; on an a3 solution's kernels this was a third of the interpreter's CPU. ``install``
makes ``tl.block_type(element, shape)`` return one object per element type and shape (block types are never
changed once built), a tensor of such a type take its shape and ``numel`` from the first tensor of that type, and
``tl.tuple == list`` (each broadcast compares shapes so) compare the values without building a ``tl.tuple`` of the
list first. The types compare, hash and print as before.

Fourth: the interpreter's ``_get_np_dtype`` (the NumPy dtype that holds a Triton type's values, asked by every
cast, splat, load, store and constant) builds a dictionary of all nineteen of them, hashing each Triton dtype in
Python, on every call: 9% of the interpreter's time in the reference kernels' tests. ``install`` keeps its answer
per type object (the types are fixed once built, and the answer depends on the type alone).

Installed by the grading children, ``check()``'s workers and the test suite (``tests/conftest.py``) when kernels
run in the interpreter; ``uninstall`` restores the interpreter's own functions.
"""
from __future__ import annotations

import builtins

_SAVED: dict = {}
_ABSENT = object()              # in ``_SAVED``: the attribute was not in the class's own dict (inherited)
_LAUNCHES: list[set] = []      # per running launch (innermost last): ids of the language modules it patched


class _NothingToUndo:
    def restore(self) -> None:
        pass


def _language_modules(fn) -> set:
    import triton.language as tl
    return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}


def install() -> None:
    """Wrap the interpreter's ``_patch_lang`` and ``GridExecutor.__call__``, and switch off the overflow checks
    that only a ``debug`` build would read (once per process; a no-op without Triton)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    if _SAVED:
        return
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    _SAVED.update({(interpreter, "_patch_lang"): patch_lang, (interpreter.GridExecutor, "__call__"): launch})

    def _patch_lang(fn):
        langs = _language_modules(fn)
        if _LAUNCHES and _LAUNCHES[-1] and langs <= _LAUNCHES[-1]:
            return _NothingToUndo()
        scope = patch_lang(fn)
        if _LAUNCHES:
            _LAUNCHES[-1].update(langs)
        return scope

    def __call__(self, *args, **kwargs):
        _LAUNCHES.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            _LAUNCHES.pop()

    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = __call__
    builder = interpreter.interpreter_builder
    if not builder.options.debug and builder.options.sanitize_overflow:
        import dataclasses
        _SAVED[(builder, "options")] = builder.options
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    import triton.language.core as core
    _shared_types(core)
    _numpy_dtypes(interpreter)


def _numpy_dtypes(interpreter) -> None:
    """The NumPy dtype of a Triton type, looked up once per type object (the module docstring, fourth)."""
    shipped = interpreter._get_np_dtype
    _SAVED[(interpreter, "_get_np_dtype")] = shipped
    known: dict = {}        # id(type) -> (the type, its NumPy dtype); the type is kept, so its id is not reused

    def _get_np_dtype(tt_dtype):
        hit = known.get(id(tt_dtype))
        if hit is not None and hit[0] is tt_dtype:
            return hit[1]
        out = shipped(tt_dtype)
        if len(known) >= 4096:                  # types that are not shared (Gluon's layouts): never many
            known.clear()
        known[id(tt_dtype)] = (tt_dtype, out)
        return out

    interpreter._get_np_dtype = _get_np_dtype


def _shared_types(core) -> None:
    """One ``block_type`` object per element type and shape, and the tensor shape of each type built once (the
    module docstring, third). Subclasses of ``block_type`` (Gluon's) and unhashable element types are built as
    before."""
    block_type, tensor, pointer_type, constexpr = core.block_type, core.tensor, core.pointer_type, core.constexpr
    build, tensor_init = block_type.__init__, tensor.__init__
    built: dict = {}
    shape_tuple = core.tuple
    shape_eq = shape_tuple.__eq__
    for owner, name in ((block_type, "__new__"), (block_type, "__init__"), (tensor, "__init__"),
                        (shape_tuple, "__eq__")):
        _SAVED[(owner, name)] = owner.__dict__.get(name, _ABSENT)

    def key_of(ty):
        if type(ty) is pointer_type:           # equal by element, address space and constness; no __hash__
            return ("pointer", key_of(ty.element_ty), ty.address_space, ty.const)
        hash(ty)
        return ty

    def __new__(cls, *args, **kwargs):
        if cls is not block_type or len(args) != 2 or kwargs:
            return object.__new__(cls)
        element_ty, shape = args
        try:
            key = (key_of(element_ty), tuple(s.value if type(s) is constexpr else s for s in shape))
            hit = built.get(key)
        except TypeError:
            key = hit = None
        if hit is not None:
            return hit
        obj = object.__new__(cls)
        build(obj, element_ty, shape)          # raises as before on a bad shape, and nothing is kept
        obj._interp_fast_shared = None         # the tensor shape of this type, once a tensor of it is built
        if key is not None:
            built[key] = obj
        return obj

    def __init__(self, *args, **kwargs):
        if "_interp_fast_shared" not in self.__dict__:
            build(self, *args, **kwargs)

    scalar = []

    def init_tensor(self, handle, type):
        d = type.__dict__
        shared = d.get("_interp_fast_shared") if "_interp_fast_shared" in d else \
            (scalar[0] if scalar and not type.is_block() else None)
        if shared is None:
            tensor_init(self, handle, type)
            if "_interp_fast_shared" in d:
                type._interp_fast_shared = (self.shape, self.numel)
            elif not type.is_block() and not scalar:
                scalar.append((self.shape, self.numel))
            return
        self.handle = handle
        self.shape, self.numel = shared
        self.type = type
        self.dtype = type.scalar

    def eq(self, other):
        """``tl.tuple == list``: the shipped one first builds a ``tl.tuple`` of the list (and its type) to compare
        the two lists of values; this compares them."""
        if isinstance(other, (list, builtins.tuple)):
            return constexpr(self.values == list(other))
        return shape_eq(self, other)

    block_type.__new__ = __new__
    block_type.__init__ = __init__
    tensor.__init__ = init_tensor
    shape_tuple.__eq__ = eq


def uninstall() -> None:
    """Put the interpreter's own functions back."""
    for (owner, name), fn in _SAVED.items():
        if fn is _ABSENT and name == "__new__":
            owner.__new__ = _plain_new         # deleting an assigned __new__ leaves a stricter object.__new__
        elif fn is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, fn)
    _SAVED.clear()


def _plain_new(cls, *args, **kwargs):
    """What ``object.__new__`` does for a class with its own ``__init__``: ignore the arguments."""
    return object.__new__(cls)
