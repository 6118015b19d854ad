"""Compile-only checks of a7's Gluon kernel for sm_90a on a machine without a GPU (issue 24, item 2).

The grading child runs the Triton interpreter on CPU, and the interpreter cannot compile Gluon, so these checks
run from the grading parent (``Test.parent_check``, ``engine.Grader.run_test``): ``compile_usage(code, turns)``
executes the submission's code cells (the grader's own cell list: ``check``/``skip`` cells dropped) in a
**separate process** with ``TRITON_INTERPRET=0`` and no GPU, compiles its ``_fwd_pingpong_kernel`` for sm_90a
and returns registers, spills and the mbarrier / wgmma-wait counts of its PTX and SASS
(``reference.triton.hopper._aot.resource_usage(barriers=True)``), or ``{"error": ...}``. The same process
evaluates the student's ``_turn_phase`` as plain Python (``.fn``) on random rounds and plays the turns through
the mbarrier rule with the grader's own model (``reference.simulators.mbarrier.MBarrier``), so a wrong phase is
caught without ever running the kernel (on a GPU it would hang).

Verdicts: ``judge_phases`` (the phase formula and the turn order) and ``judge_compile(with_turns, without)`` (it
compiles, nothing spills, the turn adds exactly one mbarrier wait and one arrival per matmul round and consumer:
3 rounds in the code x 2 consumers = 6 each, so a missing ``_take_turn`` wait or ``_give_turn`` arrive shows as
a smaller difference; the matmuls are wgmma).

Isolation: the compile process is not the grading sandbox (no namespaces, no traps): it runs with a scrubbed
environment, an empty working directory, resource limits and a time limit, but it executes the submission's
code. a7 is optional and graded by an instructor's ``python -m autograder grade``; do not offer it on an
untrusted autograding service before it runs inside ``autograder.sandbox``.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUNDS_PER_CONSUMER, CONSUMERS = 3, 2

_CHILD = r"""
import importlib.util, json, os, sys
import numpy as np
from reference.simulators.mbarrier import MBarrier
from reference.triton.hopper._aot import compile_gluon, descriptor_signature, resource_usage
path = sys.argv[1]
spec = importlib.util.spec_from_file_location("a7_submission", path)   # a real file: @gluon.jit reads its source
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
ns = vars(mod)
out = {}
fn = getattr(ns.get("_turn_phase"), "fn", ns.get("_turn_phase"))
rng = np.random.default_rng(int(sys.argv[2]))
rounds, wgs = rng.integers(0, 10_000, 200), rng.integers(0, 2, 200)
try:
    got = [int(fn(int(r), int(w))) for r, w in zip(rounds, wgs)]
    bad = [(int(r), int(w), g) for r, w, g in zip(rounds, wgs, got) if g != ((r & 1) ^ (1 - w))]
    out["phase_errors"] = bad[:3]
    out["phase_cases"] = len(got)
except Exception as exc:
    out["phase_errors"] = [f"_turn_phase raised {type(exc).__name__}: {exc}"]
    bad = True
if not out.get("phase_errors"):
    bars, nxt, order = [MBarrier("turn[0]", 1), MBarrier("turn[1]", 1)], [0, 0], []
    while min(nxt) < 6:
        moved = False
        for wg in (0, 1):
            if nxt[wg] < 6 and bars[wg].passes(int(fn(nxt[wg], wg))):
                order.append((wg, nxt[wg]))
                bars[1 - wg].arrive()
                nxt[wg] += 1
                moved = True
                break
        if not moved:
            order.append("hang")
            break
    out["order"] = order
sig = {"desc_q": descriptor_signature(64, 128), "desc_k": descriptor_signature(128, 128),
       "desc_v": descriptor_signature(128, 128), "O": "*bf16", "LSE": "*fp32", "H_Q": "i32", "GROUP": "i32",
       "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32"}
for turns in (True, False):
    cx = dict(HEAD_DIM=128, BLOCK_M=128, BLOCK_N=128, STAGES=2, CAUSAL=False, TURNS=turns, num_warps=4)
    try:
        out["with" if turns else "without"] = resource_usage(
            compile_gluon(ns["_fwd_pingpong_kernel"], sig, cx, 4, maxnreg=168), barriers=True)
    except Exception as exc:
        out["with" if turns else "without"] = {"error": f"{type(exc).__name__}: {str(exc)[-300:]}"}
