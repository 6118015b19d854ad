"""Ungraded warm-up functions (``Spec.warmups``, a3's ``scale_rows``): ``check()`` runs their visible cases and
judges them against the float64 oracle, while the grader, ``make check`` and the points never see them: a
submission that leaves its warm-up a stub loses nothing."""
from __future__ import annotations

import re

import pytest
import torch

from assignments import WARMUP
from assignments import generate as gen
from autograder import specs, visible
from autograder.check import check

pytestmark = pytest.mark.autograder


@pytest.mark.parametrize("aid", specs.ASSIGNMENTS)
def test_warmups_are_visible_only_and_worth_nothing(aid):
    spec = specs.load(aid)
    assert not set(spec.warmups) & set(spec.tasks)
    assert {t.task for t in spec.warmup_tests} == set(spec.warmups)
    assert not any(t.task in spec.warmups for t in spec.tests)          # the grader reads spec.tests only
    for t in spec.warmup_tests:
        assert t.points == 0 and t.hidden is None and t.visible and t.kind == "correctness"
    assert not set(visible.tasks(aid)) & set(spec.warmups)              # make check: graded functions only
    names = {task.name for task in spec.warmups.values()}
    assert names == set(WARMUP.get(aid, ())), "assignments.WARMUP lists each spec's warm-ups"


def test_a3_warmup_is_found_and_its_points_leave_the_total_alone():
    spec, task = specs.find_task("a3.scale_rows")
    assert spec.id == "a3_triton" and task.name == "scale_rows"
    assert spec.max_points == 100.0


def test_check_judges_the_warmup(capsys):
    assert check("a3.scale_rows", lambda x, s: x * s[:, None]) is True
    # forgetting the last column of every row: a mask that stops one short
    assert check("a3.scale_rows", lambda x, s: torch.cat([x[:, :-1] * s[:, None], x[:, -1:]], 1)) is False
    out = capsys.readouterr().out

    def stub(x, s):
        raise NotImplementedError("Implement scale_rows")
    assert check("a3.scale_rows", stub) is False
    assert "FAIL" in out and "not implemented yet" in capsys.readouterr().out


def test_release_keeps_the_primer_whose_lines_the_warmup_repeats():
    """Lecture 05a's vector add is, line for line, close to a3's warm-up: an ungraded region is no leak, so
    the student release keeps the lecture's output; a graded region still is (a3's softmax kernel)."""
    from assignments.release import REPO, find_leaks, solution_regions
    regions = solution_regions()
    assert not [r for r in regions if r[1] in ("scale_rows", "_scale_rows_kernel")]
    assert find_leaks((REPO / "lectures" / "05a_triton_primer.ipynb").read_text(), regions) == []
    kernel = (gen.ROOT / "a3_triton" / "a3_triton_solution.py").read_text(encoding="utf-8")
    kernel = kernel[kernel.index("def _softmax_kernel"):kernel.index("def softmax(")]
    assert any(hit.startswith("a3_triton:_softmax_kernel") for hit in find_leaks(kernel, regions))


@pytest.mark.slow
def test_grader_ignores_an_unwritten_warmup(tmp_path):
    """The a3 solution with only its warm-up stubbed: the graded test passes and no line names the warm-up."""
    from autograder.engine import Grader
    src = (gen.ROOT / "a3_triton" / "a3_triton_solution.py").read_text(encoding="utf-8")
    start = src.index("def _scale_rows_kernel")
    end = src.index("# %% tags=", start)
    stubbed = src[:start] + gen.strip_solutions(src[start:end]) + src[end:]
    assert stubbed.count('NotImplementedError("Implement ') == 2 and "Implement scale_rows" in stubbed
    path = tmp_path / "a3_triton.py"
    path.write_text(stubbed, encoding="utf-8")
    # asked for the warm-up by name too: were it among the graded tests, its stub would show as a failed line
    rep = Grader("a3_triton", device="cpu", only=["softmax: basic", "scale_rows"]).grade(path)
    assert [t["status"] for t in rep["tests"]] == ["passed"], rep["tests"]
    assert not any(re.search("scale_rows|warm-up", t["name"]) for t in rep["tests"])
    assert not rep["flags"], rep["flags"]
