"""Grading one submission (docs/design.md §6): static scan, a sandboxed child for the submission, hidden cases from a
secret seed judged in this (parent) process, speed against the reference in a separate sandboxed child, flags.

The parent is the only writer of results (T1); expected outputs exist only here (T2); comparisons run here on
raw arrays (T3, T4). Every call gets fresh inputs (T5, T16). A child that dies, hangs, runs out of memory or hits
a CUDA fault fails the test it was running, with a diagnosis (``diagnose.py``), never a flag: the next test runs
in a fresh child; a task that hung, or crashed ``CRASHES_PER_TASK`` times, has its remaining tests skipped. T17
needs positive evidence of a process trick (a flood, a process left behind, a trapped call).
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import os
import statistics
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from . import diagnose, isolation, threats
from . import specs as specs_mod
from . import host_policy
from .evaluate import Verdict, audit_verdict, evaluate
from .gpu_lane import Lane, NoLane
from .load_errors import cell_failures, failed_names, looks_like
from .runner import array_hash, call_to_wire, from_wire
from .specs._base import Call, ChildError, Out
from .sandbox import Limits, Sandbox, SandboxDied
from .scan import scan
from .submission import SubmissionError, load_cells

# flags that zero every test of the task they are attributed to (cheating, not just a wrong answer): threats.ZEROING
ZEROING = threats.ZEROING
MAX_RESTARTS = 16       # fresh children per grading (crashes, CUDA faults); each task may use CRASHES_PER_TASK
CRASHES_PER_TASK = 2    # a task whose child died this often (or hung once) has its remaining tests skipped
SAMPLE = 16384          # output elements re-checked on a timed rep that is not fully checked


@dataclass
class TestResult:
    name: str
    task: str
    max_score: float
    score: float = 0.0
    status: str = "failed"          # passed | failed | partial | not run
    output: str = ""
    time: float = 0.0
    extra: dict = field(default_factory=dict)

    def as_dict(self):
        d = {"name": self.name, "task": self.task, "score": round(self.score, 4),
             "max_score": self.max_score if self.status != "not run" else 0.0, "status": self.status,
             "output": self.output, "time": round(self.time, 3)}
        d.update(self.extra)
        return d


@functools.lru_cache(maxsize=1)
def gpu_capability():
    """``(major, minor, name)`` of GPU 0, asked in a separate process (the grading parent keeps no CUDA
    context); None when it cannot be read."""
    code = "import torch; c = torch.cuda.get_device_capability(0); print(c[0], c[1], torch.cuda.get_device_name(0))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
        major, minor, name = out.strip().split(" ", 2)
        return int(major), int(minor), name
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


#: bfloat16 tensor cores (and Triton's bf16 ``tl.dot``) need sm_80; a T4 (sm_75) has none
BF16_CAPABILITY = (8, 0)


def bf16_fallback(cases, capability):
    """GPU grading on a GPU without bfloat16 (``capability`` ``(major, minor, name)`` below ``BF16_CAPABILITY``:
    a T4): every ``dtype="bfloat16"`` case runs as float16 instead (the same shapes and checks, float16's
    tolerance), so that the test still grades the kernel rather than the GPU; returns ``(cases, note)``, the
    note ("" if nothing changed) for the test's output. Where ``capability`` is None (CPU grading, or unknown)
    nothing changes: the interpreter computes bfloat16."""
    if capability is None or tuple(capability[:2]) >= BF16_CAPABILITY:
        return list(cases), ""
    out, n = [], 0
    for p in cases:
        if p.get("dtype") == "bfloat16":
            p, n = dict(p, dtype="float16"), n + 1
        out.append(p)
    if not n:
        return out, ""
    name = capability[2] if len(capability) > 2 else "this GPU"
    return out, (f"{n} bfloat16 case(s) run as float16: bfloat16 needs compute capability >= 8.0 (sm_80), "
                 f"{name} is sm_{capability[0]}{capability[1]}")


def detect_device(requested="auto") -> str:
    if requested == "cpu":
        return "cpu"
    try:
        import torch
        has = torch.cuda.is_available()
    except ImportError:
        has = False
    if requested == "cuda" and not has:
        raise RuntimeError("--device cuda was asked for but no CUDA device is available")
    return "cuda" if has else "cpu"


class Grader:
    """Grades submissions of one assignment. The constructor's arguments are the configuration; everything a
    grading learns (flags, zeroed tasks, children, crashes, load errors, results) is per run: ``grade()`` starts
    from a clean state (``_new_run``), so grading twice with one object gives the same result as two objects."""

    def __init__(self, assignment, device="cpu", seed=None, log=None, limits=None, only=None, case_timeout=None):
        self.spec = specs_mod.load(assignment)
        if case_timeout is not None:     # a cap on every task's time limit per case (this grader's copy of the spec)
            if not (isinstance(case_timeout, (int, float)) and case_timeout > 0):
                raise ValueError(f"case_timeout must be a positive number of seconds, got {case_timeout!r}")
            self.spec = dataclasses.replace(self.spec, tasks={
                tid: dataclasses.replace(t, case_timeout=min(t.case_timeout, float(case_timeout)))
                for tid, t in self.spec.tasks.items()})
        self.only = list(only or ())     # grade only the tests whose name contains one of these
        self.device = device
        self.seed = int.from_bytes(os.urandom(16), "little") if seed is None else int(seed)
        self.log = log or (lambda *a: None)
        self.limits = limits or Limits(address_space=self.spec.address_space if device == "cpu" else None,
                                       rss_bytes=self.spec.rss_limit)
        self._new_run()

    def _new_run(self):
        """The state of one grading run, all of it (nothing carries over from a previous ``grade()``)."""
        self.rng = np.random.default_rng(self.seed)
        self.flags = []
        self.zeroed = {}                 # task id -> reason
        self.sandbox = None
        self.compile_sandbox = None      # the compile child of ``Test.parent_check`` (a7's sm_90a checks)
        self.ref_sandbox = None
        self.ref_state = None
        self.restarts = 0
        self.current_task = None
        self.cells = []
        self._cells_msg = None           # (cells, the load message of those cells): ``_cells_message``
        self.names = {}
        self.load_info = {}
        self.load_failed = {}            # graded name -> "cell N failed while loading: ..."
        self.hint = None                 # "this looks like a2_flash_numpy ..." (wrong assignment?)
        self.load_broken = None          # why loading the cells killed the child (then no test reloads them)
        self.ref_task = None             # the task whose reference the reference child has loaded
        self.ref_error = ""              # why the reference child is broken
        self.results = []                # TestResults of the current grade()
        self.case_notes = {}             # test name -> how its cases were adapted to this GPU (bf16 -> fp16)
        self.dead_tasks = {}             # task id -> why its tests are skipped (it hung or kept crashing)
        self.crashes = {}                # task id -> children it killed (crash, memory, CUDA fault)
        self.case = None                 # the parameters of the case being run (for a crash's diagnosis)
        self.fresh_child = False         # the child hit a CUDA fault: the next test gets a new one
        self.child_task = None           # the task whose tests the current student child ran last
        self._flooded = set()            # output floods already reported
        # GPU timing lane (gpu_lane.py): correctness calls shared, a speed case's timed reps exclusive
        self.lane = Lane() if str(self.device).startswith("cuda") else NoLane()
        self._isolation = None

    # -- flags --------------------------------------------------------------------------------------------
    def flag(self, threat, task_ids, message, source, where=""):
        key = (threat, tuple(sorted(task_ids)), message)
        if any(f["_key"] == key for f in self.flags):
            return
        self.flags.append({"_key": key, "id": threat, "tasks": sorted(task_ids), "message": message,
                           "explanation": threats.explain(threat), "source": source, "where": where})
        if threat in ZEROING:
            for t in task_ids:
                self.zeroed.setdefault(t, f"{threat}: {message}")

    def _on_trap(self, h):
        task = self.current_task
        tasks = [task] if task else list(self.spec.tasks)
        self.flag(h.get("threat", threats.T10), tasks, f"runtime trap: {h.get('what')}", "runtime")
        if h.get("threat") == threats.T10 and task:
            self.flag(threats.T11, [task], f"forbidden call {h.get('what')} (recorded even if caught)", "runtime")

    # -- child management ---------------------------------------------------------------------------------
    def _graded_names(self):
        return [t.name for t in self.spec.tasks.values()]

    def _start_student(self, compile_only=False):
        device = "cpu" if compile_only else self.device
        limits = self.limits
        if compile_only and limits.address_space is None:
            limits = Limits(**{**limits.__dict__, "address_space": self.spec.address_space})
        sb = Sandbox(device, limits, "student", zygote="torch" if self.spec.needs_torch else "numpy",
                     compile_only=compile_only)
        try:
            return self._load(sb, device, compile_only)
        except BaseException:
            sb.stop()          # a child that failed to start or to load is nobody's to stop later: its processes
            raise              # and its folder (home, tmp, Triton cache) go now

    def _load(self, sb, device, compile_only):
        """Start ``sb`` and load the submission's cells in it; the checks on what loading did. Returns ``sb``."""
        sb.start(timeout=self.spec.load_timeout)
        sb.send({"t": "load", **self._cells_message(), "device": device, "compile_only": compile_only})
        self._isolation = isolation.describe(sb.isolation)
        if sb.limits.network_off:               # as the probe child's: its facts are what a probe would find
            _NET.setdefault(device, sb.network)
            _ISO.setdefault(device, self._isolation)
        try:
            h, _ = sb.recv(self.spec.load_timeout, expect="loaded", on_trap=self._on_trap)
        except SandboxDied as exc:
            reason = exc.reason
            if exc.kind == "timeout":
                reason = (f"the cells did not finish within the loading time limit of {self.spec.load_timeout:.0f} s "
                          "(an endless loop, or long work at the top level of a cell?)")
            # every later test says so at once, instead of loading (and waiting) again
            self.load_broken = f"loading the submission (running its cells) failed: {reason}"
            self.load_info = {"cells": len(self.cells), "load_time": None, "errors": [self.load_broken]}
            raise SandboxDied(self.load_broken, exc.kind) from None
        self.names = h.get("names", {})
        reports = h.get("cells", [])
        self.load_failed = failed_names(self.cells, reports, self._graded_names(), self.limits.file_bytes)
        self.load_info = {"cells": len(reports), "load_time": round(h.get("load_time", 0.0), 3),
                          "errors": [msg for _, msg in cell_failures(self.cells, reports, self.limits.file_bytes)][:10]}
        self._flooded |= set(sb.floods())    # output while loading is the cell's failure, not a task's flood
        for name in h.get("patched", []):
            self.flag(threats.T15 if name.startswith(("time.", "torch.cuda")) else threats.T3, list(self.spec.tasks),
                      f"patched {name} while loading", "runtime")
        if h.get("threads", 0) > 0:
            self.flag(threats.T13, list(self.spec.tasks), f"left {h['threads']} thread(s) running after loading",
                      "runtime")
        return sb

    def _cells_message(self) -> dict:
        """What every child of this run is sent to load the cells. The cells do not change within a run, and
        the given-code passes over them (``given_ranges``, ``host_policy.config``: AST parses and dumps of every
        cell) cost more than a child's start when a run restarts its child per task, so they run once."""
        if self._cells_msg is None or self._cells_msg[0] is not self.cells:
            self._cells_msg = self.cells, {"cells": [[c.index, c.source, c.name] for c in self.cells],
                               "names": self._graded_names(), "torch": self.spec.needs_torch,
                               "forbidden": list(self.spec.forbidden_imports), "given": given_ranges(self.cells),
                               "policy": host_policy.config(self.spec, self.cells)}
        return self._cells_msg[1]

    def student(self):
        if self.load_broken:
            raise SandboxDied(self.load_broken, "load")
        if self.sandbox is None:
            if self.restarts > MAX_RESTARTS:
                raise SandboxDied("too many crashes; the sandbox gave up", "gave-up")
            self.sandbox = self._start_student()
        return self.sandbox

    def compile_child(self):
        """The submission loaded in a compile child (``Sandbox(compile_only=True)``: the same isolation, Triton's
        interpreter off, no GPU) for ``Test.parent_check``; started once per grading, on any device."""
        if self.load_broken:
            raise SandboxDied(self.load_broken, "load")
        if self.compile_sandbox is None:
            if self.restarts > MAX_RESTARTS:
                raise SandboxDied("too many crashes; the sandbox gave up", "gave-up")
            self.compile_sandbox = self._start_student(compile_only=True)
        return self.compile_sandbox

    def drop_compile_child(self):
        if self.compile_sandbox is not None:
            self.compile_sandbox.stop()
            self.compile_sandbox = None
            self.restarts += 1

    def drop_student(self):
        self._flooded = set()
        if self.sandbox is not None:
            self.sandbox.stop()
            self.sandbox = None
            self.restarts += 1

    def reference(self, task):
        """A trusted child running the reference implementation (speed baselines only, never the student's)."""
        if self.ref_state == "broken":
            return None
        if self.ref_sandbox is None:
            name, src = _reference_source(task)
            try:
                sb = Sandbox(self.device, Limits(address_space=None, network_off=True), "reference")
                sb.start(timeout=self.spec.load_timeout)
                sb.send({"t": "load", "cells": [[0, src]], "names": [name], "device": self.device,
                         "torch": self.spec.needs_torch, "trusted": True})
                h, _ = sb.recv(self.spec.load_timeout, expect="loaded")
                if not h["cells"][0]["ok"]:
                    sb.stop()
                    self.ref_state = "broken"
                    self.ref_error = h["cells"][0]["error"]
                    return None
                self.ref_sandbox, self.ref_task = sb, task.id
            except SandboxDied as exc:
                self.ref_state = "broken"
                self.ref_error = exc.reason
                return None
        if self.ref_task != task.id:
            name, src = _reference_source(task)
            self.ref_sandbox.send({"t": "load", "cells": [[0, src]], "names": [name],
                                   "device": self.device, "torch": self.spec.needs_torch, "trusted": True})
            self.ref_sandbox.recv(self.spec.load_timeout, expect="loaded")
            self.ref_task = task.id
        return self.ref_sandbox

    def _drop_reference(self, why):
        if self.ref_sandbox is not None:
            self.ref_sandbox.stop()
        self.ref_sandbox, self.ref_state, self.ref_error = None, "broken", why

    # -- one call -----------------------------------------------------------------------------------------
    def run_call(self, sb, task, call, trace_memory=False, timeout=None, on_trap=None):
        """Send one case, return the raw result header+arrays (or an error header)."""
        header, arrays = call_to_wire(call)
        with self.lane.shared():           # never inside another grading's timed reps on this GPU
            sb.send({"t": "call", "name": task.name, "header": header, "trace_memory": trace_memory,
                     "audit": task.framework == "torch"}, arrays)
            h, arrs = sb.recv(timeout or task.case_timeout, expect=("result", "error"), on_trap=on_trap)
        return h, arrs, {k: array_hash(a) for k, a in arrays.items()}

    def judge(self, task, call, h, arrs, sent, memory_limit=None, test=None, params=None) -> Verdict:
        if h["t"] == "error":
            msg = "not implemented yet (NotImplementedError)" if h["exc"] == "NotImplementedError" else \
                f"raised {h['exc']}: {h['msg']}" + (f" [{h['tb'].splitlines()[-1]}]" if h.get("tb") else "")
            self._after_call(task, h)
            if diagnose.is_cuda_fault(h.get("msg", "")):
                msg = self._cuda_fault(task, h)
            elif h["exc"] == "OutOfBoundsAccess":
                # the case is named by the caller's "[case n: ...]"
                msg = diagnose.out_of_bounds(task.name, "", h.get("msg", ""), task.tiled, self.case)
            return Verdict(False, float("inf"), msg)
        h["arrays"] = _host_arrays(h, arrs)
        v = evaluate(call, h, sent, self.device, memory_limit)
        for threat, msg in v.flags:
            self.flag(threat, [task.id], msg, "runtime")
        self._after_call(task, h)
        why = self._authorship(task, h, v.passed)
        if why:
            return Verdict(False, v.err, why)
        if v.passed and test is not None and test.evidence is not None:
            lacking = test.evidence(params or {}, h.get("audit") or {})
            if lacking:
                return Verdict(False, v.err, lacking)
        return v

    def _authorship(self, task, h, passed=True) -> str | None:
        """A Triton part's call (``framework == "torch"``) is judged by what it did, never by its values
        (docs/design.md §6, T10/T20): the op audit's findings (``evaluate.audit_verdict``) and whether any
        Triton kernel ran at all (asked only of a correct answer: an unfinished function that returns zeros
        launches nothing and is merely wrong). Either is positive evidence and flags T10."""
        if task.framework != "torch":
            return None
        host_policy.note_kernels(self, task, h)      # for the GPU-target compile of its kernels (grade's end)
        why = audit_verdict(task, h.get("audit"))
        if why is None and passed and h.get("launches") == 0:
            why = "no Triton kernel was launched (the work must be done in Triton)"
        if why:
            self.flag(threats.T10, [task.id], why, "runtime")
        return why

    def _cuda_fault(self, task, h) -> str:
        """A CUDA fault raised as an exception: the child lives on, but its CUDA context is broken (the error
        is sticky), so the next test, of this task or another, runs in a fresh child."""
        self.fresh_child = True
        case = _describe(self.case) if self.case else ""
        msg = diagnose.crash(task.name, case, "crash", f"{h.get('exc')}: {h.get('msg', '')}",
                             task.framework == "torch", task.tiled, self.case)
        self.crashes[task.id] = self.crashes.get(task.id, 0) + 1
        if self.crashes[task.id] >= CRASHES_PER_TASK:
            self.dead_tasks[task.id] = f"{task.name} crashed on an earlier test ({msg})"
        return msg

    def _after_call(self, task, h):
        for name in h.get("patched", []) or []:
            self.flag(threats.T15 if name.startswith(("time.", "torch.cuda")) else threats.T3, [task.id],
                      f"patched {name}", "runtime")

    # -- tests --------------------------------------------------------------------------------------------
    def not_run_here(self, test) -> str | None:
        """Why ``test`` cannot run on this device (it is then "not run", excluded from max_score), or None."""
        if test.gpu_only and self.device == "cpu":
            return "not run: no GPU (excluded from max_score)"
        if test.min_capability and self.device != "cpu":
            cap = gpu_capability()
            need = tuple(test.min_capability)
            if cap is not None and cap[:2] < need:
                return (f"not run: needs a GPU of compute capability >= {need[0]}.{need[1]} (sm_{need[0]}{need[1]}"
                        f"{', Hopper: float8 tensor cores' if need == (9, 0) else ''}); this GPU ({cap[2]}) is "
                        f"sm_{cap[0]}{cap[1]} (excluded from max_score)")
        return None

    def cases_for(self, test):
        cases = [p for p in test.hidden_cases(self.rng) if not (p.get("gpu") and self.device == "cpu")]
        if self.device != "cpu":
            cases, note = bf16_fallback(cases, gpu_capability())
            if note:
                self.case_notes[test.name] = note
        if test.kind in ("correctness",) and cases:
            cases.append(dict(cases[0]))     # the same shape again with fresh values: defeats caching (T5)
        return cases

    def run_test(self, test, task) -> TestResult:
        res = TestResult(test.name, test.task, float(test.points))
        why = self.not_run_here(test)
        if why:
            res.status, res.output = "not run", why
            return res
        # a task flagged by the static scan still runs (its traps and limits are exercised, the student sees
        # what happened); one already zeroed by a flag raised while it ran is not run again: every test of it
        # scores 0 whatever it returns (the flag says why), and a cheat's remaining cases cost grading time
        if task.id in self.dead_tasks:
            res.output = f"skipped: {self.dead_tasks[task.id]}"
            return res
        caught = next((f for f in self.flags if f["source"] == "runtime" and f["id"] in ZEROING
                       and task.id in f["tasks"]), None)
        if caught is not None:
            res.output = f"skipped: zeroed ({caught['id']}: {caught['message']})"
            return res
        t0 = time.monotonic()
        if test.parent_check is not None:
            self._parent_check(test, task, res)
            res.time = time.monotonic() - t0
            return res
        self._child_per_kernel_task(task)
        try:
            sb = self.student()
        except SandboxDied as exc:
            res.output = f"could not run: {exc.reason}"
            self.drop_student()
            return res
        if task.name in self.load_failed:
            res.output = self.load_failed[task.name]
            return res
        kind = self.names.get(task.name)
        if kind is None:
            res.output = f"{task.name} is not defined in the submission"
            if self.hint:
                res.output += f"; {self.hint}"
            if self.load_info.get("errors"):
                res.output += f" ({self.load_info['errors'][0]})"
            return res
        self.current_task, self.case = task.id, None
        try:
            if test.kind == "speed":
                self._speed(test, task, res)
            else:
                self._correctness(test, task, res, sb)
        except SandboxDied as exc:
            res.score, res.status = 0.0, "failed"
            res.output = self._died(task, exc)
        finally:
            self.current_task = None
            res.time = time.monotonic() - t0
            if test.name in self.case_notes:
                res.output = f"{res.output} ({self.case_notes[test.name]})" if res.output else \
                    self.case_notes[test.name]
        self._check_floods(task)
        if self.fresh_child:                 # a CUDA fault: this child's CUDA context is broken for every task
            self.fresh_child = False
            self.drop_student()
        return res

    def _child_per_kernel_task(self, task):
        """In Triton's interpreter (CPU) a store past a tensor's end writes into the child's heap: it may crash at
        once, later, or never. So each function after a Triton part runs in a fresh child, and a corruption left
        by one function cannot crash, and cost points to, another. (Not a restart: a crash budget is not spent.)"""
        prev = self.child_task
        self.child_task = task.id
        if self.sandbox is None or self.device != "cpu" or prev in (None, task.id):
            return
        if self.spec.tasks[prev].framework == "torch":
            self._flooded = set()
            self.sandbox.stop()
            self.sandbox = None

    def _check_floods(self, task):
        """T17 on positive evidence only: a file of the child at the file-size limit (output or disk flood)."""
        if self.sandbox is None:
            return False
        hit = False
        for f in set(self.sandbox.floods()) - self._flooded:
            self._flooded.add(f)
            hit = True
            self.flag(threats.T17, [task.id], f"{task.name} filled {f} up to the file-size limit "
                                        f"({self.limits.file_bytes >> 20} MiB; output/disk flood)", "sandbox")
        return hit

    def _died(self, task, exc) -> str:
        """The student child died, hung or was killed while running ``task``: the failed test's diagnosis (a
        crash is a wrong program, not cheating: no flag unless a flood shows a process trick). The next test
        runs in a fresh child; a task that hung, or died ``CRASHES_PER_TASK`` times, is not run again."""
        flooded = self._check_floods(task)
        if not flooded and "SIGXFSZ" in exc.reason:      # killed at the file-size limit: a flood all the same
            flooded = True
            self.flag(threats.T17, [task.id], f"{task.name}: {exc.reason}", "sandbox")
        case = _describe(self.case) if self.case else ""
        msg = diagnose.crash(task.name, case, exc.kind, exc.reason, task.framework == "torch", task.tiled,
                             self.case, task.case_timeout)
        if exc.kind not in ("timeout", "crash"):
            msg = exc.reason
        self.crashes[task.id] = self.crashes.get(task.id, 0) + 1
        if exc.kind == "timeout" or self.crashes[task.id] >= CRASHES_PER_TASK or flooded:
            what = "hung" if exc.kind == "timeout" else "crashed"
            self.dead_tasks[task.id] = f"{task.name} {what} on an earlier test ({msg})"
        self.drop_student()
        return msg

    def _parent_check(self, test, task, res):
        """``test.parent_check(ChildChecks)``: the compile child computes (probes, compiles), this process judges."""
        self.current_task = task.id
        try:
            ok, msg = test.parent_check(ChildChecks(self, self.compile_child(), task))
            res.score, res.status = (float(test.points), "passed") if ok else (0.0, "failed")
            res.output = msg
        except ChildError as exc:
            res.output = str(exc)
        except SandboxDied as exc:          # a failed check with the reason, never a flag by itself (T20)
            res.output = exc.reason
            self.drop_compile_child()
        finally:
            self.current_task = None

    def _correctness(self, test, task, res, sb):
        worst, n = 0.0, 0
        for params in self.cases_for(test):
            call = task.build(params, self.rng)
            if call.mode != "script":
                call.expected = task.oracle(call)
            limit = test.memory_limit(params) if test.memory_limit else None
            self.case = params
            h, arrs, sent = self.run_call(sb, task, call, trace_memory=limit is not None, on_trap=self._on_trap)
            v = self.judge(task, call, h, arrs, sent, limit, test=test, params=params)
            n += 1
            if not v.passed:
                res.output = f"{v.message} [case {n}: {_describe(params)}]"
                res.extra["rel_error"] = None if not np.isfinite(v.err) else v.err
                return
            worst = max(worst, v.err if np.isfinite(v.err) else 0.0)
            if test.kind == "memory" and h.get("peak") is not None:
                res.extra["peak_mib"] = round(h["peak"] / 2 ** 20, 2)
        res.score, res.status = float(test.points), "passed"
        res.extra["rel_error"] = worst
        res.output = f"{n} case(s) passed, max relative error {worst:.1e}" + \
            (f", peak {res.extra['peak_mib']} MiB" if "peak_mib" in res.extra else "")

    def _timed(self, sb, task, header, arrays, fetch, on_trap=None, audit=False):
        """One timed call: ``call`` (inputs as seeds) -> ``armed`` -> go (parent clock starts) -> ``done`` ->
        ``fetch`` (whole outputs or a seeded sample, decided by the parent only now) -> ``result``. ``audit``:
        under the op audit (the warm-up rep of a Triton part, in both children; timed reps run without it, since
        its per-op cost, 40-290 us a call on an H100, would move the ratio: benchmarks/grader/bench_audit_overhead.py)."""
        sb.send({"t": "call", "name": task.name, "header": header, "timed": True,
                 "audit": bool(audit) and task.framework == "torch"}, arrays)
        h, _ = sb.recv(task.case_timeout, expect=("armed", "error"), on_trap=on_trap)
        if h["t"] == "error":
            return h, {}, None, None
        t0 = time.perf_counter()
        sb.send({"t": "go"})
        h, _ = sb.recv(task.case_timeout, expect=("done", "error"), on_trap=on_trap)
        wall = time.perf_counter() - t0
        if h["t"] == "error":
            return h, {}, None, None
        child_t = {"host": h.get("elapsed"), "device": h.get("device_s"), "device_error": h.get("device_error")}
        sb.send({"t": "fetch", **fetch})
        h, arrs = sb.recv(task.case_timeout, expect=("result", "error"), on_trap=on_trap)
        return h, _host_arrays(h, arrs), wall, child_t

    def _check_timed(self, task, template, hs, as_, hr, ar):
        """Judge a timed output against the reference child's output for the same seeds (2x tolerance): the
        same checks as a correctness call (exact type, dtype, device, NaN/inf, relative error, inputs unchanged,
        no threads left), on whole outputs or on the same seeded sample of both."""
        outs = [Out(o.name, o.dtypes, o.tol * 2, o.framework) for o in template.outs]
        call = Call(template.args, template.kwargs, outs, mode=template.mode, arg_names=template.arg_names)
        call.expected = [ar[i] if i < len(ar) else None for i in range(len(outs))]
        hs["arrays"] = as_
        for o, si, ri in zip(outs, hs.get("outs", []), hr.get("outs", [])):
            if "shape" in si and si.get("shape") != ri.get("shape"):
                return Verdict(False, float("inf"), f"{o.name}: shape {tuple(si['shape'])}, expected "
                                                    f"{tuple(ri.get('shape', ()))}")
        sent = {k: "same" for k in hr.get("hashes", {})}
        v = evaluate(call, hs, sent, self.device, None)
        for threat, msg in v.flags:
            self.flag(threat, [task.id], msg, "runtime")
        why = self._authorship(task, hs, v.passed)         # timed calls are audited like every other call
        if why:
            return Verdict(False, v.err, why, [(threats.T10, why)])
        return v

    def _speed(self, test, task, res):
        """Time every case (``_time_case``), flag wrong timed outputs, then score the ratios (``_speed_score``)."""
        ref = self.reference(task)
        if ref is None:
            res.status = "not run"
            res.output = f"not run: reference implementation unavailable ({self.ref_error[:200]})"
            return
        ratios = []
        for params in self.cases_for(test):
            if params.get("shift") or params.get("mag"):
                raise ValueError("speed cases draw standard-normal inputs in the children; shift/mag not supported")
            t = self._time_case(test, task, ref, params)
            if t.stop is not None:
                res.output = t.stop
                res.status = t.status or res.status
                if t.wrong and not t.flagged and all(r.status == "passed" for r in self.results
                                                     if r.task == task.id and r.name != test.name):
                    self.flag(threats.T16, [task.id], "timed calls returned wrong results although the correctness "
                                                "tests passed (cached or replayed answers)", "runtime")
                return
            clock, student, reference = t.clock()
            student_s, reference_s = statistics.median(student), statistics.median(reference)
            ratios.append(student_s / max(reference_s, 1e-9))
            res.extra.setdefault("speed", []).append({
                "case": _describe(params), "student_s": student_s, "reference_s": reference_s, "clock": clock,
                "student_host_s": statistics.median(t.student), "reference_host_s": statistics.median(t.reference),
                "lane_wait_s": t.lane_wait, **({"clock_note": t.clock_note} if t.clock_note else {})})
        _speed_score(test, res, ratios)

    def _time_case(self, test, task, ref, params) -> "_Timing":
        """``_time_reps`` with this GPU's timing lane held exclusively from the first timed rep to the last, the
        student's and the reference's calls alike (``gpu_lane.py``), released however the case ends."""
        with contextlib.ExitStack() as lane:
            return self._time_reps(test, task, ref, params, lane)

    def _time_reps(self, test, task, ref, params, lane) -> "_Timing":
        """Student child and reference child alternate on the same fresh inputs, drawn in each child from
        per-rep seeds (nothing large travels). Rep 0 warms up (autotuning, compilation) untimed. Every rep's
        outputs are compared with the reference child's: whole on rep 1 and one random later rep, a seeded
        sample of ``SAMPLE`` elements otherwise (T5/T16). Returns the timed reps, or why the case stopped."""
        template = task.build(params, self.rng)     # shapes, dtypes and integer arguments (seq_lens, tables)
        self.case = params
        full_reps = {1, int(self.rng.integers(2, test.reps + 1))} if test.reps >= 2 else {1}
        timing = _Timing()
        for rep in range(test.reps + 1):                       # rep 0 is a warm-up (checked, not timed)
            if rep == 1:
                timing.lane_wait = lane.enter_context(self.lane.exclusive())
            seeds = {key: int(self.rng.integers(1 << 62)) for key, _ in template.arrays()}
            header, arrays = call_to_wire(template, gen_seeds=seeds)
            fetch = {"full": rep in full_reps, "seed": int(self.rng.integers(1 << 62)), "k": SAMPLE}
            order = (0, 1) if rep % 2 == 0 else (1, 0)       # alternate who goes first
            out = {}
            for who in order:
                sb = self.student() if who == 0 else ref
                try:
                    out[who] = self._timed(sb, task, header, arrays, fetch, self._on_trap if who == 0 else None,
                                           audit=rep == 0)
                except SandboxDied as exc:
                    if who == 0:
                        raise                        # the student's child: a failed test with a diagnosis
                    self._drop_reference(exc.reason)   # the reference's own failure costs the student nothing
                    timing.stop, timing.status = f"not run: the reference failed ({exc.reason})", "not run"
                    return timing
            (hs, as_, ws, cs), (hr, ar, wr, cr) = out[0], out[1]
            if hr["t"] != "result":
                timing.stop, timing.status = f"not run: the reference failed ({hr.get('exc')}: {hr.get('msg')})", \
                    "not run"
                return timing
            if hs["t"] != "result":
                timing.stop = f"timed call raised {hs.get('exc')}: {hs.get('msg', '')[:200]}"
                self._after_call(task, hs)
                if diagnose.is_cuda_fault(hs.get("msg", "")):
                    timing.stop = self._cuda_fault(task, hs)
                return timing
            v = self._check_timed(task, template, hs, as_, hr, ar)
            self._after_call(task, hs)
            if not v.passed:
                timing.stop = (f"a timed call returned a wrong result: {v.message} (rep {rep}, "
                               f"{'whole output' if fetch['full'] else 'sampled'})")
                timing.wrong, timing.flagged = True, bool(v.flags)
                return timing
            if rep == 0:
                continue
            timing.student.append(pick_time(ws, cs["host"]))
            timing.reference.append(pick_time(wr, cr["host"]))
            timing.student_dev.append(pick_device(ws, cs))
            timing.reference_dev.append(pick_device(wr, cr))
            timing.clock_note = timing.clock_note or cs.get("device_error") or cr.get("device_error")
        return timing

    # -- the whole submission -----------------------------------------------------------------------------
    def grade(self, path) -> dict:
        with _own_zygotes(self.spec, self.device):
            return self._grade(path)

    def _grade(self, path) -> dict:
        t0 = time.monotonic()
        self._new_run()
        error = None
        try:
            self.cells = load_cells(path)
        except SubmissionError as exc:
            self.cells, error = [], str(exc)
        self.hint = None if error else looks_like(self.cells, self.spec.id)
        if not error:
            findings, attribution = scan(self.cells, self._graded_names(), self.spec.forbidden_imports)
            by_name = {t.name: t.id for t in self.spec.tasks.values()}
            cell_names = {c.index: c.name for c in self.cells}
            for f, names in zip(findings, attribution):
                if names:
                    self.flag(f.threat, [by_name[n] for n in names], f.message, "static",
                              f"{cell_names.get(f.cell, f'cell {f.cell}')}, line {f.line}" + (f", in {f.scope}" if f.scope else ""))
        tests = [t for t in self.spec.tests if not self.only or any(o in t.name for o in self.only)]
        if not tests:
            raise ValueError(f"no test of {self.spec.id} matches {self.only}")
        try:
            for test in tests:
                task = self.spec.tasks[test.task]
                # each test draws from its own stream of the seed, so --seed S --test NAME reproduces it alone
                self.rng = np.random.default_rng([self.seed, zlib.crc32(test.name.encode())])
                if error:
                    r = TestResult(test.name, test.task, float(test.points), output=f"submission unreadable: {error}")
                    why = self.not_run_here(test)
                    if why:
                        r.status, r.output = "not run", why
                elif time.monotonic() - t0 > self.spec.total_timeout:
                    r = TestResult(test.name, test.task, float(test.points),
                                   output=f"skipped: total time limit of {self.spec.total_timeout:.0f} s reached")
                else:
                    r = self.run_test(test, task)
                self.log(r)
                self.results.append(r)
            host_policy.gpu_compile_check(self)          # kernels that ran interpreted: sm_90a frontend
        finally:
            for sb in (self.sandbox, self.compile_sandbox, self.ref_sandbox):
                if sb is not None:
                    sb.stop()
            self.compile_sandbox = None
        for r in self.results:                     # flags raised after a test ran still zero it
            if r.task in self.zeroed and r.score > 0:
                r.score, r.status = 0.0, "failed"
                r.output = f"zeroed: {self.zeroed[r.task]}"
        apply_gates(self.spec, self.results)
        return self.report(path, time.monotonic() - t0, error)

    def report(self, path, elapsed, error=None) -> dict:
        from .report import totals as report_totals
        # optional tests (``Test.optional``) are bonus: ``score``/``max_score`` count the required ones only
        optional = {t.name for t in self.spec.tests if t.optional}
        tests = [{**r.as_dict(), "optional": r.name in optional} for r in self.results]
        flags = [{k: v for k, v in f.items() if k != "_key"} for f in self.flags]
        return {
            "assignment": self.spec.id, "submission": str(path), "seed": str(self.seed),
            **report_totals(tests),
            "device": self.device, "tests": tests, "flags": flags,
            "submission_error": error, "load": self.load_info, "hint": self.hint,
            "sandbox": {"network": self.sandbox_network(), **self.sandbox_isolation(),
                        "restarts": max(0, self.restarts),
                        "rlimits": {"cpu_s": self.limits.cpu_seconds, "file_bytes": self.limits.file_bytes,
                                    "address_space": self.limits.address_space,
                                    "nproc": "not enforced for root" if os.getuid() == 0 else
                                    f"current tasks + {self.limits.extra_tasks}",
                                    "rss_watchdog": self.limits.rss_bytes}},
            "execution_time": round(elapsed, 3),
        }

    def sandbox_network(self):
        return _probe_network(self.device)

    def sandbox_isolation(self):
        """``checkout``/``processes``: whether the checkout was hidden and processes contained (words)."""
        if getattr(self, "_isolation", None) is None:
            _probe_network(self.device)
            self._isolation = _ISO.get(self.device) or isolation.describe(None)
        return self._isolation


