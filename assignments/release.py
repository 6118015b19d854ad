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
- ``quizzes/NN_topic.md``: each lecture's quiz questions (the answers stay in ``docs/quizzes/answers.md``);
- ``README.md``, ``FILES.md`` (every shipped file and what it is for), ``Makefile`` (``make check``),
  ``requirements.txt``, ``pyproject.toml`` (``pip install -e .`` makes ``autograder`` importable).

a7 (``LEFT_OUT``) does not ship: its ``check()`` needs the grader's compile checks and mbarrier model, which
hold its answers; the parities a7 grades are also replaced by a note wherever a shipped lecture shows them
(``redact_answers``: lecture 6 §10 prints the kernel's barrier waits).

Left out: ``reference/``, ``assignments/*/*_solution.py``, the autograder's specs, oracles, sandbox and
bundled submissions (correct ones included), the example notebook, lecture sources, tests, benchmarks, notes,
docs (quiz answers, the common-bugs guide), and whatever ``--exclude`` names (a lecture, ``05`` or
``05_triton_kernels``; an assignment, ``a6`` or ``a6_ring``). ``python -m assignments.release`` prints each of
these with the reason (``left_out``). Written as a folder and as ``<folder>.tar.gz``.
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
#: in the repository, not in the release, and why (``make student-release`` prints it)
LEFT_OUT = {"a7_gluon": "optional Hopper assignment, instructor-only: its check() needs the grader's compile checks "
                        "and mbarrier model, which hold its answers; hand out assignments/a7_gluon/ yourself and "
                        "grade it on the course's machine (README of a7)"}
ALWAYS_LEFT_OUT = (
    ("reference/", "the course's implementation of every graded function"),
    ("assignments/*/*_solution.py", "the solutions the stub notebooks are generated from"),
    ("autograder/specs/<aid>.py, oracles.py, engine.py, sandbox.py, ...", "the grader: hidden cases, oracles, "
     "sandbox (check() gets the visible cases as stored files instead)"),
    ("autograder/submissions/, autograder/examples/", "the grader's zoo of correct, wrong and cheating "
     "submissions and the example notebook: solutions"),
    ("lectures/src/", "the lectures' sources (the executed notebooks ship)"),
    ("docs/quizzes/answers.md", "the quizzes' answers (instructor-only)"),
    ("docs/ (syllabus, common bugs, design, results), notes/", "instructor and developer documents"),
    ("tests/, benchmarks/, experiments/", "the course's own tests and measurements"),
)
QUIZZES = REPO / "docs" / "quizzes"

