"""Run a benchmark's stages each in a child process with a time limit, saving the JSON after every stage.

A Gluon kernel with a wrong mbarrier phase hangs the GPU instead of failing, so ``bench_gluon.py`` and
``bench_gluon_bwd.py`` run each stage (``python -m module --stage NAME``, which prints ``RESULT <json>``
last) in its own process: a hang costs that stage (its stdout tail is kept), not the whole device call.

The limit counts run time only. On a freshly started machine Triton and Gluon compile every kernel
configuration first (ptxas included), which can take minutes and says nothing about a hang; so the child
reports each JIT compilation (``benchmarks._compile_marks``: Triton's ``jit_cache_hook`` before a compile and
``jit_post_compile_hook`` after it) on a pipe of its own, and the parent stops the clock while one is in
progress. Compilations have a bound of their own (``COMPILE_LIMIT`` without one finishing). A process the stage
starts reports its compilations too if it calls ``mark_compiles`` (``marked_python``). A stage may print
``PARTIAL <json>`` lines (one finished item each): when it is stopped or crashes they are kept as the stage's
``partial`` result, and the last ``checking ...`` line it printed names what was running.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

from benchmarks._compile_marks import COMPILE_FD

#: runs ``python -m MODULE --stage STAGE`` with the compile markers installed first
_BOOT = ("import runpy, sys; from benchmarks._compile_marks import mark_compiles; mark_compiles(); "
         "mod, stage = sys.argv[1:3]; sys.argv = [mod, '--stage', stage]; "
         "runpy.run_module(mod, run_name='__main__', alter_sys=True)")
#: seconds the compiler may work without finishing a compilation before the stage is stopped as hung in it
COMPILE_LIMIT = 900
class _Watch:
    """The parent's view of one stage: its stdout lines, and the compilations reported on the marker pipe."""

    def __init__(self):
        self.lines, self.lock = [], threading.Lock()
        self.active, self.compile_s, self.since, self.compiles, self.last = {}, 0.0, 0.0, 0, ""

    def feed(self, stream):
        for line in stream:
            line = line.rstrip("\n")
            with self.lock:
                self.lines.append(line)
            if not line.startswith(("RESULT ", "PARTIAL ")):
                print(line, flush=True)

    def marks(self, stream):
        for line in stream:
            sign, _, rest = line.rstrip("\n").partition(" ")
            now = time.monotonic()
            with self.lock:
                if not self.active:
                    self.since = now
                if sign == "+":
                    self.active[rest] = self.active.get(rest, 0) + 1
                    self.last = rest.partition(" ")[2]
                elif self.active.get(rest):
                    self.active[rest] -= 1
                    self.active = {k: n for k, n in self.active.items() if n}
                    self.compiles += 1
                    self.compile_s += now - self.since
                    self.since = now           # while others are still compiling: a bound per compilation

    def clocks(self, now: float) -> tuple[float, float]:
        """(seconds compiling so far, seconds since the compiler last finished while it is still busy)."""
        with self.lock:
            current = now - self.since if self.active else 0.0
            return self.compile_s + current, current


