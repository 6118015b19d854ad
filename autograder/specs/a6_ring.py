"""Spec of the optional assignment a6_ring: the merge step (``ring_step``) and the backward step
(``ring_backward_step``) of ring attention, NumPy.

One ring step of one rank: attend the rank's queries (global positions ``q_pos``) to the visiting K/V chunk
(positions ``k_pos``) under the causal rule "key t is visible to query p iff t <= p", and fold the result into
the running state ``(o, lse)`` with the merge rule. Cases come from real ring schedules (contiguous and zig-zag
layouts, ragged total lengths), so a query may see all, part or none of a chunk. Each test is one feature, so a
submission that gets one wrong loses exactly that test.

``ring_backward_step``: FA2's backward on one visiting chunk with the rank's *global* ``lse`` and ``delta``;
the rank's ``dq`` gets the chunk's share (dQ stays local), the chunk's travelling ``dk, dv`` accumulators get
the rank's share (summed over each kv head's query heads under GQA). The global ``lse`` is built as
``logaddexp(lse of this chunk, lse of the other chunks)``, so ``P = exp(S - lse)`` is the true probability and
a submission that renormalises over the chunk alone is wrong by the other chunks' mass.

Points: 50 + 50 = 100.
"""
from __future__ import annotations

import numpy as np

from .. import oracles
from ._base import TOL, Call, Spec, Task, Test
from ._gen import arr, lse_dtypes, out, ragged, randn

SHORT = "a6"
FORBIDDEN = ("torch", "scipy", "jax", "tensorflow")   # a NumPy assignment


def positions(n: int, world: int, rank: int, layout: str) -> np.ndarray:
    """Global positions held by ``rank``: contiguous chunk ``rank`` of ``world``, or zig-zag chunks ``rank`` and
    ``2 world - 1 - rank`` of ``2 world`` (``numpy.array_split`` chunks: ragged lengths allowed)."""
    if layout == "contiguous":
        return np.array_split(np.arange(n), world)[rank]
    chunks = np.array_split(np.arange(n), 2 * world)
    return np.concatenate([chunks[rank], chunks[2 * world - 1 - rank]])


def build_ring_step(p, rng):
    """Params: ``N, world, rank, src`` (the rank whose chunk visits), ``layout``, ``causal``, ``B, Hq, Hkv, d``,
    ``dtype`` (of q, k, v), ``mag`` (scales q), ``empty_state`` (fraction of state rows with lse = -inf)."""
    q_pos = positions(p["N"], p["world"], p["rank"], p["layout"])
    k_pos = positions(p["N"], p["world"], p["src"], p["layout"])
    dt = p["dtype"]
    sdt = "float64" if dt == "float64" else "float32"     # the running state is accumulated in >= float32
    b, hq, hkv, d = p["B"], p["Hq"], p["Hkv"], p["d"]
    q = randn(rng, (b, hq, len(q_pos), d), dt, p.get("mag", 1.0))
    k, v = randn(rng, (b, hkv, len(k_pos), d), dt), randn(rng, (b, hkv, len(k_pos), d), dt)
    o = randn(rng, (b, hq, len(q_pos), d), sdt)
    # the state's lse on the scale of the chunk's (large logits: both must survive the max trick)
    lse = (rng.standard_normal((b, hq, len(q_pos))) * 2 + np.log(d) + 2 * p.get("mag", 0.0)).astype(sdt)
    if p.get("empty_state"):                    # rows whose earlier chunks held no visible key
        empty = rng.random(lse.shape) < p["empty_state"]
        lse[empty] = -np.inf
        o[empty] = 0
    tol = TOL[dt] * max(1.0, p.get("mag", 1.0) / 10.0)
    c = Call([arr(o), arr(lse), arr(q), arr(k), arr(v), arr(q_pos.astype(np.int64)), arr(k_pos.astype(np.int64))],
             {"causal": bool(p["causal"])}, [out("o", sdt, tol), out("lse", sdt, tol, dtypes=lse_dtypes(sdt))])
    c.arg_names = ["o", "lse", "q", "k", "v", "q_pos", "k_pos"]
    return c


def oracle_ring_step(call):
    o, lse, q, k, v, q_pos, k_pos = (a.value for a in call.args)
    mask = k_pos[None, :] <= q_pos[:, None] if call.kwargs["causal"] else np.ones((len(q_pos), len(k_pos)), bool)
    o_b, lse_b = oracles.attention(q, k, v, key_mask=mask)
    return list(oracles.merge_states(o, lse, o_b, lse_b))


