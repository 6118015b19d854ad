"""``benchmarks._common.rotated_rounds`` (the timing order of ``bench_gluon_train``, ``bench_key_loop``,
``bench_fp8_gluon``), run in a subprocess with a fake timer that records the order: every implementation is timed
once per round, equally often in every position over 2 x (number of implementations) rounds, and behind
more than one other implementation."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CODE = """
import json, sys
from benchmarks._common import rotated_rounds
names, rounds, shift = json.loads(sys.argv[1])
seen = []
def timer(fn):
    seen.append(fn)
    return float(len(seen))
ms = rotated_rounds({n: n for n in names}, rounds, timer, first_shift=shift)
print(json.dumps({"ms": ms, "seen": seen}))
"""


@pytest.mark.parametrize("names, rounds, shift", [(["a", "b", "c", "d", "e", "f"], 12, 1), (["a", "b", "c"], 6, 0),
                                                  (["a", "b", "c", "d", "e"], 10, 1), (["cudnn", "gluon"], 4, 1)])
def test_every_implementation_in_every_position_and_behind_several_others(names, rounds, shift):
    out = subprocess.run([sys.executable, "-c", CODE, json.dumps([names, rounds, shift])], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    seen, k = got["seen"], len(names)
    assert len(seen) == rounds * k and {n: len(v) for n, v in got["ms"].items()} == {n: rounds for n in names}
    per_round = [seen[i * k:(i + 1) * k] for i in range(rounds)]
    assert all(sorted(r) == sorted(names) for r in per_round)          # each once per round
    for i, r in enumerate(per_round):                                   # the timer's value lands on its name
        assert [got["ms"][n][i] for n in r] == [float(i * k + j + 1) for j in range(k)]
    if rounds >= 2 * k:
        assert all(sorted(r.index(n) for r in per_round) == sorted(list(range(k)) * (rounds // k))
                   for n in names)                                      # every position, equally often
    if k >= 3 and rounds >= 2 * k:
        before = {n: {r[r.index(n) - 1] for r in per_round if r.index(n) > 0} for n in names}
        assert all(len(b) >= 2 for b in before.values()), before       # not always behind the same one
