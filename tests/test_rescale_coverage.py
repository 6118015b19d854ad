"""A kernel right only within one tile loses >= 70% of its function's points (docs/design.md §6): every correctness
test of a tiled function (its property gate aside, which keeps plain one-tile cases) has, in every grading, a hidden
case whose rows span >= 2 tiles of the largest tile the assignment allows plus a ragged tail, with enough rows that
some row's running max grows after its first tile. Computed here from the specs' hidden generators over many
grading seeds (NumPy only: fast); the bundled no-rescale mutants (``w_*_no_rescale``, selftest ``lose`` bands)
check the same on the kernels.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from autograder import specs
from autograder.specs._base import spans_tiles

SEEDS = range(40)
MIN_ROWS = 8          # rows crossing the tiles: a row's max stays in its first tile with probability <= ~1/2


def _rows_attention(p):
    return p["B"] * p["Hq"] * p["Nq"]


def _rows_paged(p):
    return p["Hq"] * sum(1 for n in p["lens"] if n > 2 * 64)


# task -> (the tiled axis along which a running max is carried, rows of a case that cross those tiles)
RESCALED = {
    "a3.softmax": ("row length", lambda p: int(np.prod(p["shape"][:-1]))),
    "a3.flash_attention_forward_basic": ("key length Nk", _rows_attention),
    "a3.flash_attention_forward": ("key length Nk", _rows_attention),
    "a4.flash_decode": ("keys per split", lambda p: p["B"] * p["Hq"]),
    "a5.paged_decode": ("longest sequence", _rows_paged),
}


def _loss(spec, task, seed):
    """(share of the task's CPU points a no-rescale kernel loses for this seed, tests without a multi-tile case)."""
    axis = next(t for t in task.tiled if t.axis == RESCALED[task.id][0])
    rows = RESCALED[task.id][1]
    lost, total, missing = 0.0, 0.0, []
    for test in spec.tests_of(task.id):
        if test.gpu_only or test.optional or test.kind not in ("correctness", "memory"):
            continue
        total += test.points
        rng = np.random.default_rng([seed, zlib.crc32(test.name.encode())])   # as engine.grade draws them
        cases = [p for p in test.hidden_cases(rng) if not p.get("gpu")]
        if any(spans_tiles(axis.length(p), axis.tile(p)) and rows(p) >= MIN_ROWS for p in cases):
            lost += test.points
        elif not test.gate:
            missing.append(test.name)
    return lost / total, missing


@pytest.mark.parametrize("tid", sorted(RESCALED))
def test_no_rescale_loses_at_least_70_percent(tid):
    spec, task = specs.find_task(tid)
    worst = 1.0
    for seed in SEEDS:
        loss, missing = _loss(spec, task, seed)
        assert not missing, f"{tid}, seed {seed}: correctness tests without a multi-tile case: {missing}"
        worst = min(worst, loss)
    assert worst >= 0.70, f"{tid}: a kernel that never rescales keeps {100 * (1 - worst):.0f}% of the points"