_NET, _ISO = {}, {}


class ChildChecks:
    """What a ``Test.parent_check`` may ask of the compile child (``gluon_child``), answers checked for shape
    here; a failure raises ``ChildError`` (the test's message). The verdict is the check's, in this process."""

    def __init__(self, grader, sb, task):
        self.grader, self.sb, self.task = grader, sb, task
        self.rng = grader.rng            # the test's own stream of the grading seed (``--seed`` reproduces it)

    def _ask(self, header):
        self.sb.send(header)
        h, arrs = self.sb.recv(self.task.case_timeout, expect=("result", "error"), on_trap=self.grader._on_trap)
        self.grader._after_call(self.task, h)
        if h["t"] == "error":
            raise ChildError("not implemented yet (NotImplementedError)" if h["exc"] == "NotImplementedError" else
                             f"raised {h['exc']}: {h['msg']}" + (f" [{h['tb'].splitlines()[-1]}]" if h.get("tb") else ""))
        return h, arrs

    def probe(self, name: str, args: list) -> list[int]:
        """``name.fn(*a)`` for each ``a`` in ``args`` (integer tuples), evaluated in the child: a list of ints."""
        h, _ = self._ask({"t": "probe", "name": name, "args": [[int(x) for x in a] for a in args]})
        vals = h.get("values")
        if not isinstance(vals, list) or len(vals) != len(args) or not all(type(v) is int for v in vals):
            raise ChildError(f"{name}: the compile child sent back no list of {len(args)} integers")
        return vals

    def compile(self, name: str, signature: dict, constexprs: dict, num_warps: int, maxnreg=None) -> dict:
        """``name`` compiled for sm_90a in the child: ``{"ptx": str, "cubin": bytes, "shared": int, "name": str}``.
        Within a run of the bundled submissions (``host_policy.CACHE_ENV``), a submission whose code is the same
        as one compiled before (``_artifact_key``) gets that compile's artifacts; only a compile that raised no
        flag in its grading is kept."""
        key = _artifact_key(self.grader.cells, name, signature, constexprs, num_warps, maxnreg)
        hit, art = host_policy.shared_read(key)
        if hit:
            return {**art, "cubin": base64.b64decode(art["cubin"])}
        h, arrs = self._ask({"t": "compile", "name": name, "signature": signature, "constexprs": constexprs,
                             "num_warps": num_warps, "maxnreg": maxnreg})
        ptx, cubin = arrs.get("ptx"), arrs.get("cubin")
        if ptx is None or cubin is None or ptx.dtype != np.uint8 or cubin.dtype != np.uint8 or ptx.ndim != 1:
            raise ChildError(f"{name}: the compile child sent back no PTX and cubin")
        out = {"ptx": ptx.tobytes().decode("utf-8", "replace"), "cubin": cubin.tobytes(),
               "shared": int(h.get("shared", 0)), "name": str(h.get("name", ""))}
        if not self.grader.flags:
            host_policy.shared_write(key, {**out, "cubin": base64.b64encode(out["cubin"]).decode()})
        return out


