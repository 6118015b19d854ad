"""The compile-only child the sm_90a compile tests share (``tests/sm90_compile.py``): it runs a command line as
``python`` would, in compile-only mode, and reports failures as a child process did."""
import subprocess

import pytest

from tests import sm90_compile


@pytest.fixture
def own_child(monkeypatch):
    """A child of this test's own (the process's shared one, with its compiled kernels, is left alone)."""
    monkeypatch.setattr(sm90_compile, "_child", None)
    monkeypatch.setattr(sm90_compile, "_memo", {})
    yield sm90_compile
    sm90_compile._stop()


def test_runs_a_command_line_as_python_would_in_compile_only_mode(own_child):
    out = own_child.run(["-c", "import os, sys; print(sys.argv[1:], os.environ['TRITON_INTERPRET'], "
                               "repr(os.environ['CUDA_VISIBLE_DEVICES']))", "a", 2])
    assert out == sm90_compile.Result(0, "['a', '2'] 0 ''\n", "")
    out = own_child.run(["-m", "json.tool", "--help"])
    assert out.returncode == 0 and "usage:" in out.stdout
    with pytest.raises(ValueError, match="argv must start with '-m', module or '-c', code"):
        own_child.run(["x.py"])


def test_failures_read_as_a_childs_and_only_successes_are_remembered(own_child):
    out = own_child.run(["-c", "print('before'); 1 / 0"])
    assert out.returncode == 1 and out.stdout == "before\n" and "ZeroDivisionError" in out.stderr
    assert own_child.run(["-c", "raise SystemExit(3)"]).returncode == 3
    assert not own_child._memo
    first = own_child._child
    crashed = own_child.run(["-c", "import os; os._exit(7)"])  # the child dies: its status, a fresh child next
    assert crashed.returncode == 7
    assert own_child.run(["-c", "print(1)"]).stdout == "1\n" and own_child._child is not first
    counter = ["-c", "import builtins; builtins.n = getattr(builtins, 'n', 0) + 1; print(builtins.n)"]
    assert own_child.run(counter).stdout == own_child.run(counter).stdout == "1\n"  # asked twice, run once
    with pytest.raises(subprocess.TimeoutExpired):
        own_child.run(["-c", "import time; time.sleep(30)"], timeout=1)
    assert own_child.run(["-c", "print(2)"]).stdout == "2\n"


def test_each_command_reports_the_cpu_it_cost(own_child):
    """The child is reaped only when the test process ends, so it sends each command's CPU (its own and its
    finished subprocesses') back with the result, for ``tests/cpu_report.py`` to charge to the test that asked."""
    own_child.run(["-c", "pass"])  # the child's start (its imports) is not a command's cost
    before = own_child.cpu_seconds()
    own_child.run(["-c", "import subprocess, sys; x = sum(i * i for i in range(3_000_000)); "
                         "subprocess.run([sys.executable, '-c', 'sum(i * i for i in range(3_000_000))'])"])
    spent = own_child.cpu_seconds() - before
    assert spent > 0.2, spent  # two loops of a few tenths of a second each, the second in a subprocess
    again = own_child.cpu_seconds()
    own_child.run(["-c", "pass"])
    assert own_child.cpu_seconds() - again < spent / 2
