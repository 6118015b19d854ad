"""The lectures: every source runs headless without error, and the committed notebooks are built from it.

The builds run as Jupyter runs a lecture (kernel started in ``lectures/``, ``PYTHONPATH`` unset), so they pass
only through the editable install of ``make setup``, as ``make lab``, VS Code and ``jupyter nbconvert`` need."""
import os
import subprocess
import re
import sys
from pathlib import Path

import nbformat
import pytest

from lectures import build
from tests import kernel_forks

pytestmark = pytest.mark.notebooks

SOURCES = sorted(build.SRC.glob("[0-9][0-9]*_*.py"))
IDS = [p.stem for p in SOURCES]


def test_there_are_lectures():
    assert len(SOURCES) >= 9, [p.name for p in SOURCES]
    # the lettered lectures between two numbers (the Triton primer and the profiling unit, read before a3)
    names = [p.stem for p in SOURCES]
    assert names.index("05_triton_kernels") < names.index("05a_triton_primer") < names.index("05b_profiling") \
        < names.index("06_fa3_hopper"), names


# the lecture that is built twice to show rebuilds are byte-stable (its first build is the execution test's)
STABLE = next(p.stem for p in SOURCES if p.stem.startswith("04_"))


@pytest.mark.parametrize("src", SOURCES, ids=IDS)
def test_lecture_executes(src, tmp_path):
    """Execute the SOURCE in a fresh kernel (output to a temporary folder); any cell error fails the test.

    For lecture ``STABLE`` also: rebuilding gives the same bytes (seeded inputs, printed numbers that do not
    depend on timing, merged output streams). The check reuses this test's build instead of building the
    lecture twice more in a test of its own (one build of lecture 04 costs about 7 s of CPU)."""
    out = build.build(src, tmp_path / "a", timeout=300, kernel_manager_class=kernel_forks.manager_class())
    nb = nbformat.read(str(out), as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs), \
        "every lecture has at least one embedded figure"
    if src.stem == STABLE:
        again = build.build(src, tmp_path / "b", timeout=300, kernel_manager_class=kernel_forks.manager_class())
        assert out.read_bytes() == again.read_bytes(), f"two builds of {src.name} differ"


@pytest.mark.parametrize("src", SOURCES, ids=IDS)
def test_committed_notebook_matches_source(src):
    """``lectures/NN_topic.ipynb`` must be the executed build of ``src/NN_topic.py`` (edit the source, rebuild)."""
    ipynb = build.LECTURES / (src.stem + ".ipynb")
    assert ipynb.exists(), f"{ipynb.name} not built: run `python -m lectures.build {src.stem.split('_')[0]}`"
    nb = nbformat.read(str(ipynb), as_version=4)
    want = [(c.cell_type, c.source) for c in build.to_notebook(src).cells]
    have = [(c.cell_type, c.source) for c in nb.cells]
    assert have == want, f"{ipynb.name} differs from {src.name}: rebuild it"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), f"{ipynb.name} is not fully executed"
    assert not any(o.output_type == "error" for c in code for o in c.outputs)


def test_check_guess_compares_numbers_strings_and_reports_no_guess(capsys):
    from lectures._exercise import check_guess
    assert check_guess(None, 1.4) is None and "1.4" in capsys.readouterr().out
    assert check_guess(1.5, 1.4, rel=0.1) is True
    assert check_guess(2.0, 1.4) is False
    assert check_guess(63, 63, rel=0) is True and check_guess(62, 63, rel=0) is False
    assert check_guess(" Fewer ", "fewer") is True and check_guess("more", "fewer") is False
    with pytest.raises(TypeError, match="guess must be a number"):
        check_guess("1.4", 1.4)
    with pytest.raises(ValueError, match="rel"):
        check_guess(1.0, 1.0, rel=-1)


@pytest.mark.parametrize("src", SOURCES, ids=IDS)
def test_every_lecture_asks_a_prediction(src):
    """Each lecture has at least one predict-then-run cell: a ``guess = None`` line checked by ``check_guess``."""
    text = src.read_text(encoding="utf-8")
    assert "guess = None" in text and "check_guess(guess," in text, f"{src.name} has no predict-then-run exercise"