def _artifact_key(cells, name, signature, constexprs, num_warps, maxnreg) -> str:
    """A compile request on a submission's code, read by this process: every cell as Python's parser sees it
    (comments, such as a mutant's header, blank lines and cells of comments only left out) and the request. Two
    submissions with one key differ at most in comments, line and cell numbers, which change the PTX's debug lines
    and nothing that is judged."""
    import ast
    import hashlib
    import json
    h = hashlib.sha256(json.dumps([name, signature, constexprs, num_warps, maxnreg], sort_keys=True).encode())
    for c in cells:
        try:
            tree = ast.parse(c.source)
            if not tree.body:
                continue
            h.update(ast.dump(tree).encode())
        except (SyntaxError, ValueError):
            h.update(c.source.encode())
        h.update(b"\0")
    return "sm90a-" + h.hexdigest()[:32]


def apply_gates(spec, results) -> None:
    """A failed gate test (``Test.gate``: the defining property of its task, e.g. a1's online_softmax streams)
    zeroes every other test of that task. Only a gate that ran and failed counts (``--test`` may leave it out)."""
    gates = {t.name for t in spec.tests if t.gate}
    failed = {r.task: r.name for r in results if r.name in gates and r.status == "failed"}
    for r in results:
        if r.task in failed and r.name != failed[r.task] and r.score > 0:
            fn = spec.tasks[r.task].name
            r.score, r.status = 0.0, "failed"
            r.output = f"zeroed: {failed[r.task]} failed (the defining property of {fn})"


