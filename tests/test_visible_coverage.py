"""The visible cases cover what the hidden cases grade.

For every graded function of every spec, every combination of features that a hidden case of any of its tests
has (drawn over many grading seeds, as the grader draws them) must be found in at least one *visible* case of
the same function: a visible case whose feature set contains the hidden case's. So a bug that only shows in a
combination (a causal mask off by one under GQA; fully masked rows with Nq != Nk; float16 with causal) fails
``check()`` and ``make check`` before it costs points in grading.

Granularity: the function, not the test line. A visible case of any test of that function covers the
combination (the student runs all visible cases of a function together); requiring each test line's own
visible cases to cover every combination its hidden generator draws would multiply the visible cases (and the
time of ``check()``) for no more feedback.

Features (``features``): ``causal``, ``gqa`` (Hq != Hkv), ``Nq!=Nk``, ``masked rows`` (causal with Nq > Nk:
rows that see no key), ``N=1`` (a length of 1: Nq, Nk, N, a sequence or a row), ``len 0`` (a zero in
``lens``), ``large logits`` (``shift``, ``mag`` >= 10, outlier channels), ``-inf`` (masked entries, empty key
sets, empty ring state) and the dtype when it is not float32 (float32 is what every function must handle
anyway). Left out on purpose: speed tests (no visible cases), ``gpu`` cases (bfloat16 kernels: dropped on a
CPU, where check() runs; the float16 line covers the kernel's low-precision path) and the sizes of a case
(hidden cases span several tiles; visible cases stay small so that check() is instant).
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from autograder import specs

SEEDS = range(40)


def features(p: dict) -> frozenset:
    """The features of one case's parameters (see the module docstring)."""
    f = set()
    dt = p.get("dtype")
    if dt and dt != "float32":
        f.add(dt)
    causal = bool(p.get("causal"))
    if causal:
        f.add("causal")
    if "Hq" in p and "Hkv" in p and p["Hq"] != p["Hkv"]:
        f.add("gqa")
    lengths = []
    if "Nq" in p and "Nk" in p:
        lengths += [p["Nq"], p["Nk"]]
        if p["Nq"] != p["Nk"]:
            f.add("Nq!=Nk")
        if causal and p["Nq"] > p["Nk"]:
            f.add("masked rows")
    if "N" in p and "world" not in p:
        lengths.append(p["N"])
    if p.get("lens") is not None:
        lengths += [n for n in p["lens"] if n]
        if 0 in list(p["lens"]):
            f.add("len 0")
    if "shape" in p:
        lengths.append(p["shape"][p.get("axis", -1)])
    if 1 in lengths:
        f.add("N=1")
    if p.get("shift") or p.get("mag", 1.0) >= 10 or p.get("outliers") or p.get("v_ramp"):
        f.add("large logits")
    if p.get("masked") or p.get("empty") or p.get("empty_state"):
        f.add("-inf")
    return frozenset(f)


def _show(fs) -> str:
    return "{" + ", ".join(sorted(fs)) + "}" if fs else "{plain}"


def hidden_features(spec, task_id, seeds=SEEDS) -> dict:
    """``{feature set: (test name, example params)}`` over the hidden cases of the function's correctness,
    memory and behaviour tests (``gpu`` cases dropped), drawn as the grader draws them."""
    out = {}
    for test in spec.tests_of(task_id):
        if test.kind == "speed" or test.gpu_only or not test.hidden:
            continue
        for seed in seeds:
            rng = np.random.default_rng([seed, zlib.crc32(test.name.encode())])
            for p in test.hidden_cases(rng):
                if not p.get("gpu") and not p.get("timing_only"):
                    out.setdefault(features(p), (test.name, p))
    return out


def visible_features(spec, task_id) -> list:
    return [features(p) for test in spec.tests_of(task_id) if test.kind != "speed"
            for p in test.visible if not p.get("gpu")]


def uncovered(spec, task_id) -> list:
    """``[(hidden feature set, test name, example params)]`` that no visible case of the function covers."""
    vis = visible_features(spec, task_id)
    return [(fs, name, p) for fs, (name, p) in sorted(hidden_features(spec, task_id).items(), key=lambda x: _show(x[0]))
            if not any(fs <= v for v in vis)]


TASKS = [(aid, tid) for aid in specs.ASSIGNMENTS for tid in specs.load(aid).tasks]


def test_features():
    assert features(dict(B=1, Hq=4, Hkv=2, Nq=7, Nk=3, d=8, dtype="float16", causal=True)) == \
        {"float16", "causal", "gqa", "Nq!=Nk", "masked rows"}
    assert features(dict(B=1, Hq=2, Hkv=2, Nq=3, Nk=7, d=8, dtype="float32", causal=True)) == {"causal", "Nq!=Nk"}
    assert features(dict(B=2, Hq=2, Hkv=2, N=13, d=16, dtype="float64", lens=[13, 0], shift=800.0)) == \
        {"float64", "len 0", "large logits"}
    assert features(dict(shape=(3, 1), dtype="float32", masked=True)) == {"N=1", "-inf"}
    # a gap once: a1's GQA test draws a causal GQA case; its visible GQA case was not causal
    a1 = [dict(B=1, Hq=4, Hkv=2, Nq=5, Nk=5, d=8, dtype="float32"),
          dict(B=1, Hq=1, Hkv=1, Nq=6, Nk=6, d=8, dtype="float32", causal=True)]
    hidden = features(dict(B=1, Hq=6, Hkv=1, Nq=40, Nk=40, d=16, dtype="float32", causal=True))
    assert not any(hidden <= features(v) for v in a1)


@pytest.mark.parametrize("aid,tid", TASKS, ids=[t for _, t in TASKS])
def test_visible_cases_cover_every_hidden_feature_combination(aid, tid):
    spec = specs.load(aid)
    missing = uncovered(spec, tid)
    assert not missing, (
        f"{tid}: hidden feature combinations with no visible case that has them all (add a small visible case "
        "to the test named, in autograder/specs/" + aid + ".py):\n" +
        "\n".join(f"  {_show(fs)}  (hidden in '{name}', e.g. {p})" for fs, name, p in missing))
