"""The child side of ``benchmarks._staged``: a stage's processes report each Triton/Gluon JIT compilation to the
parent, which does not count compile time against a stage's run-time limit.

``mark_compiles`` installs Triton's ``jit_cache_hook`` (called before a compilation) and
``jit_post_compile_hook`` (after it); each writes one line, ``+ PID NAME`` or ``- PID NAME``, to the pipe whose
descriptor the parent put in ``$BENCH_COMPILE_FD``.
"""
from __future__ import annotations

import os
import sys

#: the environment variable naming the descriptor a stage's processes report their compilations on
COMPILE_FD = "BENCH_COMPILE_FD"


def mark_compiles() -> None:
    """In a stage's process: write ``+ PID NAME`` before each Triton/Gluon JIT compilation and ``- PID NAME`` after
    it to the descriptor in ``$BENCH_COMPILE_FD`` (nothing without it; hooks already installed still run)."""
    fd = os.environ.get(COMPILE_FD)
    if not fd:
        return
    try:
        from triton import knobs
    except ImportError:       # no Triton: nothing compiles behind the parent's clock
        return
    fd, rt = int(fd), knobs.runtime
    before, after = rt.jit_cache_hook, rt.jit_post_compile_hook

    def mark(sign: str, fn) -> None:
        name = (getattr(fn, "name", None) or str(fn)).replace("\n", " ")[:200]
        try:
            os.write(fd, f"{sign} {os.getpid()} {name}\n".encode())    # one write < PIPE_BUF: never interleaved
        except OSError:
            pass

    def on_compile(*, fn, **kw):
        mark("+", fn)
        return before(fn=fn, **kw) if before else None    # a true value would skip the compilation

    def on_compiled(*, fn, **kw):
        mark("-", fn)
        return after(fn=fn, **kw) if after else None

    rt.jit_cache_hook, rt.jit_post_compile_hook = on_compile, on_compiled


def marked_python(code: str, *args: str) -> list[str]:
    """A command line for a process a stage starts (``pytest.main``, say) that reports its compilations too: it
    inherits ``$BENCH_COMPILE_FD`` when started with ``pass_fds=inherited_fds()``."""
    boot = "from benchmarks._compile_marks import mark_compiles; mark_compiles(); "
    return [sys.executable, "-c", boot + code, *args]


def inherited_fds() -> tuple[int, ...]:
    fd = os.environ.get(COMPILE_FD)
    return (int(fd),) if fd else ()
