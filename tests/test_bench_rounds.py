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

# every scenario of this module runs in one subprocess (a test may not import a benchmark module), one Python
# start and one import of ``benchmarks._common`` instead of one per scenario
SCRIPT = """
import json, sys
import numpy as np
from benchmarks._common import checked_rounds, rotated_rounds, run_sections


def rounds(names, rounds, shift):
    seen = []
    def timer(fn):
        seen.append(fn)
        return float(len(seen))
    ms = rotated_rounds({n: n for n in names}, rounds, timer, first_shift=shift)
    return {"ms": ms, "seen": seen}


def checked(seed):
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(40)
    noise = rng.standard_normal(40)
    def boom():
        raise RuntimeError("x" * 50 + "tail")
    fns = {"exact": lambda: ref.copy(), "noisy": lambda: (ref + 1e-3 * noise, "lse"), "broken": boom}
    times = iter(float(t) for t in rng.permutation(np.arange(1, 100))[:12])
    rel = lambda a, b: float(np.linalg.norm(a - b) / np.linalg.norm(b))
    out = checked_rounds(fns, 6e9, ref, rounds=6, timer=lambda fn: next(times), rel=rel, err_chars=10)
    return {"out": out, "want_noisy": float(1e-3 * np.linalg.norm(noise) / np.linalg.norm(ref))}


def sections(path):
    ran, res = [], {}
    sections = {"mixed": lambda: ran.append("mixed") or 1, "cascade": lambda: ran.append("cascade") or 2}
    try:
        run_sections(sections, "copy,cascade", {}, path, lambda s: None, 0.0)
    except ValueError as e:
        res["refused"] = {"error": str(e), "ran": list(ran)}
    out = run_sections(sections, "cascade,mixed", {}, path, lambda s: None, 0.0)
    res["done"] = {"ran": ran, "out": {k: out[k] for k in ("cascade", "mixed")}}
    return res


print(json.dumps([globals()[name](*args) for name, args in json.loads(sys.argv[1])]))
"""
ROUNDS = [(["a", "b", "c", "d", "e", "f"], 12, 1), (["a", "b", "c"], 6, 0), (["a", "b", "c", "d", "e"], 10, 1),
          (["cudnn", "gluon"], 4, 1)]
SEEDS = [0, 7]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """``(scenario -> what the subprocess returned, the sections run's results file)``."""
    path = tmp_path_factory.mktemp("sections") / "r.json"
    jobs = [["rounds", list(a)] for a in ROUNDS] + [["checked", [s]] for s in SEEDS] + [["sections", [str(path)]]]
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(jobs)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {(name, json.dumps(args)): r for (name, args), r in zip(jobs, got)}, path


@pytest.mark.parametrize("names, rounds, shift", ROUNDS)
def test_every_implementation_in_every_position_and_behind_several_others(ran, names, rounds, shift):
    got = ran[0][("rounds", json.dumps([names, rounds, shift]))]
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


@pytest.mark.parametrize("seed", SEEDS)
def test_checked_rounds_errors_failures_and_medians(ran, seed):
    """``checked_rounds``: the error of each output (the first of a tuple) against ``ref``, a raising
    implementation kept as an error row (its message cut to the last ``err_chars``) and left out of the timing,
    the median over the rounds as ``ms`` and ``tflops = flops / ms / 1e9``."""
    got = ran[0][("checked", json.dumps([seed]))]
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


def test_run_sections_names_an_unknown_section_before_running_any(ran):
    # a misspelt --sections name fails at once with the known names, instead of a run that records it as failed
    results, path = ran
    got = results[("sections", json.dumps([str(path)]))]
    refused, done = got.get("refused"), got["done"]
    assert refused == {"error": "--sections: unknown section(s) copy; expected a comma-separated list of mixed, "
                                "cascade", "ran": []}
    assert done == {"ran": ["cascade", "mixed"], "out": {"cascade": 2, "mixed": 1}}
    assert json.loads(path.read_text())["mixed"] == 1
