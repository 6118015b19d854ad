"""The student release (``make student-release``): lectures, stub notebooks, check() with stored visible cases,
and no implementation of any graded function (no solution, no reference, no bundled correct submission, no
example notebook, no lecture output that prints graded code); READMEs and assignment notebooks cite only files
that ship; ``--exclude`` leaves lectures or assignments out. check() in the release passes the solutions and
reports the stubs as not implemented."""
import ast
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from assignments.release import (ANSWER_NOTE, ASSIGNMENTS, LEFT_OUT, answer_patterns, build, find_leaks,
                                 notebook_texts, redact_answers, solution_regions)
from autograder import specs
from autograder.percent import parse_percent

pytestmark = pytest.mark.assignments
REPO = Path(__file__).resolve().parent.parent
GRADED = sorted({t.name for aid in ASSIGNMENTS for t in specs.load(aid).tasks.values()})


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("rel") / "student-release"
    archive = build(out)
    return out, archive


def _implementations(source: str, where: str) -> list:
    """Definitions of graded names that are not stubs: a stub raises NotImplementedError, or only wraps a
    definition of the same source that does."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [f"{where}: {m.group(0)}" for m in re.finditer(r"^(?:def|class)\s+(\w+)", source, re.M)
                if m.group(1) in GRADED]
    def raises(node):
        return any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n) for n in ast.walk(node))
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    stubs = {n.name for n in defs if raises(n)}
    found = []
    for node in defs:
        if node.name not in GRADED or node.name in stubs:
            continue
        # a given wrapper around a stub (flash_attention -> FlashAttention.apply) is a stub too
        if not {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & stubs:
            found.append(f"{where}: {node.name}")
    return found


def _scan(folder: Path) -> list:
    found = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.suffix == ".py":
            found += _implementations(p.read_text(), str(rel))
        elif p.suffix == ".ipynb":
            for i, c in enumerate(json.loads(p.read_text())["cells"]):
                if c["cell_type"] != "code":
                    continue
                src = "".join(c["source"])
                found += _implementations("\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!"))),
                                          f"{rel} cell {i}")
                for o in c.get("outputs", []):   # printed source code counts too
                    text = "".join(o.get("text", "")) + "".join((o.get("data") or {}).get("text/plain", ""))
                    found += [f"{rel} cell {i} output: {m.group(0)}" for m in
                              re.finditer(r"(?:def|class)\s+(\w+)", text) if m.group(1) in GRADED]
    return found


def test_release_holds_what_students_need_and_no_graded_implementation(release):
    out, archive = release
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    for aid in ASSIGNMENTS:
        assert f"assignments/{aid}/{aid}.ipynb" in files and f"assignments/{aid}/README.md" in files
    assert {"README.md", "requirements.txt", "pyproject.toml", "autograder/check.py",
            "autograder/visible/index.json"} <= files
    lectures = sorted(p.name for p in (REPO / "lectures").glob("[0-9][0-9]*_*.ipynb"))
    assert lectures and all(f"lectures/{n}" in files for n in lectures)
    assert {"lectures/05a_triton_primer.ipynb", "lectures/05b_profiling.ipynb"} <= files   # lettered lectures ship
    banned = re.compile(r"(^reference/|_solution\.py$|submissions/|examples/|oracles\.py$|^lectures/src/|"
                        r"^tests/|^benchmarks/|specs/a\d\w*_\w+\.py$|sandbox\.py$|engine\.py$)")
    assert not [f for f in files if banned.search(f)]
    assert _scan(out) == []
    with tarfile.open(archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames()}
    assert names == files


def _shipped_texts(folder: Path):
    """``(where, text)`` for everything a student reads in the release: notebook cells and outputs, READMEs,
    code."""
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.suffix == ".ipynb":
            for where, text in notebook_texts(json.loads(p.read_text())):
                yield f"{rel} {where}", text
        elif p.suffix in (".py", ".md", ".txt", ".toml"):
            yield str(rel), p.read_text()


def test_release_shows_no_graded_code(release):
    """No cell output, cell, README or module of the release shows a graded function's solution, up to names,
    spacing and comments (``find_leaks`` against every SOLUTION region). Lecture 05's printout of the forward
    kernel's key-block step (the core of a3 Parts 2-3) would show it: the release replaces it by a
    note."""
    out, _ = release
    regions = solution_regions()
    leaks = [f"{where}: {hit}" for where, text in _shipped_texts(out) for hit in find_leaks(text, regions)]
    assert leaks == []
    # independent of the matcher: no line run of the reference's key-block step ships
    import reference.triton.flash_fwd as ff
    import inspect
    for fn in (ff.attend_key_block, ff.mask_running_max):
        body = inspect.getsource(getattr(fn, "fn", fn)).split('"""')[2]
        lines = [l.strip() for l in body.splitlines() if len(l.strip()) > 20 and not l.strip().startswith("#")]
        assert len(lines) >= 4
        for where, text in _shipped_texts(out):
            assert sum(l in text for l in lines) < 3, (fn.__name__, where)
    lec = json.loads((out / "lectures" / "05_triton_kernels.ipynb").read_text())
    assert any("output removed from the student release" in "".join(o.get("text", ""))
               for c in lec["cells"] for o in c.get("outputs", []))


