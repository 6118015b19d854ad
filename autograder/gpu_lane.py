"""One timing lane per GPU: timed sections of different grader processes never overlap on one GPU.

A speed test times single calls of the student's function and of the reference; a kernel of another grading
running on the same GPU meanwhile (a correctness case of ``grade-all -j 4``) time-slices the GPU and inflates
whichever side it lands on. So every grader process of a machine shares, per GPU, a readers-writer lock made of
two ``fcntl.flock`` files in one directory (``lock_dir``):

* correctness calls take the lane **shared** (any number at once, across processes);
* a speed case takes it **exclusive** for all its timed reps, the student's and the reference's calls alike,
  after waiting for the shared holders in flight to finish.

A waiting writer holds the ``.turn`` file, which every reader passes through before taking its shared lock, so
a stream of correctness calls cannot starve a speed case (writer preference). ``flock`` locks belong to an open
file: a process that dies, however it dies, releases them when the kernel closes its files. A wait longer than
``timeout`` gives up and proceeds without the lane (the caller records that), so a stuck process elsewhere
cannot stall a grading.

The lane of a process is its first visible GPU: the first entry of ``CUDA_VISIBLE_DEVICES`` (``grade-all``
starts each grading with one physical GPU index there), else ``0``. Processes that name one GPU differently
(an index here, a UUID there) do not share a lane; ``grade-all`` always passes indices.
The lock directory defaults to ``build/.gpu-lanes`` inside the course checkout (shared by every grading started
from this checkout, and out of a submission's reach: the sandbox hides the checkout from the child), else a
folder under the system's temporary directory; ``AUTOGRADER_LANE_DIR`` overrides it (several checkouts on one
machine should point it at one folder).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time
from pathlib import Path

ENV_DIR = "AUTOGRADER_LANE_DIR"
POLL_S = 0.002             # between tries of a non-blocking flock while waiting
WAIT_S = 900.0             # longest wait for a lane before proceeding without it


def lock_dir() -> Path:
    """The folder of the lane files (created on first use, writable by every user of the machine)."""
    env = os.environ.get(ENV_DIR)
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parent.parent / "build" / ".gpu-lanes",
                   Path(tempfile.gettempdir()) / "autograder-gpu-lanes"]
    for d in candidates:
        try:
            d.mkdir(parents=True, exist_ok=True)
            if os.access(d, os.W_OK):
                return d
        except OSError:
            continue
    raise OSError(f"no writable folder for the GPU lane locks (tried {', '.join(map(str, candidates))})")


def lane_key(env=None) -> str:
    """The physical GPU this process grades on: the first entry of ``CUDA_VISIBLE_DEVICES`` or ``0``."""
    env = os.environ if env is None else env
    first = (env.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", first)


class Lane:
    """The readers-writer lock of one GPU (``shared`` for correctness calls, ``exclusive`` for a speed case).
    Re-entrant inside one process: a shared request while this process holds the lane exclusively (or shared)
    goes straight through, since ``flock`` locks of two open files in one process would wait for each other."""

    def __init__(self, key: str | None = None, folder: Path | None = None, timeout: float = WAIT_S):
        self.key = key if key is not None else lane_key()
        self.folder = folder
        self.timeout = timeout
        self.held = None           # None | "shared" | "exclusive"
        self.waited = 0.0          # seconds spent waiting, summed over this process's acquisitions
        self.gave_up = 0           # acquisitions that timed out (proceeded without the lane)

    def _paths(self):
        d = self.folder or lock_dir()
        return d / f"gpu{self.key}.turn", d / f"gpu{self.key}.lock"

    @staticmethod
    def _open(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            os.fchmod(fd, 0o666)     # every user of the machine shares the lane
        except OSError:
            pass
        return fd

    def _take(self, fd, how, deadline) -> bool:
        while True:
            try:
                fcntl.flock(fd, how | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(POLL_S)

    @contextlib.contextmanager
    def shared(self):
        """A correctness call: runs beside other correctness calls, never inside a speed case's timed reps."""
        if self.held is not None:
            yield
            return
        turn_p, main_p = self._paths()
        turn, main = self._open(turn_p), self._open(main_p)
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        ok = False
        try:
            if self._take(turn, fcntl.LOCK_EX, deadline):      # behind any speed case that is waiting
                ok = self._take(main, fcntl.LOCK_SH, deadline)
                fcntl.flock(turn, fcntl.LOCK_UN)
            self.waited += time.monotonic() - t0
            self.gave_up += not ok
            self.held = "shared"
            yield
        finally:
            self.held = None
            os.close(main)             # closing releases the lock
            os.close(turn)

    @contextlib.contextmanager
    def exclusive(self):
        """A speed case's timed reps: alone on this GPU. Yields the seconds waited for the lane (None: the wait
        timed out and the case runs without it)."""
        if self.held == "exclusive":
            yield 0.0
            return
        turn_p, main_p = self._paths()
        turn, main = self._open(turn_p), self._open(main_p)
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        try:
            ok = self._take(turn, fcntl.LOCK_EX, deadline) and self._take(main, fcntl.LOCK_EX, deadline)
            waited = time.monotonic() - t0
            self.waited += waited
            self.gave_up += not ok
            self.held = "exclusive"
            yield waited if ok else None
        finally:
            self.held = None
            os.close(main)
            os.close(turn)


class NoLane:
    """CPU grading: nothing to share."""
    key, held, waited, gave_up = None, None, 0.0, 0

    @contextlib.contextmanager
    def shared(self):
        yield

    @contextlib.contextmanager
    def exclusive(self):
        yield 0.0
