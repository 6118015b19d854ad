"""The one percent-format reader (``autograder.percent``) used by the lecture build, the assignment generator and
the grader's .py submissions."""
from __future__ import annotations

import pytest

from autograder.percent import GIVEN, has_markers, parse_percent

TEXT = ('# %% [markdown]\n# # Title\n#\n# text\n#no space\n\n# %%\nx = 1\n\n\n# %%\n\n'
        '# %% tags=["check", "skip"]\ncheck(x)\n# %% [raw] tags=[\'skip\']\nraw\n# %% [md]\n# more\n')


def _summary(cells):
    return [(c.index, c.kind, c.source, c.tags) for c in cells]


def test_sources_are_trimmed_and_empty_cells_dropped():
    assert _summary(parse_percent(TEXT)) == [
        (0, "markdown", "# Title\n\ntext\nno space", []), (1, "code", "x = 1", []),
        (3, "code", "check(x)", ["check", "skip"]), (4, "raw", "raw", ["skip"]), (5, "markdown", "more", [])]


def test_untrimmed_keeps_every_line_and_cell():
    cells = parse_percent(TEXT, trim=False)
    assert [c.index for c in cells] == [0, 1, 2, 3, 4, 5]
    assert cells[1].source == "x = 1\n\n" and cells[2].source == ""
    # the body of a cell keeps its line count, so line numbers map back to the file
    assert sum(c.source.count("\n") + 1 for c in cells) + len(cells) == len(TEXT.splitlines())


def test_text_before_the_first_marker():
    with pytest.raises(ValueError, match=r"^f.py:2: text before the first '# %%' cell marker"):
        parse_percent("\nx = 1\n# %%\ny = 2\n", "f.py")
    assert parse_percent("\n\n# %%\ny = 2\n")[0].source == "y = 2"          # blank lines are fine
    cells = parse_percent("import a\n# %%\ny = 2\n", preamble="code", trim=False)
    assert _summary(cells) == [(0, "code", "import a", []), (1, "code", "y = 2", [])]
    with pytest.raises(ValueError, match="preamble must be"):
        parse_percent("", preamble="keep")


def test_markers():
    assert has_markers("a = 1\n# %%\n") and not has_markers("a = 1\n#  %%\n")
    assert parse_percent("") == [] and parse_percent("x = 1", preamble="code")[0].source == "x = 1"


def test_given_cells_come_from_assignments_given():
    cells = parse_percent('# %% given="check_qkv"\n\n# %%\nx = 1\n', "s.py")
    assert cells[0].source == (GIVEN / "check_qkv.py").read_text(encoding="utf-8").strip("\n")
    assert cells[0].source.startswith("def check_qkv(") and cells[1].source == "x = 1"
    with pytest.raises(ValueError, match=r'^s.py:1: a given="check_qkv" cell takes its code from'):
        parse_percent('# %% given="check_qkv"\ny = 2\n', "s.py")
    with pytest.raises(ValueError, match=r'^s.py:2: given="nope": no file'):
        parse_percent('# %%\n# %% given="nope"\n', "s.py")


def test_every_given_file_is_used_by_a_solution_source():
    sources = "".join(p.read_text(encoding="utf-8") for p in GIVEN.parent.glob("a*/a*_solution.py"))
    for path in GIVEN.glob("*.py"):
        assert f'given="{path.stem}"' in sources, path.name
