"""Compile-only checks of a7's Gluon kernel for sm_90a on a machine without a GPU: the
grading parent's side. The kernel never runs, so a wrong barrier cannot hang the grader.

The submission's code runs only in a **compile child** (``engine.Grader.compile_child``): a sandboxed child with
every isolation layer of a graded call (namespaces, hidden checkout, traps, audit hook; docs/design.md §6) but
Triton's interpreter off and no GPU, since the interpreter cannot compile Gluon. The child computes and sends back
raw material over the protocol (``gluon_child``); this module judges it, in the parent:

* ``phase_check(checks)``: the ints ``_ready_phase.fn(t, STAGES)``, ``_empty_phase.fn(t, STAGES)`` and
  ``_turn_phase.fn(r, WG)`` returned in the child for tiles, ring sizes and rounds drawn here: the producer and
  both consumers played through the grader's own mbarrier model (``reference.simulators.mbarrier.run_pingpong``)
  with the child's parities (no deadlock, no slot overwritten early, rounds in turn), then every value against
  the model's formulas, and the turns of 6 rounds played alone;
* ``compile_check(checks)``: ``_fwd_pingpong_kernel`` compiled for sm_90a with and without the turns
  (``TURNS``); the child sends the PTX text and the cubin, and this process disassembles the cubin with the
  wheel's ``cuobjdump`` and counts (``reference.triton.hopper._aot.resource_usage``): it compiles, nothing
  spills, the turn adds exactly one mbarrier wait and one arrival per matmul round and consumer (3 rounds in the
  code x 2 consumers = 6 each: a missing ``_take_turn`` wait or ``_give_turn`` arrive shows as fewer), in the
  PTX (comments stripped) and in the cubin's SASS alike, the matmuls are wgmma (HGMMA), and each consumer's loop
  waits for its scores with one WGMMA group left in flight (``wgmma.wait_group 1``: FA3 Algorithm 2's overlap
  of the softmax of ``S_j`` with ``P_{j-1} V_{j-1}``; a wait for everything is correct but serial).

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
PHASE, READY, EMPTY = "_turn_phase", "_ready_phase", "_empty_phase"
N_PHASES = 200
#: (key/value tiles, ring slots) the producer and both consumers are played with (``play_ring``)
RING = ((6, 2), (7, 3), (5, 4))
MAXNREG = 168


def expected_phase(r: int, wg: int) -> int:
    """The parity consumer ``wg`` waits for before round ``r`` (lecture 6 §10b; FA3 section 3.1's ping-pong): a
    fresh mbarrier lets parity 1 through at once, so WG 0 starts; each completed arrival flips the phase
    (``reference.simulators.mbarrier.turn_phase``)."""
    from reference.simulators.mbarrier import turn_phase
    return turn_phase(r, wg)


def expected_ring_phase(name: str, t: int, stages: int) -> int:
    """The ring's parities (lecture 6 §10b): ``_ready_phase`` (a consumer, on slot ``t % stages``'s ready
    barrier: the ``t // stages``-th fill) and ``_empty_phase`` (the producer, on its empty barrier: one phase
    less, so the first pass is free) -- ``reference.simulators.mbarrier.ready_phase`` / ``empty_phase``."""
    from reference.simulators import mbarrier as mb
    return {READY: mb.ready_phase, EMPTY: mb.empty_phase}[name](t, stages)


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


def play_ring(turn: dict, ready: dict, empty: dict) -> str | None:
    """Run the producer and both consumers (``reference.simulators.mbarrier.run_pingpong``) with the submission's
    parities (tables keyed ``(r, wg)`` and ``(t, stages)``) for every ``RING`` size; the simulator's complaint
    (deadlock, a slot overwritten too early, rounds out of turn), or None."""
    from reference.simulators import mbarrier as mb
    for n_tiles, stages in RING:
        try:
            mb.run_pingpong(n_tiles, stages, ready_phase_fn=lambda t, s: ready[(t, s)],
                            empty_phase_fn=lambda t, s: empty[(t, s)], turn_phase_fn=lambda r, w: turn[(r, w)])
        except mb.ProtocolError as exc:
            return f"{n_tiles} tiles in a {stages}-slot ring: {str(exc)[:300]}"
        except (KeyError, ValueError) as exc:   # a parity that is not 0 or 1
            return f"{n_tiles} tiles in a {stages}-slot ring: a parity is not 0 or 1 ({exc})"
    return None


_WHO = {READY: "a consumer must wait for on the slot's ready barrier before it reads the tile",
        EMPTY: "the producer must wait for on the slot's empty barrier before it refills it"}


def judge_phases(args: list, got: list, ring_args: list | None = None, ready: list | None = None,
                 empty: list | None = None) -> tuple[bool, str]:
    """(passed, message) from the child's ``_turn_phase`` values ``got`` at ``args`` (``[r, wg]`` pairs) and, when
    given, its ``_ready_phase`` / ``_empty_phase`` values at ``ring_args`` (``[t, stages]`` pairs): the whole
    protocol played through the mbarrier model first (its message says what would hang or race), then every
    value against the formula."""
    if ring_args is not None:
        why = play_ring({(r, wg): g for (r, wg), g in zip(args, got)},
                        {(t, s): g for (t, s), g in zip(ring_args, ready)},
                        {(t, s): g for (t, s), g in zip(ring_args, empty)})
        if why:
            return False, f"the mbarrier model of the kernel fails with your parities: {why}"
        for name, values in ((READY, ready), (EMPTY, empty)):
            for (t, s), g in zip(ring_args, values):
                if g != expected_ring_phase(name, t, s):
                    return False, f"{name}(t={t}, STAGES={s}) = {g}: not the parity {_WHO[name]}"
    for (r, wg), g in zip(args, got):
        if g != expected_phase(r, wg):
            return False, (f"_turn_phase(r={r}, WG={wg}) = {g}: not the parity consumer {wg} must wait for "
                           "(a fresh mbarrier lets parity 1 through; WG 0 goes first)")
    order = play_turns({(r, wg): g for (r, wg), g in zip(args, got)})
    want = [[w, r] for r in range(6) for w in (0, 1)]
    if order != want:
        return False, f"the turns do not alternate WG0, WG1 from round 0: {order[:6]}"
    if ring_args is None:
        return True, f"{len(args)} phases right; 6 rounds alternate WG0, WG1"
    return True, (f"{len(args)} turn and {2 * len(ring_args)} ring parities right; the producer and both consumers "
                  f"run {', '.join(f'{n} tiles through {s} slots' for n, s in RING)} without a hang, a race or a "
                  "turn out of order")


def phase_check(checks, rng=None) -> tuple[bool, str]:
    """``Test.parent_check``: fresh random rounds, tiles and ring sizes, plus every value the played ring needs."""
    rng = rng if rng is not None else getattr(checks, "rng", None) or np.random.default_rng()
    n_max = max(n for n, _ in RING)
    args = [[r, w] for r in range(n_max + 1) for w in (0, 1)]
    args += [[int(r), int(w)] for r, w in zip(rng.integers(0, 10_000, N_PHASES), rng.integers(0, 2, N_PHASES))]
    ring = [[t, s] for _, s in RING for t in range(n_max)]
    ring += [[int(t), int(s)] for t, s in zip(rng.integers(0, 10_000, N_PHASES), rng.integers(1, 5, N_PHASES))]
    return judge_phases(args, checks.probe(PHASE, args), ring, checks.probe(READY, ring), checks.probe(EMPTY, ring))


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
    if with_turns["ptx_wgmma_wait_1"] < CONSUMERS:
        return False, ("the consumer loop never waits with a WGMMA group left in flight: `_wait_scores` waits for "
                       "P_{j-1} V_{j-1} as well as S_j, so the softmax of S_j no longer overlaps the P V matmul "
                       "(FA3 Algorithm 2)")
    return True, (f"compiles for sm_90a: {with_turns['registers']} registers, no spills, +{waits} mbarrier waits, "
                  f"+{arrives} arrivals, the score wait overlaps P V")


def compile_check(checks) -> tuple[bool, str]:
    """``Test.parent_check``: compile in the child, count and judge here."""
    r = compile_both(checks)
    return judge_compile(r["with"], r["without"])
