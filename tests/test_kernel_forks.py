"""The notebook tests' forked kernels (``tests/kernel_forks.py``) are the kernels Jupyter would start: the same
working folder, ``sys.path``, arguments, environment, session and parent handling, inline figures, interrupts and
shutdown; and a kernel is only forked from a template that was started in the same environment."""
import json
import os
import time

import nbformat
import pytest
from nbclient import NotebookClient

from lectures import build
from tests import kernel_forks

pytestmark = pytest.mark.notebooks

FACTS = """
import json, os, sys
from ipykernel.kernelapp import IPKernelApp
app = IPKernelApp.instance()
env = {k: v for k, v in os.environ.items() if not k.startswith("JPY_") and k != "PYTEST_CURRENT_TEST"}
print(json.dumps({"cwd": os.getcwd(), "path": sys.path, "argv0": sys.argv[0], "argv": sys.argv[1:2] + sys.argv[3:],
                  "env": env, "parent_handle": app.parent_handle, "session_leader": os.getsid(0) == os.getpid(),
                  "name": __name__, "ppid": os.getppid(), "pid": os.getpid(), "poller": type(app.poller).__name__,
                  "session": os.environ.get("JPY_SESSION_NAME")}))
"""


def _run(cells, manager=None, **kw):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    extra = {"kernel_manager_class": manager} if manager else {}
    with build.kernel_environment():
        NotebookClient(nb, timeout=kw.pop("timeout", 120), kernel_name="python3",
                       resources={"metadata": {"path": str(build.LECTURES)}}, **extra, **kw).execute()
    return nb


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_forked_kernel_is_the_kernel_jupyter_starts():
    cells = [FACTS, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])"]
    started = _run(cells)
    forked = _run(cells, kernel_forks.manager_class())
    a, b = (json.loads("".join(nb.cells[0].outputs[0]["text"])) for nb in (started, forked))
    assert b["ppid"] != os.getpid() and a["ppid"] == os.getpid()        # the second really was forked
    assert any(b["ppid"] == t.proc.pid for t in kernel_forks._TEMPLATES)
    for key in ("cwd", "path", "argv0", "env", "session_leader", "name", "poller"):
        assert a[key] == b[key], (key, a[key], b[key])
    assert a["parent_handle"] == b["parent_handle"] == os.getpid()
    assert a["argv"] == b["argv"] == ["-f", "--HistoryManager.hist_file=:memory:"]
    for nb in (started, forked):                 # the figure of a cell without plt.show() is displayed inline
        assert any("image/png" in o.get("data", {}) for o in nb.cells[1].outputs)
    assert not _alive(b["pid"])                  # shut down with its notebook


def test_a_forked_kernel_is_interrupted_and_runs_on():
    """A cell past its time limit is interrupted through the kernel's process group; the kernel survives it and
    runs the next cell, and is shut down with its notebook."""
    cells = ["import os, time\nprint(os.getpid())", "time.sleep(60)", "print('alive', os.getpid())"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    t0 = time.monotonic()
    with build.kernel_environment():
        NotebookClient(nb, timeout=3, interrupt_on_timeout=True, allow_errors=True, kernel_name="python3",
                       kernel_manager_class=kernel_forks.manager_class(),
                       resources={"metadata": {"path": str(build.LECTURES)}}).execute()
    assert time.monotonic() - t0 < 30
    pid = int(nb.cells[0].outputs[0]["text"])
    assert [o.get("ename") for o in nb.cells[1].outputs if o.output_type == "error"] == ["KeyboardInterrupt"]
    assert nb.cells[2].outputs[0]["text"] == f"alive {pid}\n"          # the same kernel, still running
    assert not _alive(pid)


def test_a_kernel_forks_only_from_a_template_started_in_its_environment(monkeypatch):
    """One template per environment (variables that differ per kernel aside); none at all when forking is off."""
    with build.kernel_environment():
        env = dict(os.environ)
    one = kernel_forks.template_for(env)
    assert one is not None and one.ready
    assert kernel_forks.template_for({**env, "JPY_SESSION_NAME": "x", "PYTEST_CURRENT_TEST": "y"}) is one
    assert not kernel_forks._same_env(one.start_env, {**env, "OMP_NUM_THREADS": "3"})
    monkeypatch.setenv("COURSE_KERNEL_FORKS", "0")
    assert kernel_forks.template_for(env) is None


def test_a_template_that_cannot_fork_safely_says_why(tmp_path):
    """A template whose imports left a thread running (here: one started by a ``sitecustomize``) refuses to fork,
    and kernels start as Jupyter starts them."""
    (tmp_path / "sitecustomize.py").write_text("import threading, time\n"
                                               "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    t = kernel_forks.Template(env)
    assert not t.ready and "threads" in t.why, t.why
    assert t.proc.poll() is not None


def test_the_template_kills_its_kernels_when_it_ends(tmp_path):
    t = kernel_forks.Template({k: v for k, v in os.environ.items() if not kernel_forks._per_kernel(k)})
    assert t.ready, t.why
    _, pid = t.fork(["-f", str(tmp_path / "kernel.json")], dict(os.environ), str(tmp_path), str(tmp_path / "log"))
    assert _alive(pid)
    t.close()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
