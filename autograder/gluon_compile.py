"""Compile-only checks of a7's Gluon kernel for sm_90a on a machine without a GPU: the
grading parent's side. The kernel never runs, so a wrong barrier cannot hang the grader.

The submission's code runs only in a **compile child** (``engine.Grader.compile_child``): a sandboxed child with
every isolation layer of a graded call (namespaces, hidden checkout, traps, audit hook; docs/design.md §6) but
Triton's interpreter off and no GPU, since the interpreter cannot compile Gluon. The child computes and sends back
raw material over the protocol (``gluon_child``); this module judges it, in the parent:

* ``phase_check(checks)``: the ints ``_turn_phase.fn(r, WG)`` returned in the child for random rounds (drawn
  here) against ``(r & 1) ^ (1 - WG)``, and the turns of 6 rounds played through the grader's own mbarrier model
  (``reference.simulators.mbarrier.MBarrier``) with the child's phases;
* ``compile_check(checks)``: ``_fwd_pingpong_kernel`` compiled for sm_90a with and without the turns
  (``TURNS``); the child sends the PTX text and the cubin, and this process disassembles the cubin with the
  wheel's ``cuobjdump`` and counts (``reference.triton.hopper._aot.resource_usage``): it compiles, nothing
  spills, the turn adds exactly one mbarrier wait and one arrival per matmul round and consumer (3 rounds in the
  code x 2 consumers = 6 each: a missing ``_take_turn`` wait or ``_give_turn`` arrive shows as fewer), in the
  PTX (comments stripped) and in the cubin's SASS alike, and the matmuls are wgmma (HGMMA).

What the child sends can only be what some code in the submission's process produced: forging it means handing
over a real sm_90a cubin of a kernel named ``_fwd_pingpong_kernel`` with the turns in it (the checks read the
cubin, not a number); swapping the child's compile functions or ``triton.compile`` is flagged T3 (``traps``).
"""
from __future__ import annotations

import re
import types

import numpy as np

ROUNDS_PER_CONSUMER, CONSUMERS = 3, 2
#: SASS of one PTX ``mbarrier.try_wait.parity``: a try-wait and its retry loop, two ``SYNCS.PHASECHK`` (measured
#: on the solution with Triton 3.6: 36 vs 18 PTX waits, 24 vs 12 without turns); one arrive is one ``SYNCS.ARRIVE``
SASS_CHECKS_PER_WAIT = 2
KERNEL = "_fwd_pingpong_kernel"
PHASE = "_turn_phase"
N_PHASES = 200
MAXNREG = 168


def expected_phase(r: int, wg: int) -> int:
    """The parity consumer ``wg`` waits for before round ``r`` (lecture 6 §10; FA3 Algorithm 2's ping-pong): a
    fresh mbarrier lets parity 1 through at once, so WG 0 starts; each completed arrival flips the phase."""
    return (r & 1) ^ (1 - wg)


def play_turns(phase: dict, rounds: int = 6) -> list:
    """Issue order of ``rounds`` rounds per consumer with the waits ``phase[(r, wg)]`` on two one-arrival
    mbarriers (each round arrives on the other's barrier); ``"hang"`` where no consumer can go on."""
    from reference.simulators.mbarrier import MBarrier
    bars, nxt, order = [MBarrier("turn[0]", 1), MBarrier("turn[1]", 1)], [0, 0], []
    while min(nxt) < rounds:
        for wg in (0, 1):
            if nxt[wg] < rounds and bars[wg].passes(phase[(nxt[wg], wg)]):
                order.append([wg, nxt[wg]])
                bars[1 - wg].arrive()
                nxt[wg] += 1
                break
        else:
            order.append("hang")
            break
    return order


def judge_phases(args: list, got: list) -> tuple[bool, str]:
    """(passed, message) from the child's ``_turn_phase`` values ``got`` at ``args`` (``[r, wg]`` pairs)."""
    for (r, wg), g in zip(args, got):
        if g != expected_phase(r, wg):
            return False, (f"_turn_phase(r={r}, WG={wg}) = {g}: not the parity consumer {wg} must wait for "
                           "(a fresh mbarrier lets parity 1 through; WG 0 goes first)")
    order = play_turns({(r, wg): g for (r, wg), g in zip(args, got)})
    want = [[w, r] for r in range(6) for w in (0, 1)]
    if order != want:
        return False, f"the turns do not alternate WG0, WG1 from round 0: {order[:6]}"
    return True, f"{len(args)} phases right; 6 rounds alternate WG0, WG1"


