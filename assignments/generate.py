"""Generate the student notebooks from the instructor's solution sources.

    python -m assignments.generate                 # write assignments/<aid>/<aid>.ipynb for all five
    python -m assignments.generate --check         # exit 1 if a committed notebook is not what would be written
    python -m assignments.generate --solutions DIR # also write DIR/<aid>_solution.ipynb (outputs cleared)
    python -m assignments.generate a1_attention    # only some assignments
    python -m assignments.generate --force a3_triton   # overwrite a notebook that was edited in place

A solution source is a jupytext "percent" file: ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown
cell whose lines carry a ``# `` prefix, and ``tags=["check"]`` after the marker sets the cell's tags (read by
``autograder.percent``, the same reader as the lecture build's and the grader's). Inside a
code cell, each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region (nbgrader/otter convention) is replaced in
the student version by ``raise NotImplementedError("Implement <function>")`` at the marker's indentation; code
before and after the region is kept. Output is deterministic (cell ids are positions), so regenerating is
byte-identical.

A student notebook edited in place (a student's work in the course checkout) is never overwritten: each
generated notebook carries, in its metadata (``course.cells_sha256``), a digest of its cells as written (type,
source, tags; outputs and execution counts are left out, so running it is not editing it). If the notebook on
disk no longer matches its own digest (or has none and differs from what would be written now), the fresh one
goes beside it as ``<aid>.generated.ipynb``, the message says so, and the exit status is 1; ``--force``
overwrites.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

import nbformat

from autograder.percent import PercentCell, parse_percent

from . import ASSIGNMENTS, written

ROOT = Path(__file__).resolve().parent
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"

_DEF = re.compile(r"^(?P<indent>\s*)(?:async\s+)?(?P<what>def|class)\s+(?P<name>\w+)")

NOTEBOOK_KERNEL = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def _enclosing_name(lines: list[str], index: int, indent: int) -> str | None:
    """Name of the function holding line ``index`` (``Class.method`` for methods), by indentation."""
    names: list[str] = []
    limit = indent
    for line in reversed(lines[:index]):
        m = _DEF.match(line)
        if m and len(m["indent"]) < limit:
            if not names and m["what"] == "class":
                return None  # a region directly in a class body is not inside a function
            if names and m["what"] == "def":
                continue  # nested function: keep the innermost name, skip to the class level
            names.append(m["name"])
            limit = len(m["indent"])
            if m["what"] == "class" or limit == 0:
                break
    return ".".join(reversed(names)) if names else None


def strip_solutions(source: str, where: str = "<cell>") -> str:
    """Replace every SOLUTION region by ``raise NotImplementedError("Implement <name>")``."""
    lines = source.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == BEGIN:
            indent = len(line) - len(line.lstrip())
            name = _enclosing_name(lines, i, indent)
            if name is None:
                raise ValueError(f"{where}: a SOLUTION region must be inside a function body (line {i + 1})")
            j = i + 1
            while j < len(lines) and lines[j].strip() != END:
                if lines[j].strip() == BEGIN:
                    raise ValueError(f"{where}: nested {BEGIN} (line {j + 1})")
                j += 1
            if j == len(lines):
                raise ValueError(f"{where}: {BEGIN} without {END} (line {i + 1})")
            out.append(" " * indent + f'raise NotImplementedError("Implement {name}")')
            i = j + 1
        elif line.strip() == END:
            raise ValueError(f"{where}: {END} without {BEGIN} (line {i + 1})")
        else:
            out.append(line)
            i += 1
    return "\n".join(out)


def solution_lines(source: str) -> list[str]:
    """The non-blank lines inside SOLUTION regions (tests use them to look for leaked solutions)."""
    inside, found = False, []
    for line in source.splitlines():
        if line.strip() == BEGIN:
            inside = True
        elif line.strip() == END:
            inside = False
        elif inside and line.strip():
            found.append(line.strip())
    return found


def cells_digest(nb) -> str:
    """sha256 of a notebook's cells as the generator writes them: type, source and tags, in order (not outputs,
    execution counts or other metadata, which running or viewing a notebook changes)."""
    cells = [[c.cell_type, c.source, list(c.get("metadata", {}).get("tags", []))] for c in nb.cells]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode("utf-8")).hexdigest()


def edited(path: Path, fresh: str) -> bool:
    """Whether the notebook at ``path`` holds someone's edits: its cells no longer match the digest the
    generator stored in it, or (no digest: written before digests were stored) they differ from ``fresh``'s.
    An unreadable file counts as edited (never overwritten without ``--force``)."""
    try:
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    except Exception:  # noqa: BLE001 -- not a notebook any more: someone's file
        return True
    stored = nb.metadata.get("course", {}).get("cells_sha256")
    if stored is not None:
        return stored != cells_digest(nb)
    return cells_digest(nb) != cells_digest(nbformat.reads(fresh, as_version=4))


def to_notebook(cells: list[PercentCell], student: bool, where: str = "<source>") -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(NOTEBOOK_KERNEL), "language_info": {"name": "python"}}
    for n, cell in enumerate(cells):
        meta = {"tags": list(cell.tags)} if cell.tags else {}
        cid = f"cell-{n:03d}"
        if cell.kind == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell(cell.source, id=cid, metadata=meta))
        elif cell.kind == "raw":
            nb.cells.append(nbformat.v4.new_raw_cell(cell.source, id=cid, metadata=meta))
        else:
            src = strip_solutions(cell.source, f"{where} cell {n}") if student else cell.source
            nb.cells.append(nbformat.v4.new_code_cell(src, id=cid, metadata=meta))
    nb.metadata["course"] = {"cells_sha256": cells_digest(nb)}   # how `edited` tells generated from edited
    nbformat.validate(nb)
    return nb


def render(aid: str, student: bool = True) -> str:
    """The notebook text for assignment ``aid`` (student version unless ``student=False``)."""
    src = ROOT / aid / f"{aid}_solution.py"
    cells = parse_percent(src.read_text(encoding="utf-8"), str(src))
    nb = to_notebook(cells, student, str(src))
    if student:
        code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
        missing = [n for n in written(aid) if f'NotImplementedError("Implement {n}' not in code]
        if missing:
            raise ValueError(f"{src}: no SOLUTION region (stub) in {missing}, the functions the student writes "
                             "(assignments.WRITTEN / GRADED)")
    return nbformat.writes(nb) + "\n"


def student_path(aid: str) -> Path:
    return ROOT / aid / f"{aid}.ipynb"


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT.parent))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m assignments.generate", description=__doc__.split("\n\n")[0])
    ap.add_argument("aids", nargs="*", help=f"assignment ids (default: all of {', '.join(ASSIGNMENTS)})")
    ap.add_argument("--check", action="store_true", help="do not write; exit 1 if a student notebook is stale")
    ap.add_argument("--solutions", metavar="DIR", type=Path, help="also write solution notebooks into DIR")
    ap.add_argument("--force", action="store_true", help="overwrite student notebooks even where edited in place")
    args = ap.parse_args(argv)
    unknown = [a for a in args.aids if a not in ASSIGNMENTS]
    if unknown:
        ap.error(f"unknown assignment id(s) {unknown}; expected some of {list(ASSIGNMENTS)}")
    stale, kept = [], []
    for aid in args.aids or list(ASSIGNMENTS):
        text, path = render(aid), student_path(aid)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(_rel(path))
        elif path.exists() and path.read_text(encoding="utf-8") == text:
            print(f"unchanged {_rel(path)}")
        elif path.exists() and not args.force and edited(path, text):
            beside = path.with_name(f"{aid}.generated.ipynb")
            beside.write_text(text, encoding="utf-8")
            kept.append(aid)
            print(f"kept {_rel(path)}: it was edited in place (its cells are not what the "
                  f"generator wrote); the fresh notebook is {_rel(beside)}. Move your work "
                  f"elsewhere, or overwrite it with `python -m assignments.generate --force {aid}`", file=sys.stderr)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {_rel(path)}")
        if args.solutions is not None:
            args.solutions.mkdir(parents=True, exist_ok=True)
            out = args.solutions / f"{aid}_solution.ipynb"
            out.write_text(render(aid, student=False), encoding="utf-8")
            print(f"wrote {out}")
    if stale:
        print("stale (run `python -m assignments.generate`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 1 if kept else 0


if __name__ == "__main__":
    sys.exit(main())
