"""a7_gluon (optional, Hopper): the solution's turn passes the CPU checks; the zoo's mutants (a missing wait, a
missing arrive, a wrong phase) lose them without a GPU and without hanging (compile-only checks and the
phase model never run the kernel)."""
import runpy
from pathlib import Path

import numpy as np
import pytest

from autograder.gluon_compile import compile_usage, judge_compile, judge_phases
from autograder.submission import load_cells

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "assignments" / "a7_gluon" / "a7_gluon_solution.py"
MUTANTS = {
    "missing wait": ("    mbarrier.wait(turn_bars.index(WG), _turn_phase(r, WG))\n", "    _turn_phase(r, WG)\n"),
    "missing arrive": ("    mbarrier.arrive(turn_bars.index(1 - WG))\n", "    turn_bars.index(1 - WG)\n"),
    "wrong phase": ("    return (r & 1) ^ (1 - WG)\n", "    return (r & 1) ^ WG\n"),
}


def _mutant(tmp_path, name):
    old, new = MUTANTS[name]
    text = SOLUTION.read_text()
    assert text.count(old) == 1, name
    path = tmp_path / f"{name.replace(' ', '_')}.py"
    path.write_text(text.replace(old, new))
    return path


def _phases(path):
    ns = runpy.run_path(str(path))
    rng = np.random.default_rng()
    r, w = rng.integers(0, 1000, 64), rng.integers(0, 2, 64)
    return ns, np.array_equal(ns["turn_phases"](r, w), (r & 1) ^ (1 - w))


def test_solution_phases_and_turn_order():
    ns, ok = _phases(SOLUTION)
    assert ok
    assert ns["turn_order"](4) == [f"WG{w} r{r}" for r in range(4) for w in (0, 1)]


def test_wrong_phase_mutant_fails_the_phase_check_and_the_order(tmp_path):
    ns, ok = _phases(_mutant(tmp_path, "wrong phase"))
    assert not ok
    assert ns["turn_order"](4)[0] == "WG1 r0"


def _graded_code(path):
    return "\n\n".join(c.source for c in load_cells(path))


@pytest.fixture(scope="module")
def solution_usage():
    return compile_usage(_graded_code(SOLUTION), seed=int(np.random.default_rng().integers(1 << 30)))


def test_solution_compiles_for_sm90a_without_spills_with_one_wait_and_arrive_per_round(solution_usage):
    assert judge_phases(solution_usage)[0], judge_phases(solution_usage)
    ok, msg = judge_compile(solution_usage["with"], solution_usage["without"])
    assert ok, msg
    with_turns = solution_usage["with"]
    assert with_turns["registers"] <= 168 and with_turns["HGMMA"] > 0
    assert with_turns["ptx_wgmma_wait_1"] == 2


@pytest.mark.parametrize("name", ["missing wait", "missing arrive"])
def test_missing_barrier_mutants_lose_the_compile_check(tmp_path, name):
    r = compile_usage(_graded_code(_mutant(tmp_path, name)))
    assert judge_phases(r)[0]  # the phase formula itself is right
    ok, msg = judge_compile(r["with"], r["without"])
    assert not ok and "expected 6" in msg, msg


def test_wrong_phase_mutant_loses_the_parent_phase_check(tmp_path):
    ok, msg = judge_phases(compile_usage(_graded_code(_mutant(tmp_path, "wrong phase"))))
    assert not ok and "_turn_phase(r=" in msg, msg
