"""Reading a submission: a student notebook (.ipynb) or a .py module (jupytext "percent" cells or plain).

The grader runs the code cells in order and skips what is not part of the answer (the shared contract):
markdown and raw cells, cells tagged ``check`` or ``skip``, cells that start with a cell magic (``%%``), and single
lines that start with ``!`` or ``%`` (shell escapes, line magics). A ``.py`` without ``# %%`` markers is one
cell. Messages name a cell as Jupyter shows it: ``cell [5]`` is the fifth code cell (``In [5]`` after "Restart &
Run All"; markdown cells do not count, skipped ones do); a plain ``.py`` is named by its file name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .percent import has_markers, parse_percent

SKIP_TAGS = {"check", "skip"}


@dataclass
class Cell:
    index: int           # position among all cells of the file, from 0 (the grader's key: ``<cell index>``)
    source: str
    tags: tuple = ()
    label: str = ""      # how the student sees it: "cell [5]" (5th code cell: Jupyter's In [5] after Run All)

    @property
    def name(self) -> str:
        return self.label or f"cell {self.index}"


class SubmissionError(ValueError):
    """The file is not a readable notebook or Python module."""


def _strip_magics(src: str) -> str:
    out = []
    for line in src.splitlines():
        s = line.lstrip()
        out.append("" if s.startswith(("!", "%")) else line)   # keep line numbers
    return "\n".join(out)


def read_notebook(text: str):
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SubmissionError(f"not a valid notebook (JSON error: {exc})") from exc
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise SubmissionError("not a valid notebook: no 'cells' list")
    cells = []
    for i, c in enumerate(nb["cells"]):
        if not isinstance(c, dict) or c.get("cell_type") != "code":
            continue
        src = c.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        tags = tuple((c.get("metadata") or {}).get("tags") or ())
        cells.append(Cell(i, src, tags, f"cell [{len(cells) + 1}]"))
    return cells


def read_percent(text: str):
    """The code cells of a percent-format module (``autograder.percent``); a module without markers is one."""
    if not has_markers(text):
        return [Cell(0, text)]
    code = [c for c in parse_percent(text, preamble="code", trim=False) if c.kind == "code"]
    return [Cell(c.index, c.source, tuple(c.tags), f"cell [{n}]") for n, c in enumerate(code, 1)]


def load_cells(path) -> list:
    """The code cells the grader runs, in order (skipped cells already removed, magics blanked)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SubmissionError(f"cannot read submission {path}: {exc}") from exc
    if path.suffix == ".ipynb":
        cells = read_notebook(text)
    elif path.suffix == ".py":
        cells = read_percent(text)
        if len(cells) == 1 and not cells[0].label:
            cells[0].label = path.name          # a plain module: "my_sub.py, line 12"
    else:
        raise SubmissionError(f"submission must be a .ipynb notebook or a .py module, got {path.name}")
    kept = []
    for c in cells:
        if SKIP_TAGS & set(c.tags) or c.source.lstrip().startswith("%%"):
            continue
        kept.append(Cell(c.index, _strip_magics(c.source), c.tags, c.label))
    return kept
