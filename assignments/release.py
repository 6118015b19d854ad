"""The student release: ``python -m assignments.release [-o build/student-release]`` (``make student-release``).

What students get, and nothing that implements a graded function:

- ``lectures/*.ipynb``: the executed lecture notebooks (read with their outputs; re-running them needs the full
  repository, since they import the course's reference implementation);
- ``assignments/<aid>/<aid>.ipynb`` and its ``README.md``: the stub notebooks, as ``make assignments`` makes them;
- ``autograder/``: ``check()`` and what it needs to run a function on a case and judge the outputs, with the
  visible cases stored as files (inputs and expected outputs, ``autograder.visible.export``) instead of the
  specs, oracles and reference code that would make them; and ``make check``'s pytest tests of those cases
  on the student's own notebook (``autograder/tests_visible``, ``autograder/adapter.py``);
- ``README.md``, ``Makefile`` (``make check``), ``requirements.txt``, ``pyproject.toml`` (``pip install -e .``
  makes ``autograder`` importable).

Left out: ``reference/``, ``assignments/*/*_solution.py``, the autograder's specs, oracles, sandbox and
bundled submissions (correct ones included), the example notebook, lecture sources, tests, benchmarks, notes.
Written as a folder and as ``<folder>.tar.gz``.
"""
from __future__ import annotations

import argparse
import gzip
import io
import shutil
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ASSIGNMENTS = ("a1_attention", "a2_flash_numpy", "a3_triton", "a3b_triton_backward", "a4_decoding", "a5_paged",
               "a6_ring")
# the part of the autograder that check() imports: running a call, judging outputs, the case data classes
CHECK_FILES = ("check.py", "visible.py", "evaluate.py", "compare.py", "runner.py", "allocator_check.py", "where.py",
               "specs/__init__.py", "specs/_base.py",
               # make check: the visible cases as pytest tests on the student's own notebook
               "adapter.py", "submission.py", "percent.py", "load_errors.py",
               "tests_visible/__init__.py", "tests_visible/conftest.py", "tests_visible/test_visible.py")

INIT = '''"""The in-notebook checker of the attention course (student release).

    from autograder.check import check
    check("a1.safe_softmax", safe_softmax)   # runs the visible cases, prints one row per case

The visible cases (inputs and expected outputs) are stored in ``autograder/visible/``; grading, with hidden
cases, happens on the course's grader.
"""
'''

PYPROJECT = '''[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "attention-course-student"
version = "0.1.0"
requires-python = ">=3.10"
dependencies = ["numpy>=1.26"]

[tool.setuptools.packages.find]
include = ["autograder*"]

[tool.setuptools.package-data]
"*" = ["*.json", "*.npz"]
'''

REQUIREMENTS = '''numpy>=1.26
torch>=2.4
triton>=3.2; platform_system == "Linux"
matplotlib>=3.8
jupyter
ipykernel
pytest
'''

MAKEFILE = '''# make check ASSIGNMENT=a1_attention [SUBMISSION=path/to/notebook.ipynb] [MARK=online_softmax]
PY ?= .venv/bin/python

.PHONY: check lab
check:
\t$(PY) -m pytest autograder/tests_visible -q -p no:cacheprovider \\
\t\t--assignment $(or $(ASSIGNMENT),$(error give ASSIGNMENT=a1_attention (and SUBMISSION=..., MARK=...))) \\
\t\t$(if $(SUBMISSION),--submission "$(SUBMISSION)") $(if $(MARK),-m "$(MARK)")

lab:
\t.venv/bin/jupyter lab
'''