def test_the_leak_scan_finds_solution_code():
    """Positive controls: the repository's lecture 05 (as it ships without stripping) and reference modules that
    implement graded functions in their own words are flagged; a stub notebook is not."""
    regions = solution_regions()
    lec = json.loads((REPO / "lectures" / "05_triton_kernels.ipynb").read_text())
    hits = [h for _, text in notebook_texts(lec) for h in find_leaks(text, regions)]
    assert any(h.startswith("a3_triton:_fwd_block") for h in hits), hits
    for path, what in (("reference/numpy/flash.py", "a2_flash_numpy:flash_attention_forward"),
                       ("reference/triton/fused_softmax.py", "a3_triton:_softmax_kernel"),
                       ("reference/numpy/ring.py", "a6_ring:ring_step"),
                       ("reference/triton/decode.py", "a4_decoding:_decode_split_kernel")):
        assert any(h.startswith(what) for h in find_leaks((REPO / path).read_text(), regions)), path
    stub = json.loads((REPO / "assignments" / "a3_triton" / "a3_triton.ipynb").read_text())
    assert not [h for _, text in notebook_texts(stub) for h in find_leaks(text, regions)]


def test_exclude_leaves_out_lectures_and_assignments(tmp_path):
    out = tmp_path / "rel"
    build(out, exclude=["05_triton_kernels", "a6"])
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert "lectures/05_triton_kernels.ipynb" not in files and "lectures/04_backward_recomputation.ipynb" in files
    assert not [f for f in files if f.startswith("assignments/a6_ring/")]
    readme = (out / "README.md").read_text()
    assert "05_triton_kernels" not in readme and "a6_ring" not in readme and "a3_triton.ipynb" in readme
    with pytest.raises(ValueError, match="names no lecture or assignment"):
        build(tmp_path / "x", exclude=["99_nothing"])
    p = subprocess.run([sys.executable, "-m", "assignments.release", "-o", str(tmp_path / "cli"), "--exclude",
                        "05,a6"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "cli" / "lectures" / "05_triton_kernels.ipynb").exists()
    assert "EXCLUDE" in (REPO / "Makefile").read_text()


_EXT = r"(?:py|md|ipynb|json|txt|toml|csv|png|npz|zip|gz|sh|cfg|yaml|yml)"
_PATH = re.compile(r"^(?:\.{1,2}/)?[\w.\-]+(?:/[\w.\-]+)*(?:\.%s|/)$" % _EXT)


def _file_references(text: str) -> set:
    """Relative file references in markdown: link targets, and `code` spans that look like a path (a folder
    with a trailing slash or a file with a known extension; globs and placeholders like <aid> are skipped)."""
    out = {m.group(1) for m in re.finditer(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text)}
    for m in re.finditer(r"`([^`\n]+)`", text):
        for part in re.split(r"[\s,;()]+", m.group(1)):
            if _PATH.match(part) and ("/" in part or re.match(r"^[\w.\-]+\.%s$" % _EXT, part)):
                out.add(part)
    out |= {m.group(1) for m in re.finditer(r"(?<![\w/`.])((?:[\w\-]+/)+[\w\-]+\.%s)\b" % _EXT, text)}
    return {r for r in out if not r.startswith(("http", "/", "mailto")) and "*" not in r and "<" not in r}


def test_shipped_readmes_and_assignment_notebooks_reference_only_shipped_files(release):
    """Every relative path a shipped README or assignment notebook cites exists in the release (relative to the
    citing file or to the release's root): an assignment README must not cite autograder/specs/<aid>.py, nor
    the a1/a2 notebooks docs/design.md. (The lectures are executed notebooks of
    the course repository, read as they are; the release README says their paths are the repository's.)"""
    out, _ = release
    missing = []
    for p in sorted(out.rglob("*")):
        if p.suffix == ".md":
            text = p.read_text()
        elif p.suffix == ".ipynb" and p.parts[-3] == "assignments":
            text = "\n".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"])
        else:
            continue
        for ref in sorted(_file_references(text)):
            if not ((p.parent / ref).exists() or (out / ref).exists()):
                missing.append(f"{p.relative_to(out)}: {ref}")
    assert missing == []
    assert _file_references("see `autograder/specs/a1_attention.py` and [x](../docs/design.md#s)") == \
        {"autograder/specs/a1_attention.py", "../docs/design.md"}


def test_assignment_readme_point_tables_match_the_specs():
    """Each assignment README states its points per graded function (required, GPU-only, bonus) as a table; the
    numbers are the spec's."""
    for aid in ASSIGNMENTS:
        spec = specs.load(aid)
        want = {}
        for t in spec.tests:
            key = (spec.tasks[t.task].name, bool(t.optional))
            pts, gpu = want.get(key, (0, 0))
            want[key] = (pts + t.points, gpu + (t.points if t.gpu_only else 0))
        text = (REPO / "assignments" / aid / "README.md").read_text()
        got = {(m[1], bool(m[2])): (int(m[3]), 0 if m[4] == "-" else int(m[4])) for m in
               re.finditer(r"^\| `(\w+)`( \(bonus\))? \| (\d+) \| (\d+|-) \|$", text, re.M)}
        assert got == want, aid
        total = re.search(r"^\| \*\*required\*\* \| \*\*(\d+)\*\* \|", text, re.M)
        assert total and int(total[1]) == sum(p for (_, opt), (p, _) in want.items() if not opt), aid


def test_the_scan_finds_implementations():
    """Positive controls: the scan flags a solution, a reference module and a bundled correct submission."""
    sol = REPO / "assignments" / "a1_attention" / "a1_attention_solution.py"
    assert {"safe_softmax", "attention"} <= {x.split(": ")[1] for x in _implementations(sol.read_text(), "s")}
    own = REPO / "autograder" / "submissions" / "a2_flash_numpy" / "correct"
    assert any(_implementations(p.read_text(), p.name) for p in own.glob("*.py"))
    assert _implementations((REPO / "reference" / "numpy" / "softmax.py").read_text(), "ref")
    stub = REPO / "assignments" / "a1_attention" / "a1_attention.ipynb"
    assert _implementations("def safe_softmax(x):\n    return x\n", "x") and \
        not _implementations("def safe_softmax(x):\n    raise NotImplementedError('Implement')\n", "x")
    assert stub.exists()


CHECK = r"""
import json, sys
import autograder, autograder.check as c
assert autograder.__file__.startswith(sys.argv[1]), autograder.__file__     # the release's own package
ns = {}
exec(compile(open(sys.argv[2]).read(), "solution", "exec"), ns)
out = {}
for task, name in json.loads(sys.argv[3]):
    out[task] = c.check(task, ns[name], verbose=False)
def stub(*a, **k):
    raise NotImplementedError("Implement")
out["stub"] = [r[2][2] for r in c.run_visible("a1.attention", stub)]
print(json.dumps(out))
"""


def test_release_check_passes_solutions_and_reports_stubs(release, tmp_path):
    out, _ = release
    cases = {"a1_attention": [["a1.safe_softmax", "safe_softmax"], ["a1.online_softmax", "online_softmax"],
                              ["a1.merge_states", "merge_states"], ["a1.attention", "attention"]],
             "a5_paged": [["a5.BlockAllocator", "BlockAllocator"], ["a5.paged_attention", "paged_attention"]],
             # Triton in the interpreter; stored lse with -inf rows; an autograd call on a given torch forward
             "a3b_triton_backward": [["a3b.flash_bwd_dq", "flash_bwd_dq"], ["a3b.flash_attention", "flash_attention"]]}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(out)
    for aid, tasks in cases.items():
        # the solution without its own check() calls (they would print and re-run the same cases)
        path = REPO / "assignments" / aid / f"{aid}_solution.py"
        cells = parse_percent(path.read_text(), str(path))  # with the given cells filled in
        src = "\n\n".join(c.source for c in cells if c.kind == "code")
        sol = tmp_path / f"{aid}.py"
        sol.write_text("\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("check(", "from autograder"))))
        p = subprocess.run([sys.executable, "-c", CHECK, str(out), str(sol), json.dumps(tasks)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        res = json.loads(p.stdout.strip().splitlines()[-1])
        assert all(res[t] is True for t, _ in tasks), res
        assert res["stub"] and set(res["stub"]) == {"not implemented yet"}


MAKE_CHECK = r"""
import sys
import pytest
rc = pytest.main(sys.argv[2:])
import autograder
assert autograder.__file__.startswith(sys.argv[1]), autograder.__file__     # the release's own package
print("RC", int(rc))
"""


def test_make_check_in_the_release_fails_stubs_and_passes_the_solution(release, tmp_path):
    """``make check``: the visible cases as pytest tests on the student's own file, one marker per
    function; shipped in the release and run there with ``reference`` unimportable."""
    out, _ = release
    assert (out / "Makefile").read_text().count("autograder/tests_visible") == 1
    noref = tmp_path / "noref" / "reference"
    noref.mkdir(parents=True)
    (noref / "__init__.py").write_text("raise ImportError('reference/ is not part of the student release')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ASSIGNMENT", "SUBMISSION")}
    env["PYTHONPATH"] = str(noref.parent)
    path = REPO / "assignments" / "a1_attention" / "a1_attention_solution.py"
    sol = tmp_path / "a1_solved.py"           # the solution as a student's .py: given cells filled in
    sol.write_text("\n\n".join(("# %% tags=" + json.dumps(c.tags) if c.tags else "# %%") + "\n" + c.source
                               for c in parse_percent(path.read_text(), str(path)) if c.kind == "code") + "\n")

    def run(*args):
        p = subprocess.run([sys.executable, "-c", MAKE_CHECK, str(out), "autograder/tests_visible", "-q",
                            "-p", "no:cacheprovider", "--assignment", "a1", *args], cwd=out, env=env,
                           capture_output=True, text=True, timeout=300)
        assert "RC" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
        return int(p.stdout.rsplit("RC", 1)[1].split()[0]), p.stdout
    rc, text = run("-m", "online_softmax")                 # the untouched stub notebook
    assert rc == 1 and "online_softmax: not implemented yet" in text and "merge_states" not in text, text[-2000:]
    assert re.search(r"(\d+) failed, (\d+) deselected", text)
    rc, text = run("--submission", str(sol))
    assert rc == 0 and re.search(r"\d+ passed", text) and "failed" not in text, text[-2000:]


def test_a7_is_left_out_and_its_answers_show_nowhere(release, tmp_path):
    """a7 is instructor-only: none of its files, visible cases or answers ship. Its graded parities (the one-line
    SOLUTION expressions of the a7 solution, with any name or parenthesised term in place of a name) appear in
    no shipped text (lectures' cells and outputs, READMEs, quizzes, modules, the visible cases' JSON); lecture
    06 shows them in the repository and is redacted in the release."""
    out, _ = release
    assert "a7_gluon" in LEFT_OUT
    files = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in files if "a7" in p.name or "a7_gluon" in str(p.relative_to(out))]
    index = json.loads((out / "autograder" / "visible" / "index.json").read_text())
    assert not [t for t in index["tasks"] if t.startswith("a7")]
    pats = answer_patterns()
    assert len(pats) >= 3                                   # the ready, empty and turn parities
    hits = [(str(p.relative_to(out)), m.group(0)) for p in files if p.suffix in (".ipynb", ".md", ".py", ".json", ".txt")
            for pat in pats for m in pat.finditer(p.read_text())]
    assert hits == []
    assert "(r & 1) ^ (1 - WG)" not in "".join(p.read_text() for p in files if p.suffix != ".npz")
    # positive controls: the repository's lecture 06 and the a7 solution do show them
    lec = (REPO / "lectures" / "06_fa3_hopper.ipynb").read_text()
    assert redact_answers(lec, pats)[1] >= 3
    assert ANSWER_NOTE in (out / "lectures" / "06_fa3_hopper.ipynb").read_text()
    for expr in ("((r0 + j) & 1) ^ (1 - WG)", "((it // STAGES) & 1) ^ 1", "`(t // STAGES) & 1`", "(r & 1) ^ (1 - WG)"):
        assert redact_answers(expr, pats)[1] == 1, expr
    assert redact_answers("(r & 1) ^ WG and x & 1", pats)[1] == 0
    # and the a7 README a student would be handed says none of them
    readme = (REPO / "assignments" / "a7_gluon" / "README.md").read_text()
    assert redact_answers(readme, pats)[1] == 0


def test_every_shipped_file_says_what_it_is_for(release):
    """FILES.md has one row per shipped file, each with a description; quizzes ship, their answers do not."""
    out, _ = release
    rows = dict(re.findall(r"^\| `([^`]+)` \| (.+) \|$", (out / "FILES.md").read_text(), re.M))
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert set(rows) == files
    assert all(len(v) > 15 for v in rows.values())
    quizzes = sorted((REPO / "docs" / "quizzes").glob("[0-9][0-9]*_*.md"))
    assert quizzes and all(f"quizzes/{q.name}" in files for q in quizzes)
    assert not [f for f in files if "answer" in f.lower()]


def test_make_student_release_prints_what_it_left_out_and_why(tmp_path):
    p = subprocess.run([sys.executable, "-m", "assignments.release", "-o", str(tmp_path / "rel"), "--exclude", "a6"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    text = p.stdout
    for what in ("reference/", "assignments/a7_gluon/", "docs/quizzes/answers.md", "assignments/a6_ring/",
                 "autograder/submissions/", "lectures/05_triton_kernels.ipynb: cell", "lectures/06_fa3_hopper.ipynb"):
        assert what in text, what
    assert all(": " in line for line in text.split("and why:")[1].strip().splitlines())
