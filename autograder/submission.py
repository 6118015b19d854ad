"""Reading a submission: a student notebook (.ipynb) or a .py module (jupytext "percent" cells or plain).

The grader runs the code cells in order and skips what is not part of the answer (the shared contract):
markdown and raw cells, cells tagged ``check`` or ``skip``, cells that start with a cell magic (``%%``), and single
lines that start with ``!`` or ``%`` (shell escapes, line magics). A ``.py`` without ``# %%`` markers is one
cell.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .percent import has_markers, parse_percent

SKIP_TAGS = {"check", "skip"}


@dataclass
class Cell:
    index: int
    source: str
    tags: tuple = ()


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
        cells.append(Cell(i, src, tags))
    return cells


def read_percent(text: str):
    """The code cells of a percent-format module (``autograder.percent``); a module without markers is one."""
    if not has_markers(text):
        return [Cell(0, text)]
    return [Cell(c.index, c.source, tuple(c.tags))
            for c in parse_percent(text, preamble="code", trim=False) if c.kind == "code"]


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
    else:
        raise SubmissionError(f"submission must be a .ipynb notebook or a .py module, got {path.name}")
    kept = []
    for c in cells:
        if SKIP_TAGS & set(c.tags) or c.source.lstrip().startswith("%%"):
            continue
        kept.append(Cell(c.index, _strip_magics(c.source), c.tags))
    return kept
