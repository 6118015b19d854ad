"""Hidden cases cross tiles: every tiled function of every assignment gets, in every grading, at least
one hidden case whose tiled length spans >= 2 tiles plus a ragged tail (not a multiple of the tile), for each of
its tiled axes (key length and, where the kernel tiles queries, query length).

The tile is the spec's ``MAX_TILE`` (the largest tile it expects a kernel to use: 64 for the Triton attention
and decode kernels, 4096 columns for a3's softmax) or, for NumPy functions tiled by an argument, the call's own
``block_size`` / ``block_q`` / ``block_k`` / key chunk of ``num_splits``. Each spec declares its tiled axes as
``Task.tiled`` (``specs._base.Tiled``); this test draws every correctness test's hidden cases of each such task
(as the grader does: one generator per test, ``gpu`` cases dropped as on the CPU) for many seeds.

Before the fix hidden lengths stayed within one 64-wide tile (a3 N <= 70, a4/a5 Triton <= 80/60, a3b Nq <= 70),
so a kernel that never rescaled its accumulator across key tiles scored full CPU points.
NumPy and the specs only: fast. Also here: the property gate (``Test.gate``, ``engine.apply_gates``), which zeroes a
function whose defining property failed (a1's online_softmax that does not stream).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from autograder import specs
from autograder.specs._base import spans_tiles

SEEDS = range(50)

# every tiled function, and the axes it must be exercised on (a change to a spec that drops one shows here)
EXPECTED = {
    "a1.online_softmax": {"row length"},
    "a2.flash_attention_forward": {"query length Nq", "key length Nk"},
    "a2.flash_attention_backward": {"query length Nq", "key length Nk"},
    "a3.softmax": {"row length"},
    "a3.flash_attention_forward_basic": {"query length Nq", "key length Nk"},
    "a3.flash_attention_forward": {"query length Nq", "key length Nk"},
    "a3.flash_attention_forward_fp8": {"query length Nq", "key length Nk"},
    "a3b.flash_bwd_preprocess": {"query length Nq"},
    "a3b.flash_bwd_dkdv": {"query length Nq", "key length Nk"},
    "a3b.flash_bwd_dq": {"query length Nq", "key length Nk"},
    "a3b.flash_attention_backward": {"query length Nq", "key length Nk"},
    "a3b.flash_attention": {"query length Nq", "key length Nk"},
    "a4.flash_decoding": {"key length N"},
    "a4.flash_decode": {"keys per split"},
    "a5.paged_attention": {"longest sequence (cache blocks)"},
    "a5.paged_decode": {"longest sequence"},
}


def _tiled_tasks():
    out = []
    for aid in specs.ASSIGNMENTS:
        spec = specs.load(aid)
        for task in spec.tasks.values():
            if getattr(task, "tiled", ()):
                out.append((spec, task))
    return out


def _cases(spec, task, seed):
    """The hidden cases of every CPU-graded correctness test of ``task`` for grading seed ``seed``."""
    cases = []
    for test in spec.tests_of(task.id):
        if test.kind != "correctness" or test.gpu_only:
            continue
        rng = np.random.default_rng([seed, zlib.crc32(test.name.encode())])   # as engine.grade draws them
        cases += [(test.name, p) for p in test.hidden_cases(rng) if not p.get("gpu")]
    return cases


def test_every_tiled_function_declares_its_axes():
    declared = {task.id: {t.axis for t in task.tiled} for _, task in _tiled_tasks()}
    missing = {tid: axes for tid, axes in EXPECTED.items() if not axes <= declared.get(tid, set())}
    assert not missing, f"tiled functions without (all) their Tiled axes in the spec: {missing}"


@pytest.mark.parametrize("tid", sorted(EXPECTED))
def test_hidden_cases_span_two_tiles_and_a_ragged_tail(tid):
    spec, task = specs.find_task(tid)
    assert task.tiled, f"{tid}: no Task.tiled in {spec.id}'s spec"
    for seed in SEEDS:
        cases = _cases(spec, task, seed)
        for ax in task.tiled:
            spans = [(name, ax.length(p), ax.tile(p)) for name, p in cases]
            assert any(spans_tiles(n, t) for _, n, t in spans), (
                f"{tid}, seed {seed}: no hidden case spans >= 2 tiles + a ragged tail on the {ax.axis}: "
                f"(length, tile) = {sorted({(n, t) for _, n, t in spans})}")


def test_spans_tiles():
    assert spans_tiles(129, 64) and spans_tiles(191, 64) and spans_tiles(255, 64)
    assert not spans_tiles(128, 64) and not spans_tiles(192, 64) and not spans_tiles(70, 64)
    assert not spans_tiles(1, 64) and not spans_tiles(5, 0)


def test_failed_gate_zeroes_its_task_only():
    """engine.apply_gates: a1's streaming test (gate=True) failing zeroes every other online_softmax test, not
    those of other tasks; a gate that passed or did not run (``--test``) zeroes nothing."""
    from autograder.engine import TestResult, apply_gates

    spec = specs.load("a1")
    gate = next(t for t in spec.tests if t.gate)
    assert gate.task == "a1.online_softmax" and "streaming" in gate.name

    def results(gate_status):
        out = []
        for t in spec.tests:
            ok = t is not gate or gate_status == "passed"
            r = TestResult(t.name, t.task, float(t.points), float(t.points) if ok else 0.0,
                           "passed" if ok else "failed", "fine" if ok else "read 96 columns of x at once")
            if t is gate and gate_status == "absent":
                continue
            out.append(r)
        return out

    for status in ("passed", "absent"):
        rs = results(status)
        apply_gates(spec, rs)
        assert all(r.score == r.max_score for r in rs)
    rs = results("failed")
    apply_gates(spec, rs)
    for r in rs:
        if r.task != "a1.online_softmax":
            assert r.score == r.max_score and r.output == "fine"
        elif r.name == gate.name:
            assert r.output.startswith("read 96 columns")
        else:
            assert r.score == 0 and r.status == "failed"
            assert r.output == f"zeroed: {gate.name} failed (the defining property of online_softmax)"
