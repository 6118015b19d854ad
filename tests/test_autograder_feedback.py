"""What a student and an instructor are shown: a cell that fails while loading (a syntax error, an output
flood) is named first on the console, as a CSV status and in every affected test's output (also on
Gradescope); grade-all from another folder with relative paths; the table fitted to the terminal, --verbose,
and a command that reproduces the first failure with the same cases."""
import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import textwrap
import sys
import zipfile
from pathlib import Path

import pytest

from autograder import specs
from autograder.load_errors import cell_failures, defined_names, explain, failed_names
from autograder.report import fold_command, python_command, reproduce, table
from autograder.submission import Cell, load_cells, read_notebook

pytestmark = pytest.mark.autograder
REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "autograder" / "examples" / "a1_attention_example.ipynb"
OWN = REPO / "autograder" / "submissions" / "a1_attention" / "correct" / "own_numpy.py"
SAFE = "a1.safe_softmax:"


def _grader(*args, cwd=REPO, **kw):
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="150")
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env, **kw)


def syntax_error_notebook(path):
    """The example notebook with an unclosed parenthesis in the cell that defines safe_softmax."""
    nb = json.loads(EXAMPLE.read_text())
    cell = next(c for c in nb["cells"] if "def safe_softmax" in "".join(c["source"]))
    src = "".join(cell["source"])
    cell["source"] = src.replace("np.max(xc,", "np.max((xc,", 1)
    assert cell["source"] != src
    path.write_text(json.dumps(nb))
    return path


def flood_module(path):
    """A correct submission that defines every function, then prints 200 MB in a loop at the top level."""
    path.write_text(OWN.read_text() + "\n\nfor _ in range(200_000):\n    print('x' * 1000)\n")
    return path


def test_defined_names_and_explain():
    assert defined_names("import numpy as np\ndef f(x):\n    y = 1\nclass C: pass\nA, (B, c) = 1, (2, 3)\n") == \
        {"np", "f", "C", "A", "B", "c"}
    assert defined_names("def safe_softmax(x):\n    return np.max((x,\nk: int = 3\n") == {"safe_softmax", "k"}
    assert defined_names("x == 3\n") == set()
    msg = explain("OSError: [Errno 27] File too large (cell 0, line 75)", 64 << 20)
    assert msg == "OSError: file too large (line 75) (output over 64 MiB; remove the prints in the loop)"
    assert explain("SyntaxError: '(' was never closed (<cell 4>, line 12)") == \
        "SyntaxError: '(' was never closed (line 12)"
    # the failing cell's own place is shortened; a place in another cell (a function called at load) is kept
    assert explain("ValueError: no (cell [5], line 3, in f)", cell="cell [5]") == "ValueError: no (line 3, in f)"
    assert explain("ValueError: no (cell [2], line 3, in f)", cell="cell [5]") == \
        "ValueError: no (cell [2], line 3, in f)"
    cells = [Cell(1, "def f(): pass"), Cell(2, "def f(:\n"), Cell(3, "def g(): pass\nraise ValueError"),
             Cell(5, "def h(): pass")]
    reports = [{"index": 1, "ok": True}, {"index": 2, "ok": False, "error": "SyntaxError: bad (<cell 2>, line 1)"},
               {"index": 3, "ok": False, "error": "ValueError:  (cell 3, line 2)"}, {"index": 5, "ok": True}]
    out = failed_names(cells, reports, ["f", "g", "h", "k"])
    assert set(out) == {"f", "g"}                       # the last cell that defines f failed; h is fine
    assert out["f"] == 'cell 2 ("def f(:") failed while loading: SyntaxError: bad (line 1)'
    assert out["g"].startswith('cell 3 ("def g(): pass") failed while loading: ValueError')


