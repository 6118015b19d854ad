"""Where in the student's code an exception happened, named as the student sees the code.

Cells are named as Jupyter shows them: ``cell [5]`` is the fifth code cell of the notebook, the ``In [5]`` that
Jupyter prints beside it after "Restart & Run All" (markdown cells do not count, skipped ``check`` cells do).
The grader compiles cell ``i`` of the file under the file name ``<cell i>`` (``i``: its 0-based position among
all cells, the key the grader uses internally) and registers the label here (``CELL_LABELS``); in a notebook
kernel, IPython's own cell file names map to ``In [n]``.

An exception inside a Triton kernel is reported at the kernel's line, not at the launch:

- the interpreter (``TRITON_INTERPRET=1``) raises ``InterpreterError`` *from* the kernel's exception, whose
  traceback runs through the kernel body: the frames of the whole ``__cause__`` chain are searched;
- a compilation error (on a GPU) carries the kernel's AST node; its line is relative to the kernel's ``def``,
  and the launching ``JITFunction`` (a local of Triton's ``run`` frame) says where that ``def`` is.

Used in the sandboxed child (load errors, tracebacks, the op audit's "cell [5], line 12, in f") and by
``check()`` in a notebook. Standard library only.
"""
from __future__ import annotations

import os
import re
import sys
import traceback

#: ``"<cell i>"`` -> the label of that cell (``"cell [5]"``; a ``.py`` module without cells: its file name)
CELL_LABELS: dict = {}
_HERE = os.path.dirname(os.path.abspath(__file__))
_CELL = re.compile(r"^<cell (-?\d+)>$")
_CELL_IN_TEXT = re.compile(r"<cell -?\d+>")


def label(filename: str) -> str | None:
    """How the student's notebook names the code of ``filename``: ``cell [5]``; None for library code."""
    if filename in CELL_LABELS:
        return CELL_LABELS[filename]
    m = _CELL.match(filename)
    if m:
        return f"cell {m.group(1)}"
    ipy = _ipython_cell(filename)
    if ipy is not None:
        return f"cell In [{ipy}]"
    return None


def _ipython_cell(filename):
    ip = sys.modules.get("IPython")
    try:
        shell = ip.get_ipython() if ip is not None else None
        n = shell.compile._filename_map.get(filename) if shell is not None else None
    except Exception:  # noqa: BLE001 -- an IPython without the map: no label
        return None
    return n


def _mine(filename: str) -> bool:
    """A frame of the student's code: a registered cell, an IPython cell, or a file outside Python's own
    installation (site-packages, the standard library) and outside the autograder."""
    if label(filename) is not None:
        return True
    if CELL_LABELS:                  # the grader's child (or make check): the submission is its cells
        return False
    if filename.startswith("<") or os.path.abspath(filename).startswith(_HERE + os.sep):
        return False
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.realpath(sys.prefix)}
    return not any(filename.startswith(p + os.sep) for p in prefixes if p)


def chain(exc):
    """``exc`` and the exceptions it was raised from (``__cause__``, or the implicit ``__context__``), outer first."""
    seen = []
    while exc is not None and exc not in seen and len(seen) < 8:
        seen.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return seen


def root(exc):
    """The exception to report: a Triton ``InterpreterError`` stands for the kernel's own exception (its cause)."""
    while type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def frames(exc) -> list:
    """``[(filename, line, function)]`` of the student's code, outermost first, through the exception chain
    (the cause's traceback continues below the frame that caught it), plus the kernel line of a Triton
    compilation error."""
    out = []
    for e in chain(exc):
        out += [(f.filename, f.lineno, f.name) for f in traceback.extract_tb(e.__traceback__) if _mine(f.filename)]
    for e in chain(exc):
        k = _compile_error_line(e)
        if k is not None:
            out.append(k)
            break
    return out


def _compile_error_line(exc):
    """``(filename, line, kernel)`` of a Triton ``CompilationError``: its node's line counts from the kernel's
    ``def``; the ``JITFunction`` being run (``self`` in Triton's frames) knows where that ``def`` is."""
    node = getattr(exc, "node", None)
    if node is None or not hasattr(node, "lineno") or not hasattr(exc, "src"):
        return None
    tb = exc.__traceback__
    jit = None
    while tb is not None:
        cand = tb.tb_frame.f_locals.get("self")
        for c in (cand, getattr(cand, "fn", None)):          # JITFunction.run, or ASTSource (triton.compile)
            if hasattr(c, "starting_line_number") and hasattr(c, "raw_src") and hasattr(c, "fn"):
                jit = c
        tb = tb.tb_next
    if jit is None:
        return None
    code = getattr(jit.fn, "__code__", None)
    if code is None:
        return None
    offset = next((i for i, line in enumerate(jit.raw_src) if re.match(r"\s*def\s", line)), 0)
    return code.co_filename, jit.starting_line_number + offset + node.lineno - 1, code.co_name


def _compile_error_message(exc):
    """A Triton ``CompilationError`` on one line: its message and the kernel line it points at (its ``str`` is
    the kernel's source up to that line, a caret and the message)."""
    node, src = getattr(exc, "node", None), getattr(exc, "src", None)
    if node is None or not hasattr(exc, "error_message"):
        return None
    line = ""
    if src and hasattr(node, "lineno"):
        lines = src.split("\n")
        line = lines[node.lineno - 1].strip() if 0 < node.lineno <= len(lines) else ""
    text = (exc.error_message or "").strip().splitlines()
    return (text[-1] if text else "does not compile") + (f" at `{line}`" if line else "")


def innermost(exc):
    """The innermost frame of the student's code, or None."""
    fr = frames(exc)
    return fr[-1] if fr else None


def place(filename: str, line: int, function: str | None = None) -> str:
    """``cell [5], line 12, in f`` (a file outside the notebook: ``name.py, line 12, in f``)."""
    where = label(filename) or os.path.basename(filename)
    return f"{where}, line {line}" + (f", in {function}" if function and function != "<module>" else "")


def exc_line(exc, limit: int = 300) -> str:
    """``ValueError: msg (cell [5], line 12, in k)``: the error and the innermost place in the student's code
    (a Triton kernel's own line when the kernel raised or did not compile)."""
    r = root(exc)
    fr = innermost(exc)
    where = f" ({place(*fr)})" if fr else ""
    msg = _compile_error_message(r) or str(r)
    msg = _CELL_IN_TEXT.sub(lambda m: label(m.group(0)) or m.group(0), msg[:limit])   # SyntaxError: (<cell 4>, ...)
    return f"{type(r).__name__}: {msg}{where}"


def student_tb(exc, last: int = 5) -> str:
    """The traceback lines inside the student's code (not the harness, not the libraries), innermost last."""
    return "\n".join(place(*f) for f in frames(exc)[-last:])
