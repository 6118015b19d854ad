"""Every visible case of one assignment as a pytest test of the student's own code (``make check``).

The cases are the ones ``check(...)`` runs in the notebook (``autograder.visible``: from the specs in the
repository, from stored files in the student release), judged the same way (``check.run_case``); each test
carries the graded function's name as its marker. A stub fails with "not implemented yet"; a failing case
prints its parameters and the relative error against the tolerance. Grading (``python -m autograder grade``)
runs hidden cases of the same kinds, larger and drawn at random, plus memory and speed tests.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from autograder import adapter, check, visible
from autograder.runner import materialise
from autograder.specs import resolve


def _assignment(config):
    aid = config.getoption("assignment") or os.environ.get("ASSIGNMENT")
    if not aid:
        raise pytest.UsageError("which assignment? make check ASSIGNMENT=a1_attention (pytest: --assignment a1)")
    try:
        return resolve(aid)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_generate_tests(metafunc):
    if "case" not in metafunc.fixturenames:
        return
    aid = _assignment(metafunc.config)
    params = []
    rng = np.random.default_rng(0)
    for task_id, name in visible.tasks(aid).items():
        for case in visible.cases(task_id, rng):
            params.append(pytest.param((task_id, name, case), id=f"{name}: {case.label}",
                                       marks=getattr(pytest.mark, name)))
    metafunc.parametrize("case", params)


@pytest.fixture(scope="session")
def submission(request):
    aid = _assignment(request.config)
    path = request.config.getoption("submission") or os.environ.get("SUBMISSION")
    path = Path(path) if path else adapter.default_submission(aid)
    if not path.is_file():
        pytest.exit(f"make check: no submission {path} (SUBMISSION=path/to/your.ipynb)", returncode=4)
    return adapter.load(path, aid)


def test_visible_case(submission, case):
    task_id, name, c = case
    fn, why = submission.function(name)
    if fn is None:
        pytest.fail(why, pytrace=False)
    device = check._device(visible.framework(task_id))
    why = check.needs_message(c, device)
    if why:
        pytest.skip(why)
    if c.call is None and c.parent is None:
        pytest.skip("a speed test: graded by `python -m autograder grade` on a GPU, no visible case")
    if c.gpu and device == "cpu":
        pytest.skip("a GPU case (bfloat16): runs where torch sees a GPU")
    if c.parent is not None:                  # a compile-only check (a7): the grader's verdict, in this process
        from autograder.local_checks import run_parent_check
        ok, msg = run_parent_check(c.parent, fn)
        if not ok:
            pytest.fail(f"{name}, {c.label}: {msg}", pytrace=False)
        return
    ok, err, msg, tol = check.run_case(c, fn, device)
    if ok:
        return
    if msg == check.NOT_IMPLEMENTED:
        pytest.fail(f"{name}: not implemented yet (it raises NotImplementedError: replace the stub)", pytrace=False)
    lines = [f"{name}, case '{c.label}': {msg}"]
    if c.header["mode"] != "script":
        args, kwargs = materialise(c.header, c.arrays, device)
        lines.append(f"called with {check.describe_case(fn, c, args, kwargs)}")
    lines.append(f"in the notebook: check(\"{task_id}\", {name}) runs this case and keeps its inputs in "
                 "check.failed")
    pytest.fail("\n".join(lines), pytrace=False)
