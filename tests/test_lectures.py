"""The lectures: every source runs headless without error, and the committed notebooks are built from it."""
from pathlib import Path

import nbformat
import pytest

from lectures import build

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
    lecture twice more in a test of its own (issue 23 item 2: one build of lecture 04, about 7 s of CPU)."""
    out = build.build(src, tmp_path / "a", timeout=300)
    nb = nbformat.read(str(out), as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs), \
        "every lecture has at least one embedded figure"
    if src.stem == STABLE:
        again = build.build(src, tmp_path / "b", timeout=300)
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
