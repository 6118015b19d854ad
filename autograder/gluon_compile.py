"""Compile-only checks of a7's Gluon kernel for sm_90a on a machine without a GPU (issue 24, item 2).

``compile_usage(path, turns=True)`` executes a submission's code cells (a ``.py`` percent source or a notebook
exported to one) in a **separate process** with ``TRITON_INTERPRET=0`` (the compiler rejects interpreter objects),
compiles its ``_fwd_pingpong_kernel`` for sm_90a and returns registers, spills and the mbarrier / wgmma-wait
counts of its PTX and SASS (``reference.triton.hopper._aot.resource_usage(barriers=True)``). ``judge_compile(with_turns, without)`` is the verdict:
it compiles, nothing spills, and the turn adds exactly one mbarrier wait and one arrival per matmul round and
consumer (3 rounds in the code x 2 consumers = 6 each: a missing ``_take_turn`` wait or ``_give_turn`` arrive
shows as a smaller difference). A wrong *phase* compiles to the same instructions; ``turn_phases`` catches it.

Not yet wired into ``python -m autograder grade`` (the sandbox child runs the interpreter on CPU): used by
``tests/test_a7_gluon.py`` and by an instructor directly.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUNDS_PER_CONSUMER, CONSUMERS = 3, 2

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[3])
from autograder.percent import parse_percent
from reference.triton.hopper._aot import compile_gluon, descriptor_signature, resource_usage
import importlib.util, os, tempfile
src = open(sys.argv[1]).read()
code = "\n\n".join(c.source for c in parse_percent(src, sys.argv[1])
                    if c.kind == "code" and not {"check", "skip"} & set(c.tags or ()))
path = os.path.join(tempfile.mkdtemp(), "a7_submission.py")   # a real file: @gluon.jit reads its source
open(path, "w").write(code)
spec = importlib.util.spec_from_file_location("a7_submission", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
ns = vars(mod)
sig = {"desc_q": descriptor_signature(64, 128), "desc_k": descriptor_signature(128, 128),
       "desc_v": descriptor_signature(128, 128), "O": "*bf16", "LSE": "*fp32", "H_Q": "i32", "GROUP": "i32",
       "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32"}
cx = dict(HEAD_DIM=128, BLOCK_M=128, BLOCK_N=128, STAGES=2, CAUSAL=False, TURNS=sys.argv[2] == "1", num_warps=4)
print(json.dumps(resource_usage(compile_gluon(ns["_fwd_pingpong_kernel"], sig, cx, 4, maxnreg=168), barriers=True)))
"""


def compile_usage(path, turns: bool = True, timeout: float = 300.0) -> dict:
    """Usage dict of the submission's kernel compiled for sm_90a, or ``{"error": ...}`` (it did not compile)."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", _CHILD, str(path), "1" if turns else "0", str(ROOT)], env=env,
                         capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1][:400] if res.stderr.strip() else "no output"}
    return json.loads(res.stdout.strip().splitlines()[-1])


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