def _probe_network(device):
    if device not in _NET:
        sb = Sandbox(device, Limits(address_space=None), "probe")
        try:
            sb.start(timeout=30)
            _NET[device] = sb.network
            _ISO[device] = isolation.describe(sb.isolation)
        except SandboxDied as exc:
            _NET[device] = f"unknown ({exc.reason})"
        finally:
            sb.stop()
    return _NET[device]


def given_ranges(cells) -> dict:
    """cell index -> [(first line, last line)] of its top-level functions that are the assignment's given code
    (``autograder.given``): the op audit exempts what they compute (a3b's torch forward)."""
    from .given import given_functions
    return given_functions(cells)


def _host_arrays(h, arrs):
    """Output arrays of a result frame, in order, bf16 bits turned back into float32 (``runner.from_wire``)."""
    outs = h.get("outs", []) or []
    return [from_wire(info, arrs.get(str(i))) for i, info in enumerate(outs)]


def _reference_source(task):
    """``(name, source)`` that the trusted reference child runs: the reference function bound under the task's
    own name (the child calls the task by name, and a task such as a3's ``flash_attention_forward_basic`` or
    ``flash_attention_forward_fp8`` is timed against a reference of another name); ``reference_kwargs`` are
    bound with functools.partial. A speed baseline does the input checks the assignment's given code does, no
    more, no fewer: a4/a5 time ``autograder.baselines`` (``tests/test_speed_fairness.py``)."""
    mod, _, name = task.reference.partition(":")
    bound = f"functools.partial(_reference, **{task.reference_kwargs!r})" if task.reference_kwargs else "_reference"
    return task.name, f"import functools\nfrom {mod} import {name} as _reference\n{task.name} = {bound}\n"