def test_cells_are_named_as_jupyter_shows_them(tmp_path):
    """``cell [n]``: the n-th code cell (Jupyter's In [n] after Run All), markdown cells not counted, skipped
    (check) cells counted; the same name in load errors; a plain .py module is named by its file name."""
    nb = {"cells": [{"cell_type": "markdown", "source": "# title"},
                    {"cell_type": "code", "source": "import numpy as np", "metadata": {}},
                    {"cell_type": "markdown", "source": "text"},
                    {"cell_type": "code", "source": "check(1)", "metadata": {"tags": ["check"]}},
                    {"cell_type": "code", "source": "def f(x):\n    return np.max((x,\n", "metadata": {}}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    cells = load_cells(path)
    assert [(c.index, c.name) for c in cells] == [(1, "cell [1]"), (4, "cell [3]")]
    assert [c.name for c in read_notebook(json.dumps(nb))] == ["cell [1]", "cell [2]", "cell [3]"]
    msgs = cell_failures(cells, [{"index": 4, "ok": False, "error": "SyntaxError: '(' was never closed "
                                  "(cell [3], line 2)"}])
    assert msgs[0][1] == 'cell [3] ("def f(x):") failed while loading: SyntaxError: \'(\' was never closed (line 2)'
    py = tmp_path / "mine.py"
    py.write_text("x = 1\n")
    assert [c.name for c in load_cells(py)] == ["mine.py"]
    py.write_text("# %% [markdown]\n# hi\n# %%\nx = 1\n# %%\ny = 2\n")
    assert [c.name for c in load_cells(py)] == ["cell [1]", "cell [2]"]


def test_child_messages_name_the_cell_and_the_line_inside_a_triton_kernel(monkeypatch):
    """The child's one-line error and traceback: the cell as Jupyter shows it, and for an exception raised
    inside a Triton kernel (interpreter: InterpreterError from the kernel's exception) the kernel's own line,
    not the launch line."""
    import linecache

    from autograder import where
    src = ("import triton\nimport triton.language as tl\n\n@triton.jit\ndef k(x_ptr, n, B: tl.constexpr):\n"
           "    offs = tl.arange(0, B)\n    x = tl.load(x_ptr + offs, mask=offs < n)\n"
           "    y = tl.reshape(x, (3, 5))\n    tl.store(x_ptr + offs, x, mask=offs < n)\n\n"
           "def f(x):\n    k[(1,)](x, x.numel(), B=16)\n    return x\n")
    fname = "<cell 9>"
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    where.CELL_LABELS[fname] = "cell [4]"
    try:
        ns = {}
        monkeypatch.setenv("TRITON_INTERPRET", "1")            # read when @triton.jit decorates
        import torch
        if torch.cuda.is_available():
            pytest.skip("the interpreter case: no GPU")
        exec(compile(src, fname, "exec"), ns)  # noqa: S102
        with pytest.raises(Exception) as info:
            ns["f"](torch.zeros(10))
        line = where.exc_line(info.value)
        assert line.startswith("ValueError: ") and line.endswith("(cell [4], line 8, in k)"), line
        assert where.student_tb(info.value).splitlines() == ["cell [4], line 12, in f", "cell [4], line 8, in k"]
        try:
            exec(compile("def g():\n    return 1 +\n", fname, "exec"), {})  # noqa: S102
        except SyntaxError as exc:
            assert "(cell [4], line 2)" in where.exc_line(exc)
    finally:
        where.CELL_LABELS.pop(fname, None)


def test_a_triton_compilation_error_names_the_kernel_line():
    """On a GPU a kernel that does not compile raises CompilationError at the launch; its node's line counts
    from the kernel's def. Compiled here for a CUDA target on the CPU (the front end needs no GPU), in a fresh
    process: the interpreter (TRITON_INTERPRET=1, set by other tests in this one) patches triton.language."""
    pytest.importorskip("triton.backends.compiler")
    script = textwrap.dedent('''
        import linecache
        import triton
        from triton.backends.compiler import GPUTarget
        from autograder import where
        src = ("import triton\\nimport triton.language as tl\\n\\n@triton.jit\\ndef k(x_ptr, n, B: tl.constexpr):\\n"
               "    offs = tl.arange(0, B)\\n    x = tl.load(x_ptr + offs, mask=offs < n)\\n"
               "    y = tl.reshape(x, (3, 5))\\n    tl.store(x_ptr + offs, x, mask=offs < n)\\n")
        fname = "<cell 8>"
        linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
        where.CELL_LABELS[fname] = "cell [6]"
        ns = {}
        exec(compile(src, fname, "exec"), ns)
        source = triton.compiler.ASTSource(fn=ns["k"], signature={"x_ptr": "*fp32", "n": "i32", "B": "constexpr"},
                                           constexprs={"B": 16})
        try:
            triton.compile(source, target=GPUTarget("cuda", 80, 32))
        except Exception as exc:
            print(where.exc_line(exc))
        ''')
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    line = p.stdout.strip()
    assert line.startswith("CompilationError: ") and "\n" not in line, (line, p.stderr[-2000:])
    assert line.endswith("at `y = tl.reshape(x, (3, 5))` (cell [6], line 8, in k)"), line


def _result(tests, **kw):
    return {"assignment": "a1_attention", "submission": "my sub.ipynb", "score": 0, "max_score": 10,
            "device": "cpu", "execution_time": 1.0, "seed": "42", "flags": [], "tests": tests, **kw}


def test_table_width_verbose_and_reproduction():
    long = "o: relative error 1.5e+00 > tolerance 2e-05 [case 1: " + ", ".join(f"p{i}={i}" for i in range(90)) + "]"
    tests = [{"name": "a1.x: basic", "score": 0, "max_score": 5, "status": "failed", "output": "x is not defined "
              "in the submission", "time": 0.0},
             {"name": "a1.x: causal", "score": 0, "max_score": 5, "status": "failed", "output": long, "time": 0.1}]
    r = _result(tests)
    for width in (80, 200):
        lines = table(r, width=width).splitlines()
        assert max(len(x) for x in lines if not x.startswith("first failure")) <= width
    assert long not in table(r, width=200) and "p89=89" not in table(r, width=200)
    assert "p5=5" in table(r, width=100)                    # a cut note still shows its first lines
    verbose = table(r, width=100, verbose=True)
    assert "p89=89]" in verbose and max(len(x) for x in verbose.splitlines()) <= 100
    # the reproduction skips failures a re-run would only repeat (undefined names, load errors), and runs the
    # grader with this interpreter (no activated venv needed)
    assert reproduce(r) == (f"{python_command()} -m autograder grade a1_attention 'my sub.ipynb' --device cpu "
                            "--seed 42 --test 'a1.x: causal'")
    assert table(r, width=200).splitlines()[-1] == "  " + reproduce(r)
    assert shlex.split(" ".join(x.rstrip(" \\") for x in table(r, width=60).splitlines()[-3:])) == \
        shlex.split(reproduce(r))
    assert fold_command("a b c", 80) == ["  a b c"]
    r["load"] = {"errors": ['cell [3] ("def x():") failed while loading: SyntaxError: oops (line 2)']}
    lines = table(r, width=200).splitlines()          # (the default width is the terminal's: 80 under make test)
    assert lines[0].startswith("LOAD ERRORS") and "SyntaxError: oops" in lines[1]


def test_python_command_is_this_interpreter(tmp_path, monkeypatch):
    exe = Path(sys.executable)
    monkeypatch.chdir(tmp_path)
    assert python_command() in (shlex.quote(str(exe)), shlex.quote(os.path.relpath(exe)))
    if exe.is_relative_to(REPO):
        monkeypatch.chdir(REPO)
        assert python_command() == shlex.quote(os.path.relpath(exe)) and not python_command().startswith("/")


def _failing(status, points):
    return ("o: relative error 1.5e+00 > tolerance 5e-03 [case 2: q: float32 (1, 4, 19, 16), k: float32 (1, 2, 7, "
            "16), v: float32 (1, 2, 7, 16), causal=True]") if status != "passed" else ""


@pytest.mark.parametrize("aid", ["a1_attention", "a3_triton"])
def test_every_line_fits_a_100_column_terminal(aid, monkeypatch):
    """a1 rows were 134 columns and a3 rows about 200 on a 100-column terminal: every line of the
    table, flags and re-run command included, fits $COLUMNS, and a failing case's shapes stay visible."""
    spec = specs.load(aid)
    statuses = ["passed", "failed", "not run", "partial"]
    tests = [{"name": t.name, "score": 0, "max_score": t.points, "status": statuses[i % 4],
              "output": _failing(statuses[i % 4], t.points), "time": 12.34, "optional": t.optional}
             for i, t in enumerate(spec.tests)]
    r = _result(tests, assignment=aid, submission=f"assignments/{aid}/{aid}.ipynb", seed="123456789012",
                bonus=0, max_bonus=spec.max_bonus,
                flags=[{"id": "T10", "tasks": [f"{spec.short}.x"], "message": "aten.exp on input-derived data",
                        "where": "cell [7], line 12, in softmax", "explanation": "a Triton part must compute "
                        "with Triton kernels; torch may only allocate, view, copy, cast and index"}],
                load={"errors": ['cell [5] ("def softmax(x):") failed while loading: NameError: name \'tl\' '
                                 'is not defined (line 3, in softmax)']})
    monkeypatch.setenv("COLUMNS", "100")
    for verbose in (False, True):
        out = table(r, verbose=verbose)
        assert max(len(x) for x in out.splitlines()) <= 100, max(out.splitlines(), key=len)
        assert "k: float32 (1, 2, 7, 16)" in out.replace("\n    ", " ")     # the failing case's shapes
        assert all(t.name.split(": ", 1)[1].split()[0] in out for t in spec.tests)


def test_syntax_error_shown_first_and_reproduction_replays_the_case(tmp_path):
    nb = syntax_error_notebook(tmp_path / "nb.ipynb")
    p = _grader("grade", "a1", str(nb), "--device", "cpu", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[1].startswith("LOAD ERRORS") and "SyntaxError" in out[2] and "line 4" in out[2], p.stdout
    assert p.stdout.count("a1.safe_softmax: basic") == 1                  # each test printed once
    r = json.loads((tmp_path / "r.json").read_text())
    safe = [t for t in r["tests"] if t["name"].startswith(SAFE)]
    assert safe and all("failed while loading: SyntaxError" in t["output"] and t["score"] == 0 for t in safe)
    assert all(t["status"] == "passed" for t in r["tests"] if "online_softmax" in t["name"])
    # the example's deliberate bug (causal with Nq != Nk) is the first reproducible failure
    at = next(i for i, x in enumerate(out) if x.startswith("first failure, again with the same inputs:"))
    cmd = " ".join(x.strip().rstrip("\\") for x in out[at + 1:])
    assert "Nq != Nk" in cmd and shlex.split(cmd)[0] == python_command()
    argv = shlex.split(cmd)[3:] + ["--json", str(tmp_path / "again.json")]
    p2 = _grader(*argv)
    assert p2.returncode == 0, p2.stderr
    again = json.loads((tmp_path / "again.json").read_text())
    first = next(t for t in r["tests"] if "Nq != Nk" in t["name"])
    assert [t["name"] for t in again["tests"]] == [first["name"]]
    case = re.search(r"\[case .*\]", first["output"]).group(0)
    assert case in again["tests"][0]["output"]                            # the same shapes, from the seed


def test_grade_all_relative_paths_from_another_folder_and_load_statuses(tmp_path):
    work = tmp_path / "course"
    subs = work / "subs"
    subs.mkdir(parents=True)
    shutil.copy(OWN, subs / "alice.py")
    syntax_error_notebook(subs / "bob.ipynb")
    flood_module(subs / "carol.py")
    (subs / "dave.ipynb").write_text("{not json")
    before = sorted((REPO / "grades").rglob("*")) if (REPO / "grades").exists() else []
    p = _grader("grade-all", "a1_attention", "subs", "--csv", "g.csv", "-j", "2", "--device", "cpu", cwd=work)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["student"]: r for r in csv.DictReader((work / "g.csv").open())}
    assert {s: r["status"] for s, r in rows.items()} == \
        {"alice": "ok", "bob": "load-error", "carol": "load-error", "dave": "unreadable"}
    assert float(rows["alice"]["percent"]) == 100.0
    for s in rows:
        assert (work / "grades" / "a1_attention" / f"{s}.json").is_file()
    after = sorted((REPO / "grades").rglob("*")) if (REPO / "grades").exists() else []
    assert after == before                                                 # nothing stray in the repository
    assert "2 with cells that failed while loading" in p.stdout and "1 unreadable" in p.stdout
    # the flood: every test of every function the cell defined says why (not "... is not defined")
    carol = json.loads((work / "grades" / "a1_attention" / "carol.json").read_text())
    assert carol["score"] == 0 and not carol["flags"]
    for t in carol["tests"]:
        assert "failed while loading: OSError: file too large" in t["output"], t
        assert "(output over 64 MiB; remove the prints in the loop)" in t["output"]
    # absolute paths work the same, and write nothing into the repository either
    p = _grader("grade-all", "a1_attention", str(subs), "--csv", str(tmp_path / "abs.csv"), "--out",
                str(tmp_path / "abs"), "--device", "cpu", cwd=tmp_path)
    assert p.returncode == 0 and len(list((tmp_path / "abs").glob("*.json"))) == 4
    assert (sorted((REPO / "grades").rglob("*")) if (REPO / "grades").exists() else []) == before


def test_gradescope_results_show_the_load_error_in_each_affected_test(tmp_path):
    z = tmp_path / "ag.zip"
    assert _grader("gradescope", "a1_attention", "-o", str(z)).returncode == 0
    root = tmp_path / "autograder"
    with zipfile.ZipFile(z) as f:
        f.extractall(root / "source")
    (root / "submission").mkdir()
    syntax_error_notebook(root / "submission" / "hw.ipynb")
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable)
    p = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads((root / "results" / "results.json").read_text())
    # the graded file first, then why functions could not be graded
    assert res["output"].startswith("graded file: hw.ipynb\nCells that failed while loading") and \
        "SyntaxError" in res["output"]
    safe = [t for t in res["tests"] if t["name"].startswith(SAFE)]
    assert safe and all("failed while loading: SyntaxError" in t["output"] and t["status"] == "failed"
                        for t in safe)
    assert not any("failed while loading" in t["output"] for t in res["tests"] if not t["name"].startswith(SAFE))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the solution source demonstrates float16 overflow
def test_a1_visible_checks_catch_float32_returned_for_float16(capsys):
    """The visible dtype cases include float16: returning float32 for float16 inputs fails locally, as it
    does in grading."""
    import types

    from autograder.check import run_visible
    from autograder.submission import load_cells
    sol = types.ModuleType("a1_sol")        # the solution's graded cells, given cells filled in
    for cell in load_cells(REPO / "assignments" / "a1_attention" / "a1_attention_solution.py"):
        exec(compile(cell.source, f"a1_attention_solution.py:cell{cell.index}", "exec"), sol.__dict__)  # noqa: S102
    capsys.readouterr()

    def widened(fn):
        def f(*a, **k):
            out = fn(*a, **k)
            return tuple(o.astype("float32") for o in out) if isinstance(out, tuple) else out.astype("float32")
        return f
    for name in ("safe_softmax", "online_softmax", "merge_states", "attention"):
        good = [r for _, label, r in run_visible(f"a1.{name}", getattr(sol, name))]
        assert good and all(r[0] for r in good), (name, good)
        bad = {label: r for test, label, r in run_visible(f"a1.{name}", widened(getattr(sol, name)))
               if "float16/float64" in test}
        assert any(not r[0] and "dtype float32, expected float16" in r[2] for r in bad.values()), (name, bad)


def test_hint_when_graded_against_the_wrong_assignment(tmp_path):
    from autograder.load_errors import looks_like
    from autograder.submission import load_cells
    a2 = REPO / "autograder" / "submissions" / "a2_flash_numpy" / "correct" / "own_tiled.py"
    assert looks_like(load_cells(a2), "a1_attention").startswith("this looks like a2_flash_numpy")
    assert looks_like(load_cells(a2), "a2_flash_numpy") is None
    assert looks_like(load_cells(OWN), "a1_attention") is None
    assert looks_like([Cell(0, "x = 1")], "a1_attention") is None           # nothing defined: no guess
    p = _grader("grade", "a1", str(a2), "--device", "cpu", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0 and p.stdout.splitlines()[1].startswith("NOTE: this looks like a2_flash_numpy")
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["score"] == 0 and all("looks like a2_flash_numpy" in t["output"] for t in r["tests"])


def test_a_cell_that_never_finishes_loading_fails_every_test_once(tmp_path, monkeypatch):
    """An endless loop at the top level: one wait for the loading time limit, then every test says why."""
    import time

    from autograder.engine import Grader
    sub = tmp_path / "loop.py"
    sub.write_text(OWN.read_text() + "\n\nwhile True:\n    pass\n")
    g = Grader("a1_attention", "cpu")
    monkeypatch.setattr(g.spec, "load_timeout", 3.0)
    t0 = time.monotonic()
    r = g.grade(sub)
    assert time.monotonic() - t0 < 30                           # not one 3 s wait per test (23 tests)
    assert r["score"] == 0 and "loading time limit of 3 s" in r["load"]["errors"][0]
    assert all("loading time limit of 3 s" in t["output"] for t in r["tests"]), r["tests"][:2]
