"""The one reader of jupytext "percent" files: lecture sources, assignment solution sources, .py submissions.

The rules (one set for all three):

* A line starting ``# %%`` opens a cell. ``[markdown]`` (or ``[md]``) after the marker makes a markdown cell,
  ``[raw]`` a raw cell, anything else a code cell. ``tags=["check", "skip"]`` after the marker sets the cell's
  tags (a JSON list; single quotes are accepted too).
* Markdown lines carry a comment prefix that is removed: ``# text`` gives ``text``, a lone ``#`` an empty line
  (a line without ``#`` is kept as written).
* ``given="name"`` after the marker (course sources only) fills an empty code cell with the file
  ``assignments/given/name.py``: code that several notebooks need is written once there, and each generated
  notebook still stands alone.
* Text before the first marker: an error for the course's own sources (``preamble="error"``); a code cell for
  a student's file (``preamble="code"``), so a plain module without markers is one cell.
* ``trim=True`` (notebooks built from sources) drops blank lines at both ends of each cell and cells left
  empty; ``trim=False`` (submissions) keeps every line, so line numbers in tracebacks match the file.

Cells are numbered in file order from 0 (markdown cells and a preamble cell count), which is the number a
grader message shows.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PercentCell", "parse_percent", "has_markers", "GIVEN"]

#: the shared "given" cells of the assignments (absent where only the grader is installed)
GIVEN = Path(__file__).resolve().parents[1] / "assignments" / "given"

_HEADER = re.compile(r"^# %%(?P<rest>.*)$")
_KIND = re.compile(r"\[(markdown|md|raw)\]")
_TAGS = re.compile(r"tags\s*=\s*(\[[^\]]*\])")
_GIVEN = re.compile(r"given\s*=\s*[\"'](?P<name>\w+)[\"']")


@dataclass
class PercentCell:
    kind: str                                   # "code", "markdown" or "raw"
    source: str
    tags: list[str] = field(default_factory=list)
    index: int = 0                              # position in the file, from 0


def has_markers(text: str) -> bool:
    """Whether ``text`` has at least one ``# %%`` cell marker."""
    return any(_HEADER.match(line) for line in text.splitlines())


def _tags(rest: str) -> list[str]:
    m = _TAGS.search(rest)
    if not m:
        return []
    try:
        tags = json.loads(m.group(1))
    except json.JSONDecodeError:
        tags = [t.strip().strip("'\"") for t in m.group(1)[1:-1].split(",")]
    return [str(t) for t in tags if str(t)]


def _markdown_line(line: str) -> str:
    return line[2:] if line.startswith("# ") else line[1:] if line.startswith("#") else line


def _given(name: str, body: list[str], where: str, number: int) -> list[str]:
    if any(line.strip() for line in body):
        raise ValueError(f"{where}:{number}: a given=\"{name}\" cell takes its code from assignments/given/"
                         f"{name}.py; leave its body empty")
    path = GIVEN / f"{name}.py"
    if not path.is_file():
        raise ValueError(f"{where}:{number}: given=\"{name}\": no file {path}")
    return path.read_text(encoding="utf-8").splitlines() + body


def parse_percent(text: str, where: str = "<source>", *, preamble: str = "error", trim: bool = True):
    """Split percent-format ``text`` into ``PercentCell``s (rules in the module docstring); ``where`` names the
    file in error messages."""
    if preamble not in ("error", "code"):
        raise ValueError(f"preamble must be 'error' or 'code', got {preamble!r}")
    raw: list[tuple[str, list[str], list[str]]] = []   # (kind, tags, lines)
    givens: dict[int, tuple[str, int]] = {}             # cell position -> (given name, header line)
    head: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        m = _HEADER.match(line)
        if m:
            k = _KIND.search(m["rest"])
            kind = "code" if k is None else "raw" if k.group(1) == "raw" else "markdown"
            g = _GIVEN.search(m["rest"])
            if g and kind == "code":
                givens[len(raw)] = (g["name"], number)
            raw.append((kind, _tags(m["rest"]), []))
        elif raw:
            raw[-1][2].append(line)
        else:
            if line.strip() and preamble == "error":
                raise ValueError(f"{where}:{number}: text before the first '# %%' cell marker")
            head.append(line)
    for pos, (name, number) in givens.items():
        raw[pos][2][:] = _given(name, raw[pos][2], where, number)
    if head and preamble == "code":
        raw.insert(0, ("code", [], head))
    cells = []
    for index, (kind, tags, lines) in enumerate(raw):
        if kind == "markdown":
            lines = [_markdown_line(line) for line in lines]
        if trim:
            while lines and not lines[0].strip():
                lines = lines[1:]
            while lines and not lines[-1].strip():
                lines = lines[:-1]
            if not lines:
                continue
        cells.append(PercentCell(kind, "\n".join(lines), tags, index))
    return cells