@dataclass
class _Timing:
    """One speed case: seconds per timed rep (student, reference), or why the case stopped (``stop``, the result's
    output line; ``status`` "not run" when the reference failed; ``wrong`` a timed output was wrong, ``flagged``
    already flagged by the check)."""
    student: list = field(default_factory=list)
    reference: list = field(default_factory=list)
    stop: str | None = None
    status: str | None = None
    wrong: bool = False
    flagged: bool = False
    student_dev: list = field(default_factory=list)      # the device's clock per rep (None: not measured)
    reference_dev: list = field(default_factory=list)
    lane_wait: float | None = 0.0                         # seconds waited for the GPU lane (None: gave up)
    clock_note: str | None = None

    def clock(self):
        """``(clock, student, reference)``: the device's clock where every timed rep of both children has it
        (device_clock.py: the GPU work alone, what the speed test grades), else the host clock for both. Work
        done off the GPU is invisible to the device clock, so a student call whose host time is over
        ``OFF_GPU_FACTOR`` times the reference's and ``OFF_GPU_SLACK_S`` longer (the answer computed on the CPU
        in timed reps, which run without the op audit) is graded on the host clock as well."""
        dev = self.student_dev + self.reference_dev
        if dev and all(x is not None for x in dev):
            hs, hr = statistics.median(self.student), statistics.median(self.reference)
            if hs > OFF_GPU_FACTOR * hr and hs - hr > OFF_GPU_SLACK_S:
                self.clock_note = (f"host clock: the calls took {hs * 1e3:.1f} ms on the host against the "
                                   f"reference's {hr * 1e3:.1f} ms (work done off the GPU)")
                return "host", self.student, self.reference
            return "device", self.student_dev, self.reference_dev
        return "host", self.student, self.reference