def build_ring_backward_step(p, rng):
    """Params as ``build_ring_step`` (``empty_state``: fraction of query rows whose other chunks hold no visible
    key, so their global lse is this chunk's own)."""
    q_pos = positions(p["N"], p["world"], p["rank"], p["layout"])
    k_pos = positions(p["N"], p["world"], p["src"], p["layout"])
    dt = p["dtype"]
    sdt = "float64" if dt == "float64" else "float32"
    b, hq, hkv, d = p["B"], p["Hq"], p["Hkv"], p["d"]
    q = randn(rng, (b, hq, len(q_pos), d), dt, p.get("mag", 1.0))
    k, v = randn(rng, (b, hkv, len(k_pos), d), dt), randn(rng, (b, hkv, len(k_pos), d), dt)
    do = randn(rng, (b, hq, len(q_pos), d), dt)
    mask = k_pos[None, :] <= q_pos[:, None] if p["causal"] else np.ones((len(q_pos), len(k_pos)), bool)
    _, lse_chunk = oracles.attention(q, k, v, key_mask=mask)          # float64, -inf where nothing is visible
    lse_other = rng.standard_normal(lse_chunk.shape) + np.log(max(p["N"] - len(k_pos), 1)) \
        + (p.get("mag", 1.0) if p.get("mag", 1.0) >= 10 else 0.0) * 2
    if p.get("empty_state"):   # rows whose other chunks are all invisible: the chunk is their whole softmax
        lse_other[rng.random(lse_other.shape) < p["empty_state"]] = -np.inf
    lse = np.logaddexp(lse_chunk, lse_other)
    # a row that sees nothing anywhere cannot occur in self-attention (a query sees itself): give it another chunk
    lse = np.where(np.isneginf(lse), lse_other.max() if np.isfinite(lse_other).any() else 0.0, lse).astype(sdt)
    delta = (rng.standard_normal(lse.shape) * 0.5).astype(sdt)
    dq = randn(rng, q.shape, sdt)
    dk, dv = randn(rng, k.shape, sdt), randn(rng, v.shape, sdt)
    tol = TOL[dt] * max(1.0, p.get("mag", 1.0) / 10.0)
    c = Call([arr(dq), arr(dk), arr(dv), arr(q), arr(k), arr(v), arr(do), arr(lse), arr(delta),
              arr(q_pos.astype(np.int64)), arr(k_pos.astype(np.int64))], {"causal": bool(p["causal"])},
             [out("dq", sdt, tol), out("dk", sdt, tol), out("dv", sdt, tol)])
    c.arg_names = ["dq", "dk", "dv", "q", "k", "v", "do", "lse", "delta", "q_pos", "k_pos"]
    return c


