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


CHECKED = """
import json, sys
import numpy as np
from benchmarks._common import checked_rounds
rng = np.random.default_rng(int(sys.argv[1]))
ref = rng.standard_normal(40)
noise = rng.standard_normal(40)
def boom():
    raise RuntimeError("x" * 50 + "tail")
fns = {"exact": lambda: ref.copy(), "noisy": lambda: (ref + 1e-3 * noise, "lse"), "broken": boom}
times = iter(float(t) for t in rng.permutation(np.arange(1, 100))[:12])
rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
out = checked_rounds(fns, 6e9, ref, rounds=6, timer=lambda fn: next(times), rel=rel, err_chars=10)
print(json.dumps({"out": out, "want_noisy": float(1e-3 * np.linalg.norm(noise) / np.linalg.norm(ref))}))
"""


@pytest.mark.parametrize("seed", [0, 7])
def test_checked_rounds_errors_failures_and_medians(seed):
    """``checked_rounds``: the error of each output (the first of a tuple) against ``ref``, a raising
    implementation kept as an error row (its message cut to the last ``err_chars``) and left out of the timing,
    the median over the rounds as ``ms`` and ``tflops = flops / ms / 1e9``."""
    out = subprocess.run([sys.executable, "-c", CHECKED, str(seed)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    rows = got["out"]
    assert rows["broken"] == {"error": "RuntimeError: " + ("x" * 50 + "tail")[-10:]}
    assert rows["exact"]["rel_vs_cudnn"] == 0.0
    assert abs(rows["noisy"]["rel_vs_cudnn"] - got["want_noisy"]) <= 1e-12 * got["want_noisy"]
    for n in ("exact", "noisy"):
        r = rows[n]
        assert len(r["rounds_ms"]) == 6 and len(set(r["rounds_ms"])) == 6
        assert r["ms"] == sorted(r["rounds_ms"])[2:4][0] / 2 + sorted(r["rounds_ms"])[2:4][1] / 2
        assert abs(r["tflops"] - 6e9 / r["ms"] / 1e9) <= 1e-12 * r["tflops"]
    assert sorted(rows["exact"]["rounds_ms"] + rows["noisy"]["rounds_ms"]) == sorted(set(
        rows["exact"]["rounds_ms"] + rows["noisy"]["rounds_ms"]))


SECTIONS = """
import json, sys
from benchmarks._common import run_sections
ran = []
sections = {"mixed": lambda: ran.append("mixed") or 1, "cascade": lambda: ran.append("cascade") or 2}
try:
    run_sections(sections, "copy,cascade", {}, sys.argv[1], lambda s: None, 0.0)
except ValueError as e:
    print(json.dumps({"error": str(e), "ran": ran}))
out = run_sections(sections, "cascade,mixed", {}, sys.argv[1], lambda s: None, 0.0)
print(json.dumps({"ran": ran, "out": {k: out[k] for k in ("cascade", "mixed")}}))
"""


def test_run_sections_names_an_unknown_section_before_running_any(tmp_path):
    # a misspelt --sections name fails at once with the known names, instead of a run that records it as failed
    path = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-c", SECTIONS, str(path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    refused, done = (json.loads(x) for x in p.stdout.strip().splitlines()[-2:])
    assert refused == {"error": "--sections: unknown section(s) copy; expected a comma-separated list of mixed, "
                                "cascade", "ran": []}
    assert done == {"ran": ["cascade", "mixed"], "out": {"cascade": 2, "mixed": 1}}
    assert json.loads(path.read_text())["mixed"] == 1
