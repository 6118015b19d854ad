"""The student release: ``python -m assignments.release [-o build/student-release]`` (``make student-release``).

What students get, and nothing that implements a graded function:

- ``lectures/*.ipynb``: the executed lecture notebooks (read with their outputs; re-running them needs the full
  repository, since they import the course's reference implementation), less the cell outputs that show code
  an assignment grades (``find_leaks``: lecture 05 prints the forward kernel's key-block step, the core of a3
  Parts 2-3), each replaced by a note; ``--exclude 05_triton_kernels`` leaves a whole lecture out;
- ``assignments/<aid>/<aid>.ipynb`` and its ``README.md``: the stub notebooks, as ``make assignments`` makes them;
- ``autograder/``: ``check()`` and what it needs to run a function on a case and judge the outputs, with the
  visible cases stored as files (inputs and expected outputs, ``autograder.visible.export``) instead of the
  specs, oracles and reference code that would make them; and ``make check``'s pytest tests of those cases
  on the student's own notebook (``autograder/tests_visible``, ``autograder/adapter.py``);
- ``README.md``, ``Makefile`` (``make check``), ``requirements.txt``, ``pyproject.toml`` (``pip install -e .``
  makes ``autograder`` importable).

Left out: ``reference/``, ``assignments/*/*_solution.py``, the autograder's specs, oracles, sandbox and
bundled submissions (correct ones included), the example notebook, lecture sources, tests, benchmarks, notes,
and whatever ``--exclude`` names (a lecture, ``05`` or ``05_triton_kernels``; an assignment, ``a6`` or
``a6_ring``). Written as a folder and as ``<folder>.tar.gz``.
"""
from __future__ import annotations

import argparse
import difflib
import gzip
import io
import json
import re
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
               # the host policy of Triton parts, and the given code it leaves as written
               "host_policy.py", "host_guard.py", "given.py",
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
Each assignment's README gives its points per function and an estimate of the time it takes.

The same visible cases run as pytest tests on your saved notebook, one marker per function:

```bash
make check ASSIGNMENT=a1_attention                   # every function of assignments/a1_attention/a1_attention.ipynb
make check ASSIGNMENT=a1_attention MARK=online_softmax SUBMISSION=my_copy.ipynb
```

Use `check(...)` while you write a function (in the notebook, on the code you just ran) and `make check` on
the saved file before you submit, or from an editor or a script (it runs the file's code cells in order, as
the grader does, so a cell that fails on a fresh run shows here too). A stub fails as "not implemented yet".