def _stop(p: subprocess.Popen) -> None:
    """End the stage's process group (a stage may have started ncu or pytest)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        p.kill()


def run_stage(module: str, stage: str, limit: float, env: dict, cwd: str, stats: dict | None = None,
              compile_limit: float = COMPILE_LIMIT) -> dict | list:
    """One stage in a child: its ``RESULT`` JSON, or ``{"error", ...}`` (with the ``partial`` items it printed and
    the ``running`` item). ``limit`` bounds run time, compilations excluded (module docstring); ``stats`` gets
    the seconds spent compiling and the number of compilations."""
    rfd, wfd = os.pipe()
    try:
        p = subprocess.Popen([sys.executable, "-c", _BOOT, module, stage], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=cwd, env={**env, COMPILE_FD: str(wfd)},
                             pass_fds=(wfd,), start_new_session=True)
    finally:
        os.close(wfd)
    watch, err = _Watch(), []
    with open(rfd) as marks:
        readers = [threading.Thread(target=watch.feed, args=(p.stdout,), daemon=True),
                   threading.Thread(target=watch.marks, args=(marks,), daemon=True),
                   threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)]
        for t in readers:
            t.start()
        t0, why = time.monotonic(), None
        try:
            while p.poll() is None and not why:
                time.sleep(0.2)
                now = time.monotonic()
                compile_s, current = watch.clocks(now)
                if now - t0 - compile_s > limit:
                    why = (f"timed out after {limit:.0f} s of run time (deadlock?); {compile_s:.0f} s of compiling "
                           "not counted")
                elif current > compile_limit:
                    why = f"timed out: the compiler finished nothing in {compile_limit:.0f} s (last: {watch.last})"
        except BaseException:        # Ctrl-C: the stage runs in its own session, so it is ended here
            _stop(p)
            raise
        if why:
            _stop(p)
            print(f"{stage}: {why}", flush=True)
        p.wait()
        for t in readers:
            t.join(timeout=10)
    lines, stderr = list(watch.lines), "".join(err)
    compile_s = round(watch.clocks(time.monotonic())[0], 1)
    if stats is not None:
        stats.update(compile_seconds=compile_s, compiles=watch.compiles)
    got = [x for x in lines if x.startswith("RESULT ")]
    if got:
        return json.loads(got[-1][len("RESULT "):])
    out = {"error": why or stderr[-4000:], "rc": p.returncode, "stdout_tail": "\n".join(lines)[-8000:],
           "compile_seconds": compile_s, "compiles": watch.compiles}
    running = [x for x in lines if x.startswith("checking ")]
    if running:
        out["running"] = running[-1][len("checking "):]
    partial = [json.loads(x[len("PARTIAL "):]) for x in lines if x.startswith("PARTIAL ")]
    if partial:
        out["partial"] = partial
    if not why:
        print(stderr[-4000:], flush=True)
    return out


def stage_parser(doc: str, stages: list[str], results: str, timeout: int = 200,
                 timeout_help: str = "seconds per stage") -> argparse.ArgumentParser:
    """The arguments of a staged script (its docstring's first line as description): ``--out`` (``results``),
    ``--stage`` (``all`` is the parent, a stage name a child), ``--stages`` (default ``stages``), ``--timeout``."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=str(results))
    ap.add_argument("--stage", default="all", help=" | ".join(["all", *stages]))
    ap.add_argument("--stages", default=",".join(stages))
    ap.add_argument("--timeout", type=int, default=timeout, help=timeout_help)
    return ap


def run_child(stage: str, stage_fns: dict) -> bool:
    """A child's part (``stage`` is not ``all``): run ``stage_fns[stage]()`` and print ``RESULT <json>`` last, the
    line ``run_stage`` reads. Returns whether it ran (False in the parent)."""
    if stage == "all":
        return False
    print("RESULT " + json.dumps(stage_fns[stage]()), flush=True)
    return True


def run_stages(module: str, stages: list[str], limit_of, res: dict, path: str, env_of=None) -> dict:
    """Run ``stages`` of ``module`` (``python -m module --stage NAME`` from the repository root) in order;
    ``limit_of(stage)`` seconds of run time each (``run_stage``); ``env_of(stage, res)`` may return extra
    environment variables for the child (from the results so far). ``res[stage]`` gets each stage's
    result (or its error); ``res`` is written to ``path`` after every stage."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    t0 = time.time()
    for stage in stages:
        env = {**os.environ, **(env_of(stage, res) if env_of else {})}
        t = time.time()
        try:
            stats = {}
            res[stage] = run_stage(module, stage, limit_of(stage), env, root, stats)
            res.setdefault("stage_compile", {})[stage] = stats
        except Exception:  # noqa: BLE001
            res[stage] = {"error": traceback.format_exc()[-3000:]}
        res.setdefault("stage_seconds", {})[stage] = round(time.time() - t, 1)
        res["seconds"] = round(time.time() - t0, 1)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    print(f"wrote {path}", flush=True)
    return res

