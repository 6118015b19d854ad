"""Build the lecture notebooks: ``src/NN_topic.py`` (jupytext "percent" format) -> executed ``NN_topic.ipynb``.

    python -m lectures.build                 # every lecture
    python -m lectures.build 03 flash        # the lectures whose file name contains "03" or "flash"
    python -m lectures.build --out DIR       # write somewhere else (the tests do this)

Source format: a line ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell whose lines carry a
leading ``# `` (``autograder.percent`` reads it, the same reader as the assignment generator and the grader's).

Each notebook is executed with nbclient (kernel ``python3``) as ``make lab`` or VS Code would run it: working
folder ``lectures/`` and ``PYTHONPATH`` unset, so ``import lectures, reference`` works only through the editable
install of ``make setup`` and ``benchmarks/results/*.json`` only through ``lectures._plots.ROOT``. Headless:
matplotlib's inline backend, PNG figures embedded in the notebook so they render on GitHub.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from autograder.percent import parse_percent

LECTURES = Path(__file__).resolve().parent
SRC = LECTURES / "src"
ROOT = LECTURES.parent
def to_notebook(src_path: Path) -> nbformat.NotebookNode:
    """An unexecuted notebook for one percent-format source file."""
    nb = nbformat.v4.new_notebook()
    for c in parse_percent(Path(src_path).read_text(encoding="utf-8"), str(src_path)):
        if c.kind == "raw":
            raise ValueError(f"{src_path}: cell {c.index} is a raw cell; lectures have code and markdown cells only")
        make = nbformat.v4.new_markdown_cell if c.kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(c.source)
        cell.pop("id", None)
        nb.cells.append(cell)
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
    }
    nb.nbformat, nb.nbformat_minor = 4, 4  # no cell ids: stable diffs
    return nb


def execute(nb: nbformat.NotebookNode, timeout: int = 600, kernel_manager_class=None) -> nbformat.NotebookNode:
    """Run every cell in a fresh ``python3`` kernel started as Jupyter starts it: in ``lectures/``, with
    ``PYTHONPATH`` unset, so ``import lectures, reference`` must work through the installed (editable) course
    package and every data path through ``lectures._plots.ROOT``. Raises on the first cell error.
    ``kernel_manager_class``: nbclient's, when not its default (the tests fork their kernels: tests/kernel_forks.py)."""
    from nbclient import NotebookClient

    check_installed()
    extra = {"kernel_manager_class": kernel_manager_class} if kernel_manager_class is not None else {}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(LECTURES)}},
                            record_timing=False, allow_errors=False, **extra)
    with kernel_environment():
        client.execute()
    return coalesce_streams(nb)


@functools.cache
def check_installed() -> None:
    """Fail with the fix, before any kernel starts, when ``lectures`` does not import from ``lectures/`` without
    ``PYTHONPATH`` (the course is not installed editable into this interpreter's environment)."""
    with kernel_environment():
        res = subprocess.run([sys.executable, "-c", "import lectures"], cwd=LECTURES, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"`import lectures` fails in {LECTURES} with PYTHONPATH unset, so every lecture would fail "
                           f"in its first cell: install the course editable (`make setup`, or `{sys.executable} -m pip "
                           f"install --no-deps -e {ROOT}`).\n{res.stderr[-500:]}")


@contextlib.contextmanager
def kernel_environment():
    """``os.environ`` as a kernel started by ``jupyter lab`` sees it (no ``PYTHONPATH``; figures inline),
    restored afterwards (the kernel copies the environment when it starts)."""
    saved = dict(os.environ)
    os.environ.pop("PYTHONPATH", None)
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def coalesce_streams(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Merge each run of stream outputs of a cell into one stdout then one stderr output. The kernel flushes a
    cell's prints in chunks whose boundaries, and whose stdout/stderr interleaving, depend on timing, so
    without this a rebuild of an unchanged lecture differs in bytes."""
    for cell in nb.cells:
        if "outputs" not in cell:
            continue
        merged, run = [], {}
        for o in [*cell["outputs"], None]:
            if o is not None and o.get("output_type") == "stream":
                if o["name"] in run:
                    run[o["name"]]["text"] = "".join(run[o["name"]]["text"]) + "".join(o["text"])
                else:
                    run[o["name"]] = o
                continue
            merged += [run[n] for n in ("stdout", "stderr") if n in run]
            run = {}
            if o is not None:
                merged.append(o)
        cell["outputs"] = merged
    return nb


def select(names) -> list[Path]:
    sources = sorted(SRC.glob("[0-9][0-9]*_*.py"))
    if not names:
        return sources
    chosen = [p for p in sources if any(n in p.stem for n in names)]
    if not chosen:
        raise SystemExit(f"no lecture in {SRC} matches {names}; have {[p.stem for p in sources]}")
    return chosen


def build(src_path: Path, out_dir: Path = LECTURES, timeout: int = 600, kernel_manager_class=None) -> Path:
    nb = execute(to_notebook(src_path), timeout=timeout, kernel_manager_class=kernel_manager_class)
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
