"""What went wrong while a submission's cells were loading, said where the student looks for it.

The child runs every code cell in order and reports, per cell, whether it raised (``child.py``). A cell that
fails takes the graded names it defines with it: each test of such a name fails with
``cell [3] ("def f(x):") failed while loading: SyntaxError: '(' was never closed (line 12)`` instead of "safe_softmax is not
defined". Which names a cell defines is read from its text (a cell that does not parse is read line by line),
the last cell defining a name wins, like re-running a notebook top to bottom. Cells are named as Jupyter shows
them (``cell [5]``: the fifth code cell, ``submission.Cell.name``).
"""
from __future__ import annotations

import ast
import re

_TOP_DEF = re.compile(r"^(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)|^([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)")
# the place a child's message ends with: "(cell [5], line 12)", "(cell [5], line 3, in f)", "(<cell 4>, line 12)"
_WHERE = re.compile(r"\s*\((?P<cell><cell -?\d+>|cell -?\d+|cell \[\d+\]|cell In \[\d+\]|[\w.-]+\.py), "
                    r"line (?P<line>\d+)(?P<fn>, in [\w<>]+)?\)\s*$")
_EFBIG = ("File too large", "[Errno 27]")


def defined_names(source: str) -> set:
    """Top-level names a cell binds: ``def``/``class``, assignments, imports (a cell with a syntax error: the
    ``def``/``class``/``name =`` lines at column 0)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        out = set()
        for line in source.splitlines():
            m = _TOP_DEF.match(line)
            if m:
                out.add(m.group(1) or m.group(2))
        return out
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def explain(error: str, file_limit: int | None = None, cell: str | None = None) -> str:
    """The child's one-line error made readable: its ``(cell [5], line L)`` suffix becomes ``(line L)`` when
    that is the failing cell ``cell`` (named by the caller; None: any cell), and stays when the error happened
    in another cell (a function defined there, called at load time); known causes get a hint."""
    error = error or "unknown error"
    m = _WHERE.search(error)
    if m and (cell is None or m.group("cell") == cell or m.group("cell").startswith("<")):
        error = error[: m.start()] + f" (line {m.group('line')}{m.group('fn') or ''})"
    if any(s in error for s in _EFBIG):
        mib = f"{file_limit >> 20} MiB" if file_limit else "the file-size limit"
        error = error.replace("[Errno 27] File too large", "file too large").rstrip() + \
            f" (output over {mib}; remove the prints in the loop)"
    elif error.startswith("NotImplementedError"):
        error += " (the cell calls a function that is still a stub)"
    return error


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip():
            s = line.strip()
            return s if len(s) <= 50 else s[:47] + "..."
    return ""


def cell_failures(cells, reports, file_limit=None) -> list:
    """``[(cell, message)]`` for every cell whose report says it failed, in order. ``cells`` are the
    submission's ``Cell`` objects, ``reports`` the child's ``[{"index", "ok", "error"}]``."""
    by_index = {c.index: c for c in cells}
    out = []
    for r in reports:
        if r.get("ok"):
            continue
        cell = by_index.get(r.get("index"))
        name = cell.name if cell is not None else f'cell {r.get("index")}'
        where = name + (f' ("{_first_line(cell.source)}")' if cell is not None else "")
        out.append((cell, f"{where} failed while loading: {explain(r.get('error'), file_limit, name)}"))
    return out


def failed_names(cells, reports, graded_names, file_limit=None) -> dict:
    """``{graded name: message}`` for each graded name whose last defining cell failed while loading."""
    failures = {id(c): msg for c, msg in cell_failures(cells, reports, file_limit) if c is not None}
    ran = {r.get("index") for r in reports}
    last = {}
    for c in cells:
        if c.index not in ran:
            continue
        for name in defined_names(c.source) & set(graded_names):
            last[name] = c
    return {name: failures[id(c)] for name, c in last.items() if id(c) in failures}


def looks_like(cells, assignment) -> str | None:
    """A hint when the cells define few of ``assignment``'s graded names and more of another assignment's:
    ``"this looks like a2_flash_numpy (it defines flash_attention_forward, flash_attention_backward)"``."""
    from . import specs
    defined = set()
    for c in cells:
        defined |= defined_names(c.source)

    def share(aid):
        names = {t.name for t in specs.load(aid).tasks.values()}
        return len(names & defined) / len(names), sorted(names & defined)
    mine, _ = share(assignment)
    if mine >= 0.5:
        return None
    scores = {aid: share(aid) for aid in specs.ASSIGNMENTS if aid != assignment}
    best = max(s for s, _ in scores.values())
    if best <= mine or best < 0.5:
        return None
    like = [aid for aid, (s, _) in scores.items() if s == best]
    names = sorted({n for aid in like for n in scores[aid][1]})
    return f"this looks like {' or '.join(like)} (it defines {', '.join(names)}); was it graded against the " \
           f"wrong assignment?"