def test_stream_outputs_are_coalesced():
    """A cell's prints arrive in timing-dependent chunks; the build merges them so rebuilds are byte-stable."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(1); print(2)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="a\n"),
                    nbformat.v4.new_output("stream", name="stdout", text=["b\n", "c\n"]),
                    nbformat.v4.new_output("stream", name="stderr", text="w\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="d\n")]
    nb.cells.append(cell)
    out = build.coalesce_streams(nb).cells[0].outputs
    assert [(o.name, "".join(o.text)) for o in out] == [("stdout", "a\nb\nc\nd\n"), ("stderr", "w\n")]
    # a non-stream output (a figure) separates runs
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="w\n"),
                    nbformat.v4.new_output("display_data", data={"text/plain": "fig"}),
                    nbformat.v4.new_output("stream", name="stdout", text="x\n")]
    out = build.coalesce_streams(nb).cells[0].outputs
    assert [o.output_type for o in out] == ["stream", "display_data", "stream"]


def _no_pythonpath_env():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def test_lectures_package_is_installed_by_setup():
    """``make setup`` installs the repository editable; ``lectures`` must be among its packages, or every lecture
    fails in its first cell with ``No module named 'lectures'`` wherever Jupyter starts the kernel."""
    text = (build.ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r"\[tool\.setuptools\.packages\.find\][^\[]*?^include\s*=\s*\[([^\]]*)\]", text, re.M | re.S)
    assert found, "pyproject.toml has no [tool.setuptools.packages.find] include list"
    include = re.findall(r'"([^"]+)"', found.group(1))
    for pkg in ("lectures", "reference", "autograder"):
        assert any(pat in (pkg, pkg + "*") for pat in include), f"pyproject.toml does not install {pkg}: {include}"


def test_setup_leaves_out_the_grammar_that_nbformat_would_compile_on_import():
    """``make setup`` uninstalls rfc3987-syntax, which jsonschema (imported by nbformat) imports when it is there
    and which compiles a grammar on import: 1.3 s more in every process that reads or builds a notebook."""
    p = subprocess.run([sys.executable, "-c", "import sys, nbformat; print('rfc3987_syntax' in sys.modules)"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "False", "rfc3987-syntax is installed: run `make setup` (it uninstalls it)"


def test_helpers_import_from_the_lectures_folder_without_pythonpath():
    """From ``lectures/`` with ``PYTHONPATH`` unset (a kernel of ``make lab``), ``lectures`` and ``reference``
    import from this checkout and the results folder the lectures read resolves to the repository's."""
    code = ("import lectures._plots as p, reference, json; "
            "print(json.dumps([p.__file__, reference.__file__, str(p.RESULTS), p.RESULTS.is_dir()]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=build.LECTURES, env=_no_pythonpath_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"run `make setup` (editable install):\n{res.stderr[-1500:]}"
    plots, ref, results, exists = __import__("json").loads(res.stdout.strip().splitlines()[-1])
    assert Path(plots).resolve() == (build.LECTURES / "_plots.py").resolve()
    assert Path(ref).resolve().parent.parent == build.ROOT.resolve()
    assert Path(results).resolve() == (build.ROOT / "benchmarks" / "results").resolve() and exists


def test_build_runs_the_kernel_in_the_lectures_folder_without_pythonpath(monkeypatch):
    """The build must not hide a missing install: its kernel starts in ``lectures/`` and does not inherit a
    ``PYTHONPATH`` (set here to the repository root, as the build once did); the caller's environment is restored."""
    monkeypatch.setenv("PYTHONPATH", str(build.ROOT))
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        "import os, lectures\nprint(os.getcwd()); print(os.environ.get('PYTHONPATH')); print(lectures.__file__)"))
    out = build.execute(nb, timeout=120)
    cwd, pythonpath, init = "".join(out.cells[0].outputs[0].text).split("\n")[:3]
    assert Path(cwd).resolve() == build.LECTURES.resolve()
    assert pythonpath == "None"
    assert Path(init).resolve() == (build.LECTURES / "__init__.py").resolve()
    assert os.environ["PYTHONPATH"] == str(build.ROOT)


def test_nbconvert_executes_a_committed_lecture_from_its_folder(tmp_path):
    """``jupyter nbconvert --execute`` run in ``lectures/`` with ``PYTHONPATH`` unset, on a committed notebook."""
    res = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", "00_attention_basics.ipynb",
                          "--output-dir", str(tmp_path), "--ExecutePreprocessor.timeout=300"],
                         cwd=build.LECTURES, env=_no_pythonpath_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    nb = nbformat.read(str(tmp_path / "00_attention_basics.ipynb"), as_version=4)
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code")