#: a student call this much slower than the reference's on the host clock, and by more than the slack, is
#: graded on the host clock (profiled a4/a5 calls on an H200: student/reference host time 0.76-1.49)
OFF_GPU_FACTOR, OFF_GPU_SLACK_S = 3.0, 0.005


def _own_zygotes(spec, device):
    """Zygotes for one grading (``zygote.running``: started unless a caller's are named in the environment, as
    the selftest's and grade-all's are) when it grades a torch assignment on a CPU: its children (one per function
    after a Triton part, and the sm_90a compile children) fork with torch and Triton imported instead of importing
    both each. An a3 solution graded alone: 9.1-10.7 s -> 4.7-4.9 s wall, 9-11 -> 7 CPU-s. A NumPy child starts in
    0.2 s, so a NumPy assignment gets none (its zygote costs what it saves); nor does a GPU grading (CUDA must not
    be initialised before a fork)."""
    if device != "cpu" or not spec.needs_torch:
        return contextlib.nullcontext()
    from .zygote import running
    return running("cpu")


def _speed_score(test, res, ratios) -> None:
    """Score a speed test from its cases' time ratios (student / reference): the geometric mean ``r`` gets full
    points at ``r <= speed_full``, none at ``r >= speed_zero``, linear in between."""
    ratio = float(np.exp(np.mean(np.log(ratios))))
    frac = min(1.0, max(0.0, (test.speed_zero - ratio) / (test.speed_zero - test.speed_full)))
    res.score = float(test.points) * frac
    res.status = "passed" if frac >= 1.0 else ("partial" if frac > 0 else "failed")
    res.extra["ratio"] = ratio
    res.extra["speedup"] = 1.0 / ratio
    res.output = (f"{ratio:.2f}x the reference time (full points at <= {test.speed_full}x, none at >= "
                  f"{test.speed_zero}x)")


def pick_time(wall, child):
    """The parent's clock is authoritative; the child's (synchronised) clock is used when consistent with it
    (it excludes pipe latency, which matters for sub-millisecond GPU kernels). A child clock larger than the
    parent's, or non-positive, means tampering (T15) and is ignored."""
    if child is not None and 0 < child <= wall:
        return child
    return wall


def pick_device(wall, clocks):
    """The child's device time of a timed call, when plausible: positive and within the parent's go->done
    clock (a larger one is not the device's; None then, and the case falls back to the host clock)."""
    d = clocks.get("device")
    if isinstance(d, (int, float)) and 0 < d <= wall:
        return float(d)
    return None


def _describe(p: dict) -> str:
    keep = []
    for k, v in p.items():
        if k in ("torch", "gpu"):
            continue
        if isinstance(v, list) and len(v) > 6:
            v = f"[{len(v)} items]"
        keep.append(f"{k}={v}")
    return ", ".join(keep)
