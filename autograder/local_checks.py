"""``engine.ChildChecks``'s interface in the caller's own process, for ``check()`` and ``make check``: the
compile-only checks of a ``Test.parent_check`` (a7) run on the student's own code on the student's own machine
(no sandbox, as every visible check). The kernel and helpers are read from the graded function's globals (the
notebook's namespace); the verdict is the same function the grader calls (``gluon_compile``).

Gluon compiles only with Triton's interpreter off: a7's first cell sets ``TRITON_INTERPRET=0`` before Triton
is imported; where the process had already imported Triton with the interpreter on, the compile says so.
"""
from __future__ import annotations

import os

from . import gluon_child
from .specs._base import ChildError
from .where import exc_line, root

NOT_IMPLEMENTED = "not implemented yet"


def _why(exc) -> str:
    if isinstance(root(exc), NotImplementedError) or "NotImplementedError" in str(exc):
        return f"{NOT_IMPLEMENTED} (NotImplementedError)"
    return exc_line(exc)


class LocalChecks:
    def __init__(self, namespace: dict):
        self.ns = namespace

    def probe(self, name: str, args: list) -> list[int]:
        try:
            return gluon_child.probe(self.ns, name, args)
        except Exception as exc:  # noqa: BLE001 -- feedback, not a crash
            raise ChildError(f"{name}: {_why(exc)}") from None

    def compile(self, name: str, signature: dict, constexprs: dict, num_warps: int, maxnreg=None) -> dict:
        try:
            meta, arrs = gluon_child.compile_kernel(self.ns, name, signature, constexprs, num_warps, maxnreg)
        except Exception as exc:  # noqa: BLE001 -- feedback, not a crash
            hint = ("; Triton's interpreter is on in this process (TRITON_INTERPRET=1): restart the kernel and run "
                    "the notebook from its first cell, which turns it off" if
                    os.environ.get("TRITON_INTERPRET") == "1" else "")
            raise ChildError(f"{name}: {_why(exc)}{hint}") from None
        return {"ptx": arrs["ptx"].tobytes().decode("utf-8", "replace"), "cubin": arrs["cubin"].tobytes(), **meta}


def run_parent_check(check_fn, fn) -> tuple[bool, str]:
    """``(passed, message)`` of a ``Test.parent_check`` on the namespace ``fn`` was defined in."""
    try:
        return check_fn(LocalChecks(getattr(fn, "__globals__", {})))
    except ChildError as exc:
        return False, str(exc)