# the part of the autograder that check() imports: running a call, judging outputs, the case data classes
CHECK_FILES = ("check.py", "visible.py", "evaluate.py", "compare.py", "runner.py", "allocator_check.py", "where.py",
               "specs/__init__.py", "specs/_base.py",
               # make check: the visible cases as pytest tests on the student's own notebook
               "adapter.py", "submission.py", "percent.py", "load_errors.py", "isolated.py", "check_worker.py",
               "diagnose.py",
               "threats.py",
               # the host policy of Triton parts, and the given code it leaves as written
               "host_policy.py", "host_guard.py", "host_rules.py", "given.py",
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
Each lecture has a short quiz in `quizzes/` (your instructor has the answers). `FILES.md` says what every
file here is for.
'''


def build(out: Path, exclude=(), report: list | None = None) -> Path:
    """Write the release folder ``out`` and ``out.tar.gz``; return the archive's path. ``exclude``: lectures
    (``"05"``, ``"05_triton_kernels"``) and assignments (``"a6"``, ``"a6_ring"``) to leave out. ``report``: a
    list that gets ``(what, why)`` for everything left out or changed (``left_out``)."""
    report = [] if report is None else report
    out = Path(out).resolve()
    if out == REPO or out in REPO.parents or out.parent == REPO:
        raise ValueError(f"out must be a folder of its own (e.g. build/student-release), not {out}")
    lectures, assignments = _select(exclude)
    if out.exists():
        shutil.rmtree(out)
    (out / "autograder").mkdir(parents=True)
    regions = solution_regions()
    answers = answer_patterns()
    report += left_out(exclude)
    for nb in lectures:
        dst = out / "lectures" / nb.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        notes = []
        dst.write_text(strip_leaks(nb.read_text(), regions, answers, notes))
        report += [(f"lectures/{nb.name}: {n}", why) for n, why in notes]
    for q in sorted(QUIZZES.glob("[0-9][0-9]*_*.md")):
        if any(q.stem == nb.stem for nb in lectures):
            _copy(q, out / "quizzes" / q.name)
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
    export(out / "autograder" / "visible", assignments=assignments)
    (out / "pyproject.toml").write_text(PYPROJECT)
    (out / "requirements.txt").write_text(REQUIREMENTS)
    (out / "Makefile").write_text(MAKEFILE)
    (out / "README.md").write_text(README.format(order="\n".join(order)))
    (out / "FILES.md").write_text(files_md(out))
    return _archive(out)


def left_out(exclude=()) -> list:
    """``(what, why)`` for what the release never ships, what ``LEFT_OUT`` keeps back and what ``exclude``
    names."""
    items = list(ALWAYS_LEFT_OUT)
    items += [(f"assignments/{aid}/", why) for aid, why in LEFT_OUT.items()]
    lectures, assignments = _select(exclude)
    items += [(f"lectures/{nb.name}", "--exclude / EXCLUDE") for nb in
              sorted((REPO / "lectures").glob("[0-9][0-9]_*.ipynb")) if nb not in lectures]
    items += [(f"assignments/{aid}/", "--exclude / EXCLUDE") for aid in ASSIGNMENTS if aid not in assignments]
    return items


def _first_sentence(text: str) -> str:
    """A docstring's first paragraph, cut after its first sentence when it is long."""
    text = " ".join(text.split("\n\n")[0].split())
    text = re.sub(r"\s*\([^()]*(?:docs|notes)/[^()]*\)", "", text)   # the repository's documents do not ship
    m = re.match(r"(.{40,}?\.)(\s|$)", text)
    return m.group(1) if m and len(text) > 200 else text


def describe(rel: str, folder: Path) -> str | None:
    """What the shipped file ``rel`` is for, or None for a file no rule covers (a test keeps that at none)."""
    import ast
    p = folder / rel
    parts = rel.split("/")
    if rel == "README.md":
        return "start here: setup, the order of lectures and assignments, how check() and make check work"
    if rel == "FILES.md":
        return "this list: every file of the release and what it is for"
    if rel == "Makefile":
        return "`make check ASSIGNMENT=...` (the visible cases as pytest tests on your notebook), `make lab`"
    if rel == "requirements.txt":
        return "the Python packages the notebooks and check() need (`pip install -r requirements.txt`)"
    if rel == "pyproject.toml":
        return "makes `autograder` importable (`pip install -e .`), so that `from autograder.check import check` works"
    if parts[0] == "lectures" and rel.endswith(".ipynb"):
        nb = json.loads(p.read_text())
        title = next((l.lstrip("# ").strip() for c in nb["cells"] if c["cell_type"] == "markdown"
                      for l in "".join(c["source"]).splitlines() if l.startswith("# ")), parts[1])
        return f"lecture {parts[1].split('_')[0]}, executed (read it with its outputs): {title}"
    if parts[0] == "quizzes":
        return f"quiz questions of lecture {parts[1].split('_')[0]} (your instructor has the answers)"
    if parts[:2] == ["assignments", "given"]:
        return ("the index of the given code" if rel.endswith("README.md") else
                f"given code ({parts[2]}): the body of a notebook's given cell, which check() and the host policy "
                "of Triton parts recognise as the course's own code, not yours")
    if parts[0] == "assignments" and rel.endswith(".ipynb"):
        return f"assignment {parts[1]}: the notebook you complete (a stub under each heading, a check() cell under it)"
    if parts[0] == "assignments" and rel.endswith("README.md"):
        return f"assignment {parts[1]}: what to implement, points per function, estimated time"
    if parts[:2] == ["autograder", "visible"]:
        what = "the index of tasks" if parts[2] == "index.json" else f"{parts[2].split('.')[0]}'s visible cases " \
            f"({'inputs and expected outputs' if parts[2].endswith('.npz') else 'what each case calls and how it is judged'})"
        return f"check()'s stored visible cases: {what}"
    if rel.endswith(".py"):
        doc = ast.get_docstring(ast.parse(p.read_text()))
        return _first_sentence(doc) if doc else None
    return None


def files_md(folder: Path) -> str:
    """``FILES.md``: one row per shipped file with ``describe``'s line; a file no rule covers is an error."""
    rows = []
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            rel = str(p.relative_to(folder))
            what = "this list: every file of the release and what it is for" if rel == "FILES.md" else describe(rel, folder)
            if what is None:
                raise ValueError(f"the release ships {rel} but no rule of assignments.release.describe says what it is for")
            rows.append(f"| `{rel}` | {what.replace('|', '/')} |")
    rows.insert(0, "| `FILES.md` | this list: every file of the release and what it is for |")
    return ("# What each file of the student release is for\n\n| file | what it is for |\n|---|---|\n" +
            "\n".join(dict.fromkeys(rows)) + "\n")


def _select(exclude):
    """The lecture notebooks and assignment ids left after ``exclude``; an unknown name is an error."""
    lectures = sorted(p for p in (REPO / "lectures").glob("[0-9][0-9]*_*.ipynb") if re.match(r"\d\d[a-z]?_", p.name))
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
    at least 12 characters (``return o`` is no evidence). An ungraded warm-up (``assignments.WARMUP``: the
    function and its kernel ``_<name>_kernel``) is left out: lecture 5a teaches the same few lines on purpose."""
    from . import WARMUP
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
                warmup = {w for n in WARMUP.get(aid, ()) for w in (n, f"_{n}_kernel")}
                if len(body) >= MIN_LINES and name not in warmup:
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


def strip_leaks(notebook: str, regions, answers=(), notes: list | None = None) -> str:
    """The notebook with every cell output that ``find_leaks`` flags replaced by the ``REMOVED`` note, and every
    expression an ``answers`` pattern matches in a cell or an output replaced by ``ANSWER_NOTE`` (the release's
    lectures are read, not re-run). A cell source that ``find_leaks`` flags is an error: a lecture that implements
    a graded function must be excluded or changed instead. ``notes`` gets ``(what, why)`` per change."""
    nb = json.loads(notebook)
    notes = [] if notes is None else notes
    for i, c in enumerate(nb["cells"]):
        src = "".join(c["source"])
        bad = find_leaks(src, regions)
        if bad:
            raise ValueError(f"lecture cell {i} implements graded code ({', '.join(bad)}): leave the lecture out "
                             "(--exclude) or change it")
        if answers:
            new, n = redact_answers(src, answers)
            if n:
                c["source"] = new.splitlines(True)
                notes.append((f"cell {i}: {n} expression(s) replaced", "a parity that a7 grades"))
        for j, o in enumerate(c.get("outputs", [])):
            bad = find_leaks(_output_text(o), regions)
            if bad:
                c["outputs"][j] = {"name": "stdout", "output_type": "stream",
                                   "text": REMOVED.format(what=", ".join(b.split(" (")[0] for b in bad))}
                notes.append((f"cell {i}: output removed", f"it shows code an assignment grades ({', '.join(bad)})"))
            elif answers:
                n = _redact_output(c["outputs"][j], answers)
                if n:
                    notes.append((f"cell {i} output: {n} expression(s) replaced", "a parity that a7 grades"))
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


# --- a7's answers: one-line parity expressions --------------------------------------------------------------
# a7's graded functions are single expressions (a parity of a tile or round index), too short for find_leaks'
# line matching. ``answer_patterns`` turns each into a regular expression in which any name, or any
# parenthesised term, may stand for a name (lecture 6 prints them as ``((r0 + j) & 1) ^ (1 - WG)``), and the
# release replaces each match in lecture cells and outputs by ``ANSWER_NOTE``.
ANSWER_AIDS = ("a7_gluon",)
ANSWER_NOTE = "[a7 asks for this parity]"
_OPERAND = r"(?:[A-Za-z_]\w*|\([^()\n]*\))"


def answer_patterns(aids=ANSWER_AIDS) -> list:
    """Compiled patterns of the ``return EXPR`` one-line SOLUTION regions of ``aids`` whose ``EXPR`` is integer
    arithmetic (no call), longest first (an expression may contain a shorter one)."""
    from .generate import BEGIN, END
    exprs = []
    for aid in aids:
        lines = (REPO / "assignments" / aid / f"{aid}_solution.py").read_text().split("\n")
        for i, line in enumerate(lines):
            if line.strip() == BEGIN and lines[i + 2].strip() == END:
                m = re.fullmatch(r"\s*return\s+(.+?)\s*", lines[i + 1])
                if m and not re.search(r"\w\s*\(", m.group(1)):
                    exprs.append(m.group(1))
    out = []
    for e in sorted(set(exprs), key=len, reverse=True):
        toks = re.findall(r"[A-Za-z_]\w*|\d+|//|\S", e)
        out.append(re.compile(r"\s*".join(_OPERAND if re.match(r"[A-Za-z_]", t) else re.escape(t) for t in toks)))
    return out


def redact_answers(text: str, answers) -> tuple[str, int]:
    """``text`` with every match of ``answers`` replaced by ``ANSWER_NOTE``, and the number replaced."""
    n = 0
    for pat in answers:
        text, k = pat.subn(ANSWER_NOTE, text)
        n += k
    return text, n


def _redact_output(o: dict, answers) -> int:
    n = 0
    if "text" in o:
        new, n = redact_answers("".join(o["text"]), answers)
        o["text"] = new.splitlines(True)
    for kind in ("text/plain", "text/html", "text/markdown"):
        if kind in (o.get("data") or {}):
            new, k = redact_answers("".join(o["data"][kind]), answers)
            o["data"][kind] = new.splitlines(True)
            n += k
    return n


# each assignment comes after the lecture it needs (the reading path of the repository's README)
_AFTER = {"a1_attention": "01_softmax", "a2_flash_numpy": "04_backward_recomputation",
          "a3_triton": "05b_profiling", "a3b_triton_backward": "05b_profiling", "a4_decoding": "07_decoding",
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
    report = []
    path = build(Path(args.out), exclude, report)
    print(f"wrote {Path(args.out).resolve()}/ and {path}")
    print("left out or changed, and why:")
    for what, why in report:
        print(f"  {what}: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
