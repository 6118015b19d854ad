"""Triton's interpreter without its repeated language patching and its unread overflow checks: the same results
for less CPU (about a third less from the first; the second took an a3 + a5 selftest from 48.2 to 40.3 CPU-s,
notes/test_suite.md).

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

Installed by the grading children, ``check()``'s workers and the test suite (``tests/conftest.py``) when kernels
run in the interpreter; ``uninstall`` restores the interpreter's own functions.
"""
from __future__ import annotations

_SAVED: dict = {}
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


def uninstall() -> None:
    """Put the interpreter's own functions back."""
    for (owner, name), fn in _SAVED.items():
        setattr(owner, name, fn)
    _SAVED.clear()
