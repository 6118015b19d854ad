"""``make check``'s side of the isolated worker (``autograder.isolated``): the process that loads a student's
notebook and answers its visible cases (``python -m autograder.check_worker PATH FD [ASSIGNMENT]``), and the
in-process stand-in where no worker can be spawned. It joins the worker machinery to the checker
(``check.run_case``), so that neither of those two modules imports the other."""
from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection

from . import adapter, check, visible
from .isolated import SpawnWorker, _parent_check, serve


class InProcess:
    """``make check`` where a worker cannot be spawned (no ``fork``/``pass_fds``: Windows): the notebook runs in
    pytest's own process, as ``SpawnWorker``'s interface (a crash then ends the run)."""

    def __init__(self, path, assignment=None):
        self.path, self.assignment, self.loaded, self.sub = str(path), assignment, None, None

    def start(self):
        if self.sub is None:
            self.sub = adapter.load(self.path, self.assignment)
            self.loaded = {"failed": dict(self.sub.failed), "output": self.sub.output,
                           "names": [k for k in self.sub.namespace if not k.startswith("__")]}
        return None

    def run(self, task_id, name, case, timeout):
        fn = self.sub.namespace[name]
        if case.parent is not None:
            from .local_checks import run_parent_check
            ok, msg = run_parent_check(_parent_check(task_id, case.parent), fn)
            return (ok, float("inf"), msg, None), ""
        return check.run_case(case, fn, check._device(visible.framework(task_id))), ""

    def close(self):
        pass


def worker_for(path, assignment=None):
    """The ``make check`` worker: ``SpawnWorker`` on a POSIX system, else ``InProcess``. ``assignment``: a Triton
    assignment's cells load under its host policy, as in grading (``adapter.load``)."""
    return SpawnWorker(path, assignment) if os.name == "posix" else InProcess(path, assignment)


def _worker_main(path, fd, assignment=None):
    """Load the notebook, report its load errors, serve cases."""
    conn = Connection(fd)
    sub = adapter.load(path, assignment or None)
    names = [k for k, v in sub.namespace.items() if not k.startswith("__")]
    conn.send({"failed": dict(sub.failed), "names": names, "output": sub.output[-4000:]})
    serve(conn, lambda name: sub.namespace[name], lambda task_id: check._device(visible.framework(task_id)),
          check.run_case)


if __name__ == "__main__":
    _worker_main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
    os._exit(0)
