"""Build the lecture notebooks: ``src/NN_topic.py`` (jupytext "percent" format) -> executed ``NN_topic.ipynb``.

    python -m lectures.build                 # every lecture
    python -m lectures.build 03 flash        # the lectures whose file name contains "03" or "flash"
    python -m lectures.build --out DIR       # write somewhere else (the tests do this)

Source format: a line ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell whose lines carry a
leading ``# ``. Each notebook is executed with nbclient (kernel ``python3``, working directory the repository
root, so ``import reference`` and ``benchmarks/results/*.json`` resolve), headless (matplotlib's inline
backend, PNG figures embedded in the notebook so they render on GitHub).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat

LECTURES = Path(__file__).resolve().parent
SRC = LECTURES / "src"
ROOT = LECTURES.parent
CELL_MARK = "# %%"


def parse_percent(text: str) -> list[tuple[str, str]]:
    """Split percent-format source into ``[(cell_type, source), ...]``; text before the first marker is an error."""
    cells: list[tuple[str, list[str]]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.startswith(CELL_MARK):
            header = line[len(CELL_MARK):].strip()
            if header not in ("", "[markdown]", "[md]"):
                raise ValueError(f"line {lineno}: unknown cell header {line!r} (use '# %%' or '# %% [markdown]')")
            cells.append(("markdown" if header else "code", []))
        elif not cells:
            if line.strip():
                raise ValueError(f"line {lineno}: text before the first '# %%' cell marker")
        else:
            cells[-1][1].append(line)
    out = []
    for kind, lines in cells:
        if kind == "markdown":
            lines = [ln[2:] if ln.startswith("# ") else ln[1:] if ln.startswith("#") else ln for ln in lines]
        while lines and not lines[-1].strip():
            lines.pop()
        while lines and not lines[0].strip():
            lines.pop(0)
        if lines:
            out.append((kind, "\n".join(lines)))
    return out


def to_notebook(src_path: Path) -> nbformat.NotebookNode:
    """An unexecuted notebook for one percent-format source file."""
    nb = nbformat.v4.new_notebook()
    for kind, source in parse_percent(Path(src_path).read_text(encoding="utf-8")):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(source)
        cell.pop("id", None)
        nb.cells.append(cell)
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    nb.nbformat, nb.nbformat_minor = 4, 4  # no cell ids: stable diffs
    return nb


def execute(nb: nbformat.NotebookNode, timeout: int = 600) -> nbformat.NotebookNode:
    """Run every cell in a fresh ``python3`` kernel started in the repository root; raises on the first error."""
    from nbclient import NotebookClient

    env_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    os.environ["PYTHONPATH"] = env_path  # the kernel inherits it: `import reference, lectures` from anywhere
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}},
                            record_timing=False, allow_errors=False)
    client.execute()
    return nb


def select(names) -> list[Path]:
    sources = sorted(SRC.glob("[0-9][0-9]_*.py"))
    if not names:
        return sources
    chosen = [p for p in sources if any(n in p.stem for n in names)]
    if not chosen:
        raise SystemExit(f"no lecture in {SRC} matches {names}; have {[p.stem for p in sources]}")
    return chosen


def build(src_path: Path, out_dir: Path = LECTURES, timeout: int = 600) -> Path:
    nb = execute(to_notebook(src_path), timeout=timeout)
    out = Path(out_dir) / (Path(src_path).stem + ".ipynb")
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lectures.build", description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="substrings of lecture file names (default: all)")
    ap.add_argument("--out", type=Path, default=LECTURES, help="output folder (default: lectures/)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = ap.parse_args(argv)
    for src in select(args.names):
        t0 = time.perf_counter()
        out = build(src, args.out, args.timeout)
        print(f"{src.name} -> {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}  "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
