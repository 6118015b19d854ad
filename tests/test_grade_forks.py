"""``autograder.grade_forks``: a grading forked from the fork server is the ``python -m autograder grade`` subprocess
it replaces (same result, exit status and output), one at a time or several at once; a grading past its time
limit is killed, a failing one fails alone, and a dead server leaves ``grade_one`` on subprocesses."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autograder import grade_all
from autograder.grade_forks import ForkError, Forks, forks

REPO = Path(__file__).resolve().parents[1]
OWN = REPO / "autograder" / "submissions" / "a1_attention" / "correct" / "own_numpy.py"
WRONG = REPO / "autograder" / "submissions" / "a1_attention" / "wrong" / "w_missing_gqa.mutant.json"

pytestmark = pytest.mark.autograder


@pytest.fixture(scope="module")
def server():
    with forks(str(REPO)) as f:
        assert f is not None, "the fork server did not start"
        yield f


def _argv(path, out, *extra):
    return ["grade", "a1_attention", str(path), "--json", str(out), "--device", "cpu", "--quiet", "--seed", "7",
            "--test", "attention:", *extra]


def _comparable(result):
    return {"score": result["score"], "max_score": result["max_score"], "flags": result["flags"],
            "tests": [(t["name"], t["score"], t["status"]) for t in result["tests"]]}


def test_a_forked_grading_is_the_subprocess_it_replaces(server, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = server.run(_argv(OWN, tmp_path / "fork.json"), cwd=str(REPO), env=env, timeout=300)
    q = subprocess.run([sys.executable, "-m", "autograder", *_argv(OWN, tmp_path / "sub.json")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == q.returncode == 0, p.stderr + q.stderr
    forked, spawned = (json.loads((tmp_path / n).read_text()) for n in ("fork.json", "sub.json"))
    assert _comparable(forked) == _comparable(spawned)
    assert forked["score"] > 0 and forked["tests"]


def test_exit_status_and_output_come_back(server, tmp_path):
    p = server.run(["grade", "a1_attention", str(tmp_path / "missing.py")], cwd=str(REPO),
                   env=dict(os.environ), timeout=60)
    assert p.returncode == 2
    assert "does not exist" in p.stderr and p.stdout == ""
    p = server.run(["no-such-command"], cwd=str(REPO), env=dict(os.environ), timeout=60)
    assert p.returncode == 2 and "invalid choice" in p.stderr          # argparse's SystemExit(2)


def test_the_environment_and_folder_are_the_callers(server, tmp_path):
    """The forked process runs in the folder and with the environment of the request, not the server's: a
    relative path resolves there, and a variable the server never had is seen."""
    (tmp_path / "sub.py").write_text(OWN.read_text())
    env = dict(os.environ, PYTHONPATH=str(REPO), AUTOGRADER_FORKS_TEST="1")
    p = server.run(_argv("sub.py", "out.json"), cwd=str(tmp_path), env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "out.json").read_text())["submission"] == "sub.py"


def test_concurrent_gradings_each_get_their_own_result(server, tmp_path):
    from autograder.selftest import materialise_mutant
    wrong = materialise_mutant(WRONG, tmp_path / "mutants")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    jobs = [(OWN, tmp_path / "a.json"), (wrong, tmp_path / "b.json"), (OWN, tmp_path / "c.json")]
    with ThreadPoolExecutor(3) as pool:
        done = list(pool.map(lambda j: server.run(_argv(*j), cwd=str(REPO), env=env, timeout=300), jobs))
    assert [p.returncode for p in done] == [0, 0, 0]
    a, b, c = (json.loads(out.read_text()) for _, out in jobs)
    assert a["submission"] == str(OWN) and b["submission"] == str(wrong)
    assert _comparable(a) == _comparable(c)
    assert b["score"] < a["score"]                # the GQA mutant loses the GQA cases


def test_a_grading_past_its_limit_is_killed_and_the_server_goes_on(server, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(_argv(OWN, tmp_path / "slow.json"), cwd=str(REPO), env=env, timeout=0.05)
    assert not (tmp_path / "slow.json").exists()
    p = server.run(["grade", "a1_attention", str(tmp_path / "missing.py")], cwd=str(REPO), env=env, timeout=60)
    assert p.returncode == 2


def test_grade_one_falls_back_to_a_subprocess_when_the_server_is_gone(tmp_path):
    f = Forks(str(REPO))
    f.close()
    with pytest.raises(ForkError):
        f.run(["grade"], cwd=str(REPO), env=dict(os.environ), timeout=10)
    r = grade_all.grade_one("a1_attention", OWN, tmp_path / "r.json", device="cpu",
                            extra=["--seed", "7", "--test", "attention:"], forks=f)
    assert "grader_error" not in r and r["score"] > 0


def test_forking_only_for_several_cpu_gradings():
    import contextlib
    assert isinstance(grade_all.forking("cpu", 1), contextlib.nullcontext)
    with grade_all.forking("cpu", 2) as f:
        assert isinstance(f, Forks)


def test_a_server_that_cannot_import_its_preload_is_not_used():
    with forks(str(REPO), preload=("autograder.no_such_module",)) as f:
        assert f is None


def test_a7_parent_imports_cover_what_its_parent_check_imports():
    """What a7's grading process imports for its sm_90a parent check (``gluon_compile.signature``) is already
    imported once ``Spec.parent_imports`` are: a fork server that preloads them leaves the forks nothing heavy."""
    code = ("import importlib, sys\n"
            "from autograder import specs, gluon_compile\n"
            "for m in specs.load('a7_gluon').parent_imports: importlib.import_module(m)\n"
            "before = set(sys.modules)\n"
            "gluon_compile.signature()\n"
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('torch', 'triton', 'reference')))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]"