The lecture notebooks import the course's reference implementation, which is not part of this release: they
are here to be read, not re-run, and the file paths they mention (`reference/...`, `benchmarks/...`) are the
course repository's. A cell output that showed code an assignment asks you to write says "output removed".
'''


def build(out: Path, exclude=()) -> Path:
    """Write the release folder ``out`` and ``out.tar.gz``; return the archive's path. ``exclude``: lectures
    (``"05"``, ``"05_triton_kernels"``) and assignments (``"a6"``, ``"a6_ring"``) to leave out."""
    out = Path(out).resolve()
    if out == REPO or out in REPO.parents or out.parent == REPO:
        raise ValueError(f"out must be a folder of its own (e.g. build/student-release), not {out}")
    lectures, assignments = _select(exclude)
    if out.exists():
        shutil.rmtree(out)
    (out / "autograder").mkdir(parents=True)
    regions = solution_regions()
    for nb in lectures:
        dst = out / "lectures" / nb.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(strip_leaks(nb.read_text(), regions))
    order = []
    for aid in assignments:
        nb = REPO / "assignments" / aid / f"{aid}.ipynb"
        _copy(nb, out / "assignments" / aid / nb.name)
        _copy(REPO / "assignments" / aid / "README.md", out / "assignments" / aid / "README.md")
    for nb in lectures:
        order.append(f"- lecture `lectures/{nb.name}`")
        order += [f"- **assignment `assignments/{aid}/{aid}.ipynb`**" for aid in assignments
                  if _AFTER.get(aid) == nb.stem]
    order += [f"- **assignment `assignments/{aid}/{aid}.ipynb`**" for aid in assignments
              if _AFTER.get(aid) not in {nb.stem for nb in lectures}]
    for rel in CHECK_FILES:
        _copy(REPO / "autograder" / rel, out / "autograder" / rel)
    (out / "autograder" / "__init__.py").write_text(INIT)
    for given in sorted((REPO / "assignments" / "given").glob("*.py")):   # given.GIVEN_DIRS in the release
        _copy(given, out / "assignments" / "given" / given.name)
    sys.path.insert(0, str(REPO))
    from autograder.visible import export
    export(out / "autograder" / "visible")
    (out / "pyproject.toml").write_text(PYPROJECT)
    (out / "requirements.txt").write_text(REQUIREMENTS)
    (out / "Makefile").write_text(MAKEFILE)
    (out / "README.md").write_text(README.format(order="\n".join(order)))
    return _archive(out)


def _select(exclude):
    """The lecture notebooks and assignment ids left after ``exclude``; an unknown name is an error."""
    lectures = sorted((REPO / "lectures").glob("[0-9][0-9]_*.ipynb"))
    names = [nb.stem for nb in lectures] + list(ASSIGNMENTS)
    drop = set()
    for x in exclude:
        hit = [n for n in names if n == x or n.split("_")[0] == x]
        if not hit:
            raise ValueError(f"--exclude {x!r} names no lecture or assignment; expected one of {', '.join(names)} "
                             "(or the number / short id: 05, a6)")
        drop |= set(hit)
    return [nb for nb in lectures if nb.stem not in drop], [a for a in ASSIGNMENTS if a not in drop]


# --- graded code shown in what ships -------------------------------------------------------------------------
# A lecture may print a reference function (``inspect.getsource``) whose body is, up to names and spacing, the
# solution of a graded function or of one of its kernels. ``find_leaks`` compares every text that ships (cell
# sources and outputs, READMEs, .py files) line by line with the SOLUTION regions of the solution sources.
MATCH = 0.7         # a shipped line "is" a solution line at this difflib ratio (whitespace and comments removed)
MIN_LINES = 3       # a region counts from this many distinctive lines; a leak matches >= MIN_LINES of them ...
MIN_FRACTION = 0.5  # ... and at least this fraction
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+")
REMOVED = ("[output removed from the student release: it shows code that an assignment asks you to write "
           "({what}). The course repository's lecture has it.]\n")


def _norm(line: str) -> str:
    return re.sub(r"\s+", "", re.sub(r"(^|\s)#.*$", "", line))


def solution_regions() -> list:
    """``(aid, function, lines)`` for every SOLUTION region of every solution source: its normalised lines of
    at least 12 characters (``return o`` is no evidence)."""
    from .generate import BEGIN, END, _enclosing_name
    out = []
    for aid in ASSIGNMENTS:
        lines = (REPO / "assignments" / aid / f"{aid}_solution.py").read_text().split("\n")
        i = 0
        while i < len(lines):
            if lines[i].strip() == BEGIN:
                indent = len(lines[i]) - len(lines[i].lstrip())
                name = _enclosing_name(lines, i, indent)
                j = i + 1
                while lines[j].strip() != END:
                    j += 1
                body = [n for n in (_norm(x) for x in lines[i + 1:j]) if len(n) >= 12]
                if len(body) >= MIN_LINES:
                    out.append((aid, name, body))
                i = j
            i += 1
    return out


def find_leaks(text: str, regions) -> list:
    """``"aid:function (k of n lines)"`` for every region whose lines ``text`` matches (``MATCH``, ``MIN_LINES``,
    ``MIN_FRACTION``)."""
    lines = sorted({n for n in (_norm(x) for x in text.splitlines()) if len(n) >= 12})
    if not lines:
        return []
    index = {}
    for i, line in enumerate(lines):
        for tok in set(_TOKEN.findall(line)):
            index.setdefault(tok, set()).add(i)
    found = []
    for aid, name, body in regions:
        hits = 0
        for b in body:
            toks = set(_TOKEN.findall(b))
            count = {}
            for tok in toks:
                for i in index.get(tok, ()):
                    count[i] = count.get(i, 0) + 1
            sm = difflib.SequenceMatcher(None, b, "", autojunk=False)
            for i, c in count.items():
                if 2 * c < len(toks):
                    continue
                sm.set_seq2(lines[i])
                if sm.quick_ratio() >= MATCH and sm.ratio() >= MATCH:
                    hits += 1
                    break
        if hits >= MIN_LINES and hits >= MIN_FRACTION * len(body):
            found.append(f"{aid}:{name} ({hits} of {len(body)} lines)")
    return found


def notebook_texts(nb: dict):
    """``(where, text)`` for each cell source and each cell output of a notebook."""
    for i, c in enumerate(nb["cells"]):
        yield f"cell {i}", "".join(c["source"])
        for j, o in enumerate(c.get("outputs", [])):
            yield f"cell {i} output {j}", _output_text(o)


def _output_text(o: dict) -> str:
    data = o.get("data") or {}
    return "".join(o.get("text", "")) + "".join(data.get("text/plain", "")) + "".join(data.get("text/html", ""))


def strip_leaks(notebook: str, regions) -> str:
    """The notebook with every cell output that ``find_leaks`` flags replaced by the ``REMOVED`` note. A cell
    *source* that leaks is an error: a lecture that implements a graded function must be excluded instead."""
    nb = json.loads(notebook)
    for i, c in enumerate(nb["cells"]):
        bad = find_leaks("".join(c["source"]), regions)
        if bad:
            raise ValueError(f"lecture cell {i} implements graded code ({', '.join(bad)}): leave the lecture out "
                             "(--exclude) or change it")
        for j, o in enumerate(c.get("outputs", [])):
            bad = find_leaks(_output_text(o), regions)
            if bad:
                c["outputs"][j] = {"name": "stdout", "output_type": "stream",
                                   "text": REMOVED.format(what=", ".join(b.split(" (")[0] for b in bad))}
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


# each assignment comes after the lecture it needs (the reading path of the repository's README)
_AFTER = {"a1_attention": "01_softmax", "a2_flash_numpy": "04_backward_recomputation",
          "a3_triton": "05_triton_kernels", "a3b_triton_backward": "05_triton_kernels", "a4_decoding": "07_decoding",
          "a5_paged": "08_paged_attention", "a6_ring": "10_ring_attention"}


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
    p.add_argument("--exclude", action="append", default=[], metavar="NAME",
                   help="leave out a lecture (05 or 05_triton_kernels) or an assignment (a6 or a6_ring); repeatable, "
                        "or several names separated by commas or spaces")
    args = p.parse_args(argv)
    exclude = [x for arg in args.exclude for x in re.split(r"[,\s]+", arg) if x]
    path = build(Path(args.out), exclude)
    print(f"wrote {Path(args.out).resolve()}/ and {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
