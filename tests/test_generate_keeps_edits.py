"""`make assignments` (python -m assignments.generate) never overwrites a student notebook edited in place: the
digest of the cells it wrote, stored in the notebook, tells a generated notebook (fresh or stale: overwritten)
from an edited one (kept; the fresh notebook goes beside it, exit status 1; --force overwrites)."""
from __future__ import annotations

import json

import nbformat
import pytest

from assignments import generate as gen

AID = "a1_attention"


@pytest.fixture
def target(tmp_path, monkeypatch):
    path = tmp_path / f"{AID}.ipynb"
    monkeypatch.setattr(gen, "student_path", lambda aid: tmp_path / f"{aid}.ipynb")
    return path


def _edit(text, fn, restamp=False):
    nb = nbformat.reads(text, as_version=4)
    fn(nb)
    if restamp:
        nb.metadata["course"] = {"cells_sha256": gen.cells_digest(nb)}
    return nbformat.writes(nb) + "\n"


def _implement(nb):
    """A student's edit: a stub replaced by code."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and "NotImplementedError" in c.source)
    cell.source = cell.source.replace('raise NotImplementedError("Implement', '# mine\n    pass  # ("Implement', 1)


def test_fresh_unchanged_and_stale_notebooks_are_written(target, capsys):
    fresh = gen.render(AID)
    assert gen.main([AID]) == 0 and target.read_text() == fresh
    assert gen.main([AID]) == 0 and "unchanged" in capsys.readouterr().out
    # generated from an older solution source (its own digest matches): stale, so overwritten
    target.write_text(_edit(fresh, lambda nb: nb.cells.append(nbformat.v4.new_markdown_cell("old")), restamp=True))
    assert gen.main([AID]) == 0 and target.read_text() == fresh
    # run, not edited: outputs and execution counts do not count as edits
    ran = nbformat.reads(fresh, as_version=4)
    for c in ran.cells:
        if c.cell_type == "code":
            c.execution_count = 1
            c.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n")]
    target.write_text(nbformat.writes(ran))
    assert gen.main([AID]) == 0 and target.read_text() == fresh


def test_an_edited_notebook_is_kept_and_the_fresh_one_written_beside_it(target, capsys):
    fresh = gen.render(AID)
    mine = _edit(fresh, _implement)
    target.write_text(mine)
    assert gen.main([AID]) == 1
    err = capsys.readouterr().err
    assert "edited in place" in err and f"--force {AID}" in err
    assert target.read_text() == mine                                       # the student's work is intact
    beside = target.with_name(f"{AID}.generated.ipynb")
    assert beside.read_text() == fresh
    assert gen.main(["--force", AID]) == 0 and target.read_text() == fresh


def test_without_a_digest_only_an_identical_notebook_is_overwritten(target):
    fresh = gen.render(AID)

    def drop(nb):
        nb.metadata.pop("course")
    target.write_text(_edit(fresh, drop))                                  # written before digests: same cells
    assert gen.main([AID]) == 0 and target.read_text() == fresh
    target.write_text(_edit(fresh, lambda nb: (drop(nb), _implement(nb))))
    assert gen.main([AID]) == 1 and "# mine" in target.read_text()
    target.write_text("{not a notebook")
    assert gen.main([AID]) == 1 and target.read_text() == "{not a notebook"


def test_digest_covers_cells_not_outputs():
    nb = nbformat.reads(gen.render(AID), as_version=4)
    assert nb.metadata["course"]["cells_sha256"] == gen.cells_digest(nb)
    before = gen.cells_digest(nb)
    nb.cells[0].metadata["collapsed"] = True
    assert gen.cells_digest(nb) == before
    nb.cells[-1].metadata["tags"] = ["check"] if not nb.cells[-1].metadata.get("tags") else []
    assert gen.cells_digest(nb) != before
    assert json.loads(gen.render(AID))["metadata"]["course"]["cells_sha256"] == before