print("A7-RESULT " + json.dumps(out))
"""


def _limits():
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))
    os.setsid()


def compile_usage(code: str, seed: int = 0, timeout: float = 600.0) -> dict:
    """Run the checks on the submission's ``code`` (its graded cells joined): ``{"phase_errors", "order",
    "with", "without"}`` or ``{"error": ...}`` when the process failed as a whole."""
    with tempfile.TemporaryDirectory(prefix="a7-compile-") as tmp:
        path = os.path.join(tmp, "a7_submission.py")
        Path(path).write_text(code)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "TMPDIR": tmp,
               "TRITON_CACHE_DIR": os.path.join(tmp, "triton"), "TRITON_INTERPRET": "0",
               "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            res = subprocess.run([sys.executable, "-c", _CHILD, path, str(seed)], env=env, cwd=tmp,
                                 capture_output=True, text=True, timeout=timeout, preexec_fn=_limits)
        except subprocess.TimeoutExpired:
            return {"error": f"the compile-only check did not finish within {timeout:.0f} s"}
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("A7-RESULT ")]
    if not lines:
        tail = res.stderr.strip().splitlines()[-1][:400] if res.stderr.strip() else "no output"
        return {"error": f"the submission's cells failed to load for the compile-only check: {tail}"}
    return json.loads(lines[-1][len("A7-RESULT "):])


def judge_phases(result: dict) -> tuple[bool, str]:
    """(passed, message): ``_turn_phase`` equals ``(r & 1) ^ (1 - WG)`` and the turns alternate WG0, WG1, ..."""
    if "error" in result:
        return False, result["error"]
    if result.get("phase_errors"):
        e = result["phase_errors"][0]
        return False, (f"_turn_phase: {e}" if isinstance(e, str) else
                       f"_turn_phase(r={e[0]}, WG={e[1]}) = {e[2]}: not the parity consumer {e[1]} must wait for "
                       "(a fresh mbarrier lets parity 1 through; WG 0 goes first)")
    want = [[w, r] for r in range(6) for w in (0, 1)]
    order = result.get("order")
    if order != want:
        return False, f"the turns do not alternate WG0, WG1 from round 0: {order[:6]}"
    return True, f"{result.get('phase_cases', 0)} phases right; 6 rounds alternate WG0, WG1"


def judge_compile(with_turns: dict, without: dict) -> tuple[bool, str]:
    """(passed, message) for the compile-only test."""
    if "error" in with_turns:
        return False, f"does not compile for sm_90a: {with_turns['error']}"
    if "error" in without:
        return False, f"the kernel without turns does not compile: {without['error']}"
    spills = with_turns["LDL"] + with_turns["STL"] + with_turns["stack"]
    if spills:
        return False, f"spills: {with_turns['LDL']} LDL, {with_turns['STL']} STL, stack {with_turns['stack']} B"
    want = ROUNDS_PER_CONSUMER * CONSUMERS
    waits = with_turns["ptx_mbarrier_wait"] - without["ptx_mbarrier_wait"]
    arrives = with_turns["ptx_mbarrier_arrive"] - without["ptx_mbarrier_arrive"]
    if (waits, arrives) != (want, want):
        return False, (f"the turn adds {waits} mbarrier waits and {arrives} arrivals to the kernel; expected {want} "
                       f"each (one per matmul round in the code, {ROUNDS_PER_CONSUMER} rounds x {CONSUMERS} consumers)")
    if with_turns["HGMMA"] == 0:
        return False, "no HGMMA instructions: the matmuls are not wgmma"
    return True, (f"compiles for sm_90a: {with_turns['registers']} registers, no spills, +{waits} mbarrier waits, "
                  f"+{arrives} arrivals")


_CACHE: dict = {}


def checks_for(code: str) -> dict:
    """``compile_usage`` once per submission text (both parent checks of a grading share one compile)."""
    if code not in _CACHE:
        _CACHE.clear()
        _CACHE[code] = compile_usage(code)
    return _CACHE[code]


def phase_check(code: str) -> tuple[bool, str]:
    return judge_phases(checks_for(code))


def compile_check(code: str) -> tuple[bool, str]:
    r = checks_for(code)
    if "error" in r:
        return False, r["error"]
    return judge_compile(r["with"], r["without"])