def oracle_ring_backward_step(call):
    """float64, dense, written from FA2 Algorithm 2 lines 11-16 (independent of the solution's code)."""
    dq, dk, dv, q, k, v, do, lse, delta, q_pos, k_pos = (oracles.f64(a.value) for a in call.args)
    hq, hkv, d = q.shape[-3], k.shape[-3], q.shape[-1]
    g = hq // hkv
    scale = 1.0 / np.sqrt(d)
    mask = (k_pos[None, :] <= q_pos[:, None]) if call.kwargs["causal"] else np.ones((len(q_pos), len(k_pos)), bool)
    dq, dk, dv = dq.copy(), dk.copy(), dv.copy()
    for h in range(hq):
        kh, vh = k[..., h // g, :, :], v[..., h // g, :, :]
        s = np.einsum("...id,...jd->...ij", q[..., h, :, :], kh) * scale
        p = np.where(mask, np.exp(np.where(mask, s, 0.0) - lse[..., h, :, None]), 0.0)
        dp = np.einsum("...id,...jd->...ij", do[..., h, :, :], vh)
        ds = p * (dp - delta[..., h, :, None])
        dq[..., h, :, :] += np.einsum("...ij,...jd->...id", ds, kh) * scale
        dk[..., h // g, :, :] += np.einsum("...ij,...id->...jd", ds, q[..., h, :, :]) * scale
        dv[..., h // g, :, :] += np.einsum("...ij,...id->...jd", p, do[..., h, :, :])
    return [dq, dk, dv]


# --- cases ----------------------------------------------------------------------------------------------------

def _ring(rng, causal=True, sees_all=False, unseen=False, dtype="float32", hq=None, hkv=None, **extra):
    """A ring step drawn from a real schedule. ``sees_all``: the visiting chunk is rank 0's (it holds position
    0, so every query sees at least one key). ``unseen``: a chunk from later in the sequence (some or all
    queries see none of it)."""
    world = int(rng.integers(2, 5))
    layout = str(rng.choice(["contiguous", "zigzag"]))
    n = ragged(rng, 8 * world, 40 * world)
    rank = int(rng.integers(0, world))
    if sees_all:
        src = 0
    elif unseen:
        rank, src = int(rng.integers(0, world - 1)), world - 1    # src > rank: contiguous sees none, zig-zag part
    else:
        src = int(rng.integers(0, world))
    hkv = hkv if hkv is not None else int(rng.integers(1, 3))
    return dict(N=n, world=world, rank=rank, src=src, layout=layout, causal=causal, B=int(rng.integers(1, 3)),
                Hq=hq or hkv, Hkv=hkv, d=int(rng.choice([8, 16, 32])), dtype=dtype, **extra)


def _v(**kw):
    base = dict(N=21, world=2, rank=1, src=0, layout="zigzag", causal=True, B=1, Hq=2, Hkv=2, d=8,
                dtype="float32", empty_state=0.2)
    base.update(kw)
    return base


def _t(name, points, visible, hidden, **kw):
    return Test(f"{SHORT}.ring_step: {name}", f"{SHORT}.ring_step", points, visible, hidden, **kw)


TESTS = [
    _t("non-causal, ragged chunks", 10, [_v(causal=False, src=1)],
       lambda r: [_ring(r, causal=False, empty_state=0.3), _ring(r, causal=False)]),
    _t("causal, every query sees the chunk (incl. the rank's own chunk)", 10,
       [_v(), _v(rank=0, src=0, layout="contiguous")],
       lambda r: [_ring(r, sees_all=True, empty_state=0.3), _ring(r, sees_all=True),
                  dict(_ring(r, sees_all=True), src=0, rank=0)]),
    _t("causal, queries that see none of the chunk (state kept; o = 0, lse = -inf if empty too)", 10,
       [_v(rank=0, src=1, empty_state=0.3), _v(rank=0, src=1, layout="contiguous", empty_state=0.3)],
       lambda r: [_ring(r, unseen=True, empty_state=0.3), _ring(r, unseen=True, empty_state=0.3),
                  _ring(r, unseen=True, empty_state=1.0)]),
    _t("GQA / MQA", 8, [_v(Hq=4, Hkv=2)],
       lambda r: [_ring(r, sees_all=True, hq=4, hkv=2), _ring(r, causal=False, hq=6, hkv=1)]),
    _t("large logits (exp overflows without the max trick)", 6, [_v(mag=30.0), _v(dtype="float64", mag=300.0)],
       lambda r: [_ring(r, sees_all=True, dtype="float64", mag=300.0), _ring(r, causal=False, mag=30.0)]),
    _t("dtypes float16/float64", 6, [_v(dtype="float16"), _v(dtype="float64")],
       lambda r: [_ring(r, sees_all=True, dtype="float16"), _ring(r, causal=False, dtype="float64")]),
]

def _b(name, points, visible, hidden, **kw):
    return Test(f"{SHORT}.ring_backward_step: {name}", f"{SHORT}.ring_backward_step", points, visible, hidden, **kw)


TESTS += [
    _b("non-causal: dq kept, dk/dv accumulated", 10, [_v(causal=False, src=1), _v(causal=False, src=1, B=2)],
       lambda r: [_ring(r, causal=False), _ring(r, causal=False, empty_state=0.3)]),
    _b("causal, every query sees the chunk (incl. the rank's own chunk)", 10,
       [_v(), _v(rank=0, src=0, layout="contiguous")],
       lambda r: [_ring(r, sees_all=True, empty_state=0.3), dict(_ring(r, sees_all=True), src=0, rank=0)]),
    _b("causal, queries that see none or part of the chunk (they add nothing)", 10,
       [_v(rank=0, src=1, empty_state=0.3), _v(rank=0, src=1, layout="contiguous", empty_state=0.3)],
       lambda r: [_ring(r, unseen=True, empty_state=0.3), _ring(r, unseen=True)]),
    _b("GQA / MQA: dk, dv summed over each kv head's query heads", 10,
       [_v(Hq=4, Hkv=2), _v(Hq=4, Hkv=2, causal=False, src=1)],
       lambda r: [_ring(r, sees_all=True, hq=4, hkv=2), _ring(r, causal=False, hq=6, hkv=1)]),
    _b("large logits", 5, [_v(mag=30.0), _v(dtype="float64", mag=300.0)],
       lambda r: [_ring(r, sees_all=True, dtype="float64", mag=300.0), _ring(r, causal=False, mag=30.0)]),
    _b("dtypes float16/float64", 5, [_v(dtype="float16"), _v(dtype="float64")],
       lambda r: [_ring(r, sees_all=True, dtype="float16"), _ring(r, causal=False, dtype="float64")]),
]

TASKS = {
    "a6.ring_step": Task("a6.ring_step", "ring_step", build_ring_step, oracle_ring_step,
                         reference="reference.numpy.ring:ring_step", case_timeout=10),
    "a6.ring_backward_step": Task("a6.ring_backward_step", "ring_backward_step", build_ring_backward_step,
                                  oracle_ring_backward_step, reference="reference.numpy.ring:ring_backward_step",
                                  case_timeout=10),
}

ASSIGNMENT = Spec("a6_ring", SHORT, TASKS, TESTS, forbidden_imports=FORBIDDEN, load_timeout=30, total_timeout=300)
