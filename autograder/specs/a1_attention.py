"""Spec of assignment a1_attention: safe_softmax, online_softmax, merge_states, attention (NumPy).

Each test is one feature (causal with Nq != Nk, GQA, large logits, ...), so a submission that gets one feature
wrong loses exactly that test's points. Points total 100.
"""
from __future__ import annotations

import numpy as np

from .. import oracles
from ._attn import build_attention, oracle_attention, tol_for
from ._base import Call, Spec, Task, Test, Tiled
from ._gen import arr, lse_dtypes, multi_tile, out, ragged, randn

SHORT = "a1"
FORBIDDEN = ("torch", "scipy", "jax", "tensorflow")   # a NumPy assignment


# --- softmax -------------------------------------------------------------------------------------------------

def _x(p, rng):
    x = randn(rng, p["shape"], p["dtype"], p.get("mag", 1.0))
    if p.get("shift"):                             # every logit ~ shift: e^shift overflows without the max trick
        x = (x.astype(np.float64) + p["shift"]).astype(x.dtype)
    if p.get("masked"):
        x = x.copy()
        x[rng.random(x.shape) < 0.3] = -np.inf
        rows = x.reshape(-1, x.shape[-1])
        rows[:: 3] = -np.inf                      # fully masked rows -> zeros (docs/design.md §3)
    return x


def build_softmax(p, rng):
    x = _x(p, rng)
    kw = {"axis": p["axis"]} if "axis" in p else {}
    c = Call([arr(x)], kw, [out("p", p["dtype"], tol_for(p))])
    c.arg_names = ["x"]
    return c


def oracle_softmax(call):
    return [oracles.softmax(call.args[0].value, call.kwargs.get("axis", -1))]


def build_online(p, rng):
    """``stream``: x is handed over as a read-only block source that records its reads (``runner.block_source``);
    reading more than ``block_size`` columns at once, or the whole array, fails the case."""
    x = _x(p, rng)
    kw = {"block_size": p["block_size"]} if "block_size" in p else {}
    c = Call([arr(x, blocks=bool(p.get("stream")))], kw, [out("p", p["dtype"], tol_for(p))])
    c.arg_names = ["x"]
    if p.get("stream"):
        c.block_limit = p.get("block_size", 128)
    return c


def oracle_online(call):
    return [oracles.softmax(call.args[0].value)]


# --- merge_states --------------------------------------------------------------------------------------------

def build_merge(p, rng):
    shape = p["shape"]
    dt = p["dtype"]
    o_a, o_b = randn(rng, shape, dt), randn(rng, shape, dt)
    ldt = "float64" if dt == "float64" else "float32"
    off = p.get("shift", 0.0) + np.log(shape[-2] + 1)     # shift ~ 1000: e^lse overflows without the max trick
    lse_a = (rng.standard_normal(shape[:-1]) * 2 + off).astype(ldt)
    lse_b = (rng.standard_normal(shape[:-1]) * 2 + off).astype(ldt)
    empty = p.get("empty")
    if empty:
        lse_a, lse_b = lse_a.copy(), lse_b.copy()
        ra = rng.random(shape[:-1]) < 0.3
        rb = rng.random(shape[:-1]) < 0.3
        both = rng.random(shape[:-1]) < 0.15
        lse_a[ra | both] = -np.inf
        lse_b[rb | both] = -np.inf
    c = Call([arr(o_a), arr(lse_a), arr(o_b), arr(lse_b)], {},
             [out("o", dt, tol_for(p)), out("lse", dt, tol_for(p), dtypes=lse_dtypes(dt))])
    c.arg_names = ["o_a", "lse_a", "o_b", "lse_b"]
    return c


def oracle_merge(call):
    return list(oracles.merge_states(*(a.value for a in call.args)))


# --- hidden case generators (drawn from the grader's secret generator) -----------------------------------------

def _rows(rng, dtype="float32", **extra):
    return dict(shape=(int(rng.integers(2, 9)), ragged(rng, 5, 300)), dtype=dtype, **extra)


def _div(rng, dtype="float32", **extra):
    """Rows whose length is a multiple of the block size (so only the ragged-tail test has a ragged tail)."""
    b = int(rng.choice([4, 8, 16, 32]))
    return dict(shape=(int(rng.integers(2, 9)), b * int(rng.integers(2, 12))), dtype=dtype, block_size=b, **extra)


def _tail(rng, b):
    """Rows of 2-3 whole blocks of ``b`` plus a ragged tail: the running (m, l) must carry over several blocks."""
    return dict(shape=(int(rng.integers(2, 6)), multi_tile(rng, b)), dtype="float32", block_size=b)


def _att(rng, dtype="float32", nq=None, nk=None, b=None, hq=None, hkv=None, d=None, **extra):
    hkv = hkv if hkv is not None else int(rng.integers(1, 3))
    n = ragged(rng, 33, 150)   # > 32 rows: a submission computing only the first tile/rows cannot pass (T8)
    return dict(B=b or int(rng.integers(1, 3)), Hq=hq or hkv, Hkv=hkv, Nq=nq or n, Nk=nk or n,
                d=d or int(rng.choice([16, 32, 48])), dtype=dtype, **extra)


