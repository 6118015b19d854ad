"""Every visible case of one assignment as a pytest test of the student's own code (``make check``).

The cases are the ones ``check(...)`` runs in the notebook (``autograder.visible``: from the specs in the
repository, from stored files in the student release), judged the same way (``check.run_case``); each test
carries the graded function's name as its marker. A stub fails with "not implemented yet"; a failing case
prints its parameters and the relative error against the tolerance. Grading (``python -m autograder grade``)
runs hidden cases of the same kinds, larger and drawn at random, plus memory and speed tests.

The notebook runs in a worker process (``check_worker.worker_for``), never in pytest's: a kernel that crashes or
hangs fails its case with a diagnosis ("is a tl.load/tl.store missing its mask?"), the next case gets a fresh
worker, and the crash's raw output stays in the worker's log.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from autograder import adapter, check, check_worker, isolated, visible
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
    worker = check_worker.worker_for(path, aid)
    yield worker
    worker.close()


def _missing(worker, name):
    """Why ``name`` cannot be checked (loading failed or killed the worker, a cell failed, not defined), or None."""
    died = worker.start()
    if died is not None:
        return f"{name}: {died.reason} (run the notebook top to bottom to see which cell)"
    if name in worker.loaded["failed"]:
        return worker.loaded["failed"][name]
    if name not in worker.loaded["names"]:
        return f"{name} is not defined in {Path(worker.path).name}"
    return None


def test_visible_case(submission, case):
    task_id, name, c = case
    why = _missing(submission, name)
    if why:
        pytest.fail(why, pytrace=False)
    device = check._device(visible.framework(task_id))
    why = check.needs_message(c, device)
    if why:
        pytest.skip(why)
    if c.call is None and c.parent is None:
        pytest.skip("a speed test: graded by `python -m autograder grade` on a GPU, no visible case")
    if c.gpu and device == "cpu":
        pytest.skip("a GPU case (bfloat16): runs where torch sees a GPU")
    if c.parent is not None:        # a compile-only check (a7): the grader's verdict, in the worker, found by name
        c = dataclasses.replace(c, parent=c.test)
    res, printed = submission.run(task_id, name, c, isolated.case_timeout(task_id))
    if printed:
        print(printed, end="")
    if isinstance(res, isolated.Died):
        pytest.fail(f"{name}, case '{c.label}': "
                    f"{isolated.crash_message(task_id, name, c, res, visible.framework(task_id) == 'torch')}",
                    pytrace=False)
    ok, err, msg, tol = res
    if ok:
        return
    if c.parent is not None:
        pytest.fail(f"{name}, {c.label}: {msg}", pytrace=False)
    if msg == check.NOT_IMPLEMENTED:
        pytest.fail(f"{name}: not implemented yet (it raises NotImplementedError: replace the stub)", pytrace=False)
    lines = [f"{name}, case '{c.label}': {msg}"]
    if c.header["mode"] != "script":
        args, kwargs = materialise(c.header, c.arrays, device)
        lines.append(f"called with {check.describe_case(None, c, args, kwargs)}")
    lines.append(f"in the notebook: check(\"{task_id}\", {name}) runs this case and keeps its inputs in "
                 "check.failed")
    pytest.fail("\n".join(lines), pytrace=False)
