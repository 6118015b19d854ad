"""Reading a submission: a student notebook (.ipynb) or a .py module (jupytext "percent" cells or plain).

The grader runs the code cells in order and skips what is not part of the answer (the shared contract):
markdown cells, cells tagged ``check`` or ``skip``, cells that start with a cell magic (``%%``), and single
lines that start with ``!`` or ``%`` (shell escapes, line magics). A ``.py`` without ``# %%`` markers is one
cell.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

SKIP_TAGS = {"check", "skip"}
_CELL = re.compile(r"^# %%(.*)$")
_TAGS = re.compile(r"tags\s*=\s*\[([^\]]*)\]")


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
    if not any(_CELL.match(line) for line in text.splitlines()):
        return [Cell(0, text)]
    cells, cur, header, idx = [], [], None, 0
    for line in text.splitlines():
        m = _CELL.match(line)
        if m:
            if header is not None or cur:
                cells.append((header or "", cur))
            header, cur = m.group(1), []
        else:
            cur.append(line)
    cells.append((header or "", cur))
    out = []
    for header, lines in cells:
        idx += 1
        if "[markdown]" in header or "[md]" in header:
            continue
        tm = _TAGS.search(header)
        tags = tuple(t.strip().strip("'\"") for t in tm.group(1).split(",")) if tm else ()
        out.append(Cell(idx - 1, "\n".join(lines), tags))
    return out


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