def phase_check(checks, rng=None) -> tuple[bool, str]:
    """``Test.parent_check``: fresh random rounds and both warpgroups, plus every (round < 6, WG) of the turn play."""
    rng = rng if rng is not None else getattr(checks, "rng", None) or np.random.default_rng()
    args = [[r, w] for r in range(6) for w in (0, 1)]
    args += [[int(r), int(w)] for r, w in zip(rng.integers(0, 10_000, N_PHASES), rng.integers(0, 2, N_PHASES))]
    return judge_phases(args, checks.probe(PHASE, args))


def signature() -> dict:
    """The skeleton kernel's argument types (bf16, d = 128, 128-row tiles), computed here, not in the child."""
    from reference.triton.hopper._aot import descriptor_signature
    return {"desc_q": descriptor_signature(64, 128), "desc_k": descriptor_signature(128, 128),
            "desc_v": descriptor_signature(128, 128), "O": "*bf16", "LSE": "*fp32", "H_Q": "i32", "GROUP": "i32",
            "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32"}


def usage(art: dict) -> dict:
    """Registers, spills and instruction counts of the child's artifacts, read here: ``cuobjdump`` on the cubin,
    regular expressions on the PTX (``_aot.resource_usage(barriers=True)``)."""
    from reference.triton.hopper._aot import resource_usage
    if f".entry {KERNEL}" not in art["ptx"] or ".target sm_90a" not in art["ptx"]:
        return {"error": f"the PTX sent back is not {KERNEL} for sm_90a"}
    ptx = re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", art["ptx"]), flags=re.S)   # counts on code only
    compiled = types.SimpleNamespace(asm={"ptx": ptx, "cubin": art["cubin"]},
                                     metadata=types.SimpleNamespace(shared=art["shared"]))
    try:
        return resource_usage(compiled, barriers=True)
    except Exception as exc:  # noqa: BLE001 -- cuobjdump refused the cubin: not a real one
        return {"error": f"the cubin sent back could not be read ({type(exc).__name__})"}


def compile_both(checks) -> dict:
    """``{"with": usage, "without": usage}``: the kernel with ``TURNS=True`` and ``False`` (or ``{"error"}``)."""
    from autograder.specs._base import ChildError
    sig, out = signature(), {}
    for turns in (True, False):
        cx = dict(HEAD_DIM=128, BLOCK_M=128, BLOCK_N=128, STAGES=2, CAUSAL=False, TURNS=turns, num_warps=4)
        try:
            out["with" if turns else "without"] = usage(checks.compile(KERNEL, sig, cx, 4, maxnreg=MAXNREG))
        except ChildError as exc:
            out["with" if turns else "without"] = {"error": str(exc)[-400:]}
    return out


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
    sass = ((with_turns["SYNCS.PHASECHK"] - without["SYNCS.PHASECHK"]) // SASS_CHECKS_PER_WAIT,
            with_turns["SYNCS.ARRIVE.TRANS64.A1T0"] - without["SYNCS.ARRIVE.TRANS64.A1T0"])
    if sass != (want, want):
        return False, (f"the PTX and the cubin disagree: the PTX adds {waits} waits and {arrives} arrivals, the "
                       f"cubin's SASS {sass[0]} waits and {sass[1]} arrivals (expected {want} each)")
    if with_turns["HGMMA"] == 0:
        return False, "no HGMMA instructions: the matmuls are not wgmma"
    return True, (f"compiles for sm_90a: {with_turns['registers']} registers, no spills, +{waits} mbarrier waits, "
                  f"+{arrives} arrivals")


def compile_check(checks) -> tuple[bool, str]:
    """``Test.parent_check``: compile in the child, count and judge here."""
    r = compile_both(checks)
    return judge_compile(r["with"], r["without"])