def _t(name, task, points, visible, hidden, **kw):
    return Test(f"{SHORT}.{task}: {name}", f"{SHORT}.{task}", points, visible, hidden, **kw)


TESTS = [
    _t("basic", "safe_softmax", 6, [dict(shape=(4, 10), dtype="float32")],
       lambda r: [_rows(r), dict(shape=(2, 3, ragged(r, 5, 99)), dtype="float32"), dict(shape=(7,), dtype="float32")]),
    _t("axis argument", "safe_softmax", 3, [dict(shape=(5, 6, 3), dtype="float32", axis=1)],
       lambda r: [dict(shape=(4, ragged(r, 3, 40), 3), dtype="float32", axis=1),
                  dict(shape=(ragged(r, 3, 40), 6), dtype="float32", axis=0)]),
    _t("large logits (max trick)", "safe_softmax", 4, [dict(shape=(3, 8), dtype="float64", shift=800.0)],
       lambda r: [_rows(r, "float64", shift=800.0), _rows(r, "float32", shift=100.0)]),
    _t("-inf entries and fully masked rows", "safe_softmax", 3,
       [dict(shape=(6, 9), dtype="float32", masked=True), dict(shape=(6, 9), dtype="float64", masked=True)],
       lambda r: [_rows(r, masked=True), _rows(r, "float64", masked=True)]),
    _t("dtypes float16/float64", "safe_softmax", 4, [dict(shape=(3, 12), dtype="float16"),
                                                       dict(shape=(3, 12), dtype="float64")],
       lambda r: [_rows(r, "float16"), _rows(r, "float64")]),

    _t("basic (block sizes dividing N)", "online_softmax", 4, [dict(shape=(4, 64), dtype="float32", block_size=16)],
       lambda r: [dict(shape=(3, 256), dtype="float32", block_size=int(b)) for b in (1, 32, 128)]
       + [dict(shape=(2, 7, 96), dtype="float32", block_size=48)]),
    _t("ragged tail (N not a multiple of block_size, block > N)", "online_softmax", 3,
       [dict(shape=(3, 50), dtype="float32", block_size=16), dict(shape=(2, 10), dtype="float32", block_size=64)],
       lambda r: [dict(shape=(int(r.integers(2, 6)), ragged(r, 40, 400)), dtype="float32",
                       block_size=int(r.choice([7, 16, 33]))),
                  _tail(r, int(r.choice([7, 16, 33, 50]))),
                  dict(shape=(3, ragged(r, 5, 60)), dtype="float32", block_size=128)]),
    _t("large logits (running max)", "online_softmax", 3,
       [dict(shape=(3, 40), dtype="float64", shift=800.0, block_size=8)],
       lambda r: [_div(r, "float64", shift=800.0), _div(r, "float32", shift=100.0)]),
    _t("-inf entries and fully masked rows", "online_softmax", 3,
       [dict(shape=(6, 20), dtype="float32", masked=True, block_size=4),
        dict(shape=(6, 20), dtype="float64", masked=True, block_size=4)],
       lambda r: [_div(r, masked=True), _div(r, "float64", masked=True)]),
    _t("dtypes float16/float64", "online_softmax", 2, [dict(shape=(3, 12), dtype="float16", block_size=4),
                                                         dict(shape=(3, 12), dtype="float64", block_size=4)],
       lambda r: [_div(r, "float16"), _div(r, "float64")]),
    # The defining property of online_softmax (gate=True): if this test fails, every online_softmax test scores 0,
    # so a softmax that reads whole rows earns nothing. Plain float32 rows only (masks, dtypes and large logits
    # have their own tests), so that it fails on the property or on values the basic test fails too.
    _t("streaming (x read block_size columns at a time, never whole)", "online_softmax", 5,
       [dict(shape=(3, 48), dtype="float32", block_size=16, stream=True)],
       lambda r: [_div(r, stream=True), _div(r, stream=True)], gate=True),

    _t("basic", "merge_states", 8, [dict(shape=(2, 5, 8), dtype="float32")],
       lambda r: [dict(shape=(int(r.integers(1, 4)), ragged(r, 3, 70), 16), dtype="float32"),
                  dict(shape=(ragged(r, 3, 30), 32), dtype="float32")]),
    _t("empty key sets (lse = -inf)", "merge_states", 5, [dict(shape=(1, 12, 4), dtype="float32", empty=True)],
       lambda r: [dict(shape=(2, ragged(r, 20, 90), 8), dtype="float32", empty=True)]),
    _t("large lse values", "merge_states", 4, [dict(shape=(4, 8), dtype="float64", shift=800.0)],
       lambda r: [dict(shape=(2, ragged(r, 5, 50), 8), dtype="float64", shift=1000.0),
                  dict(shape=(ragged(r, 5, 50), 8), dtype="float32", shift=100.0)]),
    _t("dtypes float16/float64", "merge_states", 3, [dict(shape=(3, 4), dtype="float16"),
                                                       dict(shape=(3, 4), dtype="float64")],
       lambda r: [dict(shape=(2, ragged(r, 5, 50), 8), dtype="float16"),
                  dict(shape=(2, ragged(r, 5, 50), 8), dtype="float64")]),

    _t("basic (single head and batched)", "attention", 5,
       [dict(single=True, Nq=8, Nk=8, d=4, dtype="float32")],
       lambda r: [dict(single=True, Nq=ragged(r, 5, 90), Nk=ragged(r, 5, 90), d=16, dtype="float32"),
                  _att(r, hkv=2)]),
    _t("dtypes float16/float64", "attention", 3, [dict(B=1, Hq=2, Hkv=2, Nq=6, Nk=6, d=8, dtype="float16"),
                                                    dict(B=1, Hq=2, Hkv=2, Nq=6, Nk=6, d=8, dtype="float64")],
       lambda r: [_att(r, "float16"), _att(r, "float64")]),
    _t("lse (natural log)", "attention", 5, [dict(B=1, Hq=1, Hkv=1, Nq=5, Nk=7, d=8, dtype="float32", lse=True)],
       lambda r: [_att(r, lse=True), _att(r, "float64", lse=True)]),
    _t("custom scale", "attention", 3, [dict(single=True, Nq=4, Nk=6, d=8, dtype="float32", scale=0.5)],
       lambda r: [_att(r, scale=float(r.uniform(0.05, 1.0)))]),
    _t("causal (Nq == Nk)", "attention", 6, [dict(B=1, Hq=1, Hkv=1, Nq=6, Nk=6, d=8, dtype="float32", causal=True),
                                           dict(B=1, Hq=1, Hkv=1, Nq=1, Nk=1, d=8, dtype="float32", causal=True)],
       lambda r: [_att(r, causal=True), _att(r, causal=True, nq=1, nk=1)]),
    _t("causal, Nq != Nk (bottom-right; fully masked rows)", "attention", 6,
       [dict(B=1, Hq=1, Hkv=1, Nq=3, Nk=7, d=8, dtype="float32", causal=True, lse=True),
        dict(B=1, Hq=1, Hkv=1, Nq=7, Nk=3, d=8, dtype="float32", causal=True, lse=True),
        dict(B=1, Hq=1, Hkv=1, Nq=1, Nk=7, d=8, dtype="float32", causal=True, lse=True)],
       lambda r: [_att(r, causal=True, nq=ragged(r, 5, 40), nk=ragged(r, 50, 120), lse=True),
                  _att(r, causal=True, nq=ragged(r, 50, 120), nk=ragged(r, 5, 40), lse=True),
                  _att(r, causal=True, nq=1, nk=ragged(r, 10, 99), lse=True)]),
    _t("GQA / MQA", "attention", 6, [dict(B=1, Hq=4, Hkv=2, Nq=5, Nk=5, d=8, dtype="float32"),
                                    dict(B=1, Hq=6, Hkv=2, Nq=5, Nk=5, d=8, dtype="float32", causal=True)],
       lambda r: [_att(r, hq=4, hkv=2), _att(r, hq=6, hkv=1, causal=True), _att(r, hq=8, hkv=2)]),
    _t("edge cases (N = 1, decode Nq = 1)", "attention", 3,
       [dict(single=True, Nq=1, Nk=1, d=4, dtype="float32"), dict(B=1, Hq=2, Hkv=2, Nq=1, Nk=9, d=8, dtype="float32")],
       lambda r: [_att(r, nq=1, nk=1), _att(r, nq=1, nk=ragged(r, 10, 99))]),
    _t("large logits (max trick)", "attention", 3,
       [dict(B=1, Hq=1, Hkv=1, Nq=4, Nk=6, d=8, dtype="float64", shift=800.0)],
       lambda r: [_att(r, "float64", shift=800.0), _att(r, "float32", shift=100.0)]),
]

TASKS = {
    "a1.safe_softmax": Task("a1.safe_softmax", "safe_softmax", build_softmax, oracle_softmax,
                            reference="reference.numpy.softmax:safe_softmax", case_timeout=10),
    "a1.online_softmax": Task("a1.online_softmax", "online_softmax", build_online, oracle_online,
                              reference="reference.numpy.softmax:online_softmax", case_timeout=10,
                              tiled=(Tiled("row length", lambda p: p["shape"][-1],
                                           lambda p: p.get("block_size", 128)),)),
    "a1.merge_states": Task("a1.merge_states", "merge_states", build_merge, oracle_merge,
                            reference="reference.numpy.merge:merge_states", case_timeout=10),
    "a1.attention": Task("a1.attention", "attention", build_attention, oracle_attention,
                         reference="reference.numpy.attention:attention", case_timeout=10),
}

ASSIGNMENT = Spec("a1_attention", SHORT, TASKS, TESTS, forbidden_imports=FORBIDDEN, load_timeout=30, total_timeout=300)
