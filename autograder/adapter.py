"""The thin adapter between the course's visible checks and a student's own code (``make check``).

``load(path)`` runs the code cells of a notebook (or a ``.py`` module) in this process, in order, the way the
grader reads a submission (``submission.load_cells``: markdown, ``check`` and ``skip`` cells and magics left
out), with the notebook's folder as the working directory. A cell that raises is recorded, not fatal: the
functions it defines report "cell [5] failed while loading: ..." instead of being undefined, as in grading.
No sandbox here: this is the student's own code on the student's own machine.

``autograder/tests_visible/`` turns every visible case of an assignment into a pytest test with the graded
function's name as its marker; this module and that folder ship in the student release and need neither the
course's ``reference`` package nor the specs' hidden case generators.
"""
from __future__ import annotations

import contextlib
import io
import linecache
import os
import types
from dataclasses import dataclass, field
from pathlib import Path

from .load_errors import defined_names
from .submission import load_cells
from .where import CELL_LABELS, exc_line

ROOT = Path(__file__).resolve().parent.parent      # the repository, or the student release


@dataclass
class Loaded:
    path: Path
    namespace: dict
    failed: dict = field(default_factory=dict)       # name -> "cell [5] ("first line") failed while loading: ..."
    errors: list = field(default_factory=list)       # every cell that failed, in order
    output: str = ""                                  # what the cells printed

    def function(self, name):
        """The graded function (or class) ``name``, or a message saying why it is missing."""
        if name in self.failed:
            return None, self.failed[name]
        obj = self.namespace.get(name)
        if obj is None:
            return None, f"{name} is not defined in {self.path.name}"
        return obj, None


def default_submission(assignment: str) -> Path:
    """``assignments/<aid>/<aid>.ipynb``: the notebook the student works in."""
    return ROOT / "assignments" / assignment / f"{assignment}.ipynb"


def load(path, assignment=None) -> Loaded:
    """``assignment``: a Triton assignment's cells compile under its host policy (``autograder.host_policy``),
    as in grading."""
    path = Path(path).resolve()
    cells = load_cells(path)
    mod = types.ModuleType("__main__")                  # like a notebook: functions live in __main__
    ns = mod.__dict__
    ns["__builtins__"] = __builtins__
    out = Loaded(path, ns)
    policy = None
    if assignment is not None:
        from . import host_policy
        cfg = host_policy.cells_config(assignment, cells)
        policy = host_policy.CellCompiler(ns, cfg) if cfg else None
    last, failed = {}, {}                               # name -> its last defining cell; cell index -> message
    ns["__cells__"] = [c.source for c in cells]     # the code cells, in order (a7's compile-only check re-runs
    buf = io.StringIO()                              # them in a process without Triton's interpreter)
    here = os.getcwd()
    try:
        os.chdir(path.parent)
        for cell in cells:
            fname = f"<cell {cell.index}>"
            CELL_LABELS[fname] = cell.name
            linecache.cache[fname] = (len(cell.source), None, cell.source.splitlines(True), fname)  # @triton.jit
            for name in defined_names(cell.source):
                last[name] = cell
            try:
                with contextlib.redirect_stdout(buf):
                    code = policy.compile(cell.index, cell.source, fname) if policy else \
                        compile(cell.source, fname, "exec")
                    exec(code, ns)  # noqa: S102 -- the student's own notebook
            except Exception as exc:  # noqa: BLE001 -- a failing cell is recorded, the rest still runs
                first = next((ln.strip() for ln in cell.source.splitlines() if ln.strip()), "")[:50]
                failed[cell.index] = f'{cell.name} ("{first}") failed while loading: {exc_line(exc)}'
                out.errors.append(failed[cell.index])
    finally:
        os.chdir(here)
    # the last cell defining a name wins, like re-running a notebook top to bottom
    out.failed = {name: failed[c.index] for name, c in last.items() if c.index in failed}
    out.output = buf.getvalue()
    return out