README = '''# Fast attention, from NumPy to PagedAttention (student release)

Lectures (executed notebooks: read them with their outputs) and the assignments (notebooks with a function
to write under each heading and a `check(...)` cell that runs that function's visible cases).

## Setup

```bash
python3 -m venv .venv
.venv/bin/pip install -r requirements.txt   # on a laptop without a GPU, first:
                                            #   .venv/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch
.venv/bin/pip install -e .                  # makes `from autograder.check import check` work in the notebooks
.venv/bin/jupyter lab
```

## Order

{order}

`check()` compares your outputs with stored expected outputs (computed in float64) and prints one row per
case; it never raises. Grading runs hidden cases of the same kinds, plus speed on a GPU for assignments 3-5.

The same visible cases run as pytest tests on your saved notebook, one marker per function:

```bash
make check ASSIGNMENT=a1_attention                   # every function of assignments/a1_attention/a1_attention.ipynb
make check ASSIGNMENT=a1_attention MARK=online_softmax SUBMISSION=my_copy.ipynb
```

Use `check(...)` while you write a function (in the notebook, on the code you just ran) and `make check` on
the saved file before you submit, or from an editor or a script (it runs the file's code cells in order, as
the grader does, so a cell that fails on a fresh run shows here too). A stub fails as "not implemented yet".
The lecture notebooks import the course's reference implementation, which is not part of this release: they
are here to be read, not re-run.
'''


def build(out: Path) -> Path:
    """Write the release folder ``out`` and ``out.tar.gz``; return the archive's path."""
    out = Path(out).resolve()
    if out == REPO or out in REPO.parents or out.parent == REPO:
        raise ValueError(f"out must be a folder of its own (e.g. build/student-release), not {out}")
    if out.exists():
        shutil.rmtree(out)
    (out / "autograder").mkdir(parents=True)
    lectures = sorted((REPO / "lectures").glob("[0-9][0-9]_*.ipynb"))
    for nb in lectures:
        _copy(nb, out / "lectures" / nb.name)
    order = []
    for aid in ASSIGNMENTS:
        nb = REPO / "assignments" / aid / f"{aid}.ipynb"
        _copy(nb, out / "assignments" / aid / nb.name)
        _copy(REPO / "assignments" / aid / "README.md", out / "assignments" / aid / "README.md")
    for nb in lectures:
        order.append(f"- lecture `lectures/{nb.name}`")
        order += [f"- **assignment `assignments/{aid}/{aid}.ipynb`**" for aid in ASSIGNMENTS
                  if _AFTER.get(aid) == nb.stem]
    order += [f"- **assignment `assignments/{aid}/{aid}.ipynb`**" for aid in ASSIGNMENTS
              if _AFTER.get(aid) not in {nb.stem for nb in lectures}]
    for rel in CHECK_FILES:
        _copy(REPO / "autograder" / rel, out / "autograder" / rel)
    (out / "autograder" / "__init__.py").write_text(INIT)
    sys.path.insert(0, str(REPO))
    from autograder.visible import export
    export(out / "autograder" / "visible")
    (out / "pyproject.toml").write_text(PYPROJECT)
    (out / "requirements.txt").write_text(REQUIREMENTS)
    (out / "Makefile").write_text(MAKEFILE)
    (out / "README.md").write_text(README.format(order="\n".join(order)))
    return _archive(out)


# each assignment comes after the lecture it needs (the reading path of the repository's README)
_AFTER = {"a1_attention": "01_softmax", "a2_flash_numpy": "04_backward_recomputation",
          "a3_triton": "05_triton_kernels", "a3b_triton_backward": "05_triton_kernels", "a4_decoding": "07_decoding", "a5_paged": "08_paged_attention",
          "a6_ring": "10_ring_attention"}


def _copy(src: Path, dst: Path):
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _archive(folder: Path) -> Path:
    path = folder.with_name(folder.name + ".tar.gz")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(folder.rglob("*")):
            if p.is_dir():
                continue
            info = tarfile.TarInfo(str(Path(folder.name) / p.relative_to(folder)))
            data = p.read_bytes()
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m assignments.release", description=__doc__.splitlines()[0])
    p.add_argument("-o", "--out", default=str(REPO / "build" / "student-release"),
                   help="release folder to (re)write; the archive is written next to it as <folder>.tar.gz")
    args = p.parse_args(argv)
    path = build(Path(args.out))
    print(f"wrote {Path(args.out).resolve()}/ and {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
