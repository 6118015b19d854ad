"""Spec of assignment a2_flash_numpy: FlashAttention-2 in NumPy (tiled forward with lse, backward with
recomputation) and the HBM bytes that forward moves. Points total 110: correctness per feature, an O(N d)
memory test per function (tracemalloc peak during the call: materialising the N x N scores loses those points
even when the numbers are right), a CPU speed test of the forward against the reference tiled forward, timed
alternately in the same run, and ``forward_hbm_bytes`` (per-tensor HBM bytes of the forward in either loop
order, graded exactly against a closed-form count per query block).
"""
from __future__ import annotations

import numpy as np

from ._attn import (build_flash_backward, build_flash_forward, oracle_flash_backward, oracle_flash_forward,
                    tiled_qk)
from ._base import Call, Out, Spec, Task, Test
from ._gen import ragged

SHORT = "a2"
FORBIDDEN = ("torch", "scipy", "jax", "tensorflow")


def _att(rng, dtype="float32", nq=None, nk=None, hq=None, hkv=None, **extra):
    hkv = hkv if hkv is not None else int(rng.integers(1, 3))
    n = ragged(rng, 40, 160)
    # blocks smaller than N (several tiles per row and column), so a tiling bug always shows
    sizes = [b for b in (8, 16, 32, 64) if b < min(nq or n, nk or n, n) // 2] or [8]
    blocks = dict(block_q=int(rng.choice(sizes)), block_k=int(rng.choice(sizes)))
    blocks.update({k: extra.pop(k) for k in ("block_q", "block_k") if k in extra})
    return dict(B=int(rng.integers(1, 3)), Hq=hq or hkv, Hkv=hkv, Nq=nq or n, Nk=nk or n,
                d=int(rng.choice([16, 32])), dtype=dtype, **blocks, **extra)


def _small(**kw):
    base = dict(B=1, Hq=1, Hkv=1, Nq=20, Nk=20, d=8, dtype="float32", block_q=8, block_k=8)
    base.update(kw)
    return base


def _mem_limit(p):
    """A quarter of one float32 N x N matrix plus 16 float64 N x d arrays: tiles of block_q x block_k (or even
    block_q x N strips) and O(N d) accumulators fit; one N x N score or probability matrix does not."""
    return p["Nq"] * p["Nk"] * 4 // 4 + 16 * max(p["Nq"], p["Nk"]) * p["d"] * 8


MEM = dict(B=1, Hq=1, Hkv=1, Nq=2048, Nk=2048, d=16, dtype="float32", block_q=64, block_k=64)
MEM_CAUSAL = dict(MEM, causal=True)
SPEED = dict(B=1, Hq=2, Hkv=2, Nq=1024, Nk=1024, d=64, dtype="float32", block_q=64, block_k=64)


def _tests(task, pts):
    t = lambda name, p, vis, hid, **kw: Test(f"{SHORT}.{task}: {name}", f"{SHORT}.{task}", p, vis, hid, **kw)  # noqa
    return [
        t("basic (ragged N, block sizes)", pts[0], [_small(Nq=20, Nk=13)],
          lambda r: [_att(r), _att(r, nq=ragged(r, 5, 60), nk=ragged(r, 70, 200)), _att(r, block_q=128, block_k=7)]),
        t("causal (Nq == Nk)", pts[1], [_small(causal=True)],
          lambda r: [_att(r, causal=True), _att(r, causal=True, block_q=16, block_k=32)]),
        t("causal, Nq != Nk (bottom-right; fully masked rows)", pts[2],
          [_small(Nq=6, Nk=19, causal=True), _small(Nq=19, Nk=6, causal=True)],
          lambda r: [_att(r, causal=True, nq=ragged(r, 5, 40), nk=ragged(r, 50, 120)),
                     _att(r, causal=True, nq=ragged(r, 50, 120), nk=ragged(r, 5, 40))]),
        t("GQA / MQA", pts[3], [_small(Hq=4, Hkv=2), _small(Hq=4, Hkv=1, causal=True)],
          lambda r: [_att(r, hq=4, hkv=2), _att(r, hq=6, hkv=1, causal=True)]),
        t("dtypes float16/float64", pts[4], [_small(dtype="float16"), _small(dtype="float64", causal=True)],
          lambda r: [_att(r, "float16"), _att(r, "float64", causal=True)]),
    ] + ([
        t("edge cases (N = 1, blocks larger than N)", pts[5], [_small(Nq=1, Nk=1), _small(Nq=1, Nk=13, causal=True)],
          lambda r: [_att(r, nq=1, nk=1), _att(r, nq=1, nk=ragged(r, 10, 99), causal=True, block_k=8),
                     _att(r, block_q=256, block_k=256)]),
        t("large logits (running max)", pts[6], [_small(dtype="float64", shift=800.0)],
          lambda r: [_att(r, "float64", shift=800.0), _att(r, "float32", shift=100.0)]),
    ] if task == "flash_attention_forward" else []) + [
        t("memory O(N d): no N x N matrix", pts[-1],
          [dict(MEM, Nq=1024, Nk=1024)], lambda r: [MEM, dict(MEM_CAUSAL, Nq=1024, Nk=1024)], kind="memory",
          memory_limit=_mem_limit),
    ]


# --- forward_hbm_bytes: the HBM traffic of the tiled forward ------------------------------------------------
INT_OUT = ("int64", "int32")
STATS_BYTES = 4  # l, m and lse travel in fp32 whatever the element size
HBM_KWARGS = ("block_q", "block_k", "element_bytes", "causal", "order")


def build_hbm(p, rng):
    """forward_hbm_bytes(nq, nk, d, block_q=, block_k=, element_bytes=, causal=, order=) -> (2, 5) int array:
    bytes read (row 0) and written (row 1) of Q, K, V, O and the row statistics."""
    c = Call([p["Nq"], p["Nk"], p["d"]], {k: p[k] for k in HBM_KWARGS}, [Out("bytes", INT_OUT, 0.0)],
             label=f"order={p['order']}, causal={p['causal']}")
    c.arg_names = ["nq", "nk", "d"]
    return c


def oracle_hbm(call):
    """Closed form per query block i (rows r_i, last allowed key a_i = i_1 - 1 + Nk - Nq when causal): it visits
    the key blocks j with first key j B_c <= a_i, i.e. n_i = clip(floor(a_i / B_c) + 1, 0, T_c) blocks covering
    c_i = min(n_i B_c, Nk) keys (all T_c blocks and Nk keys when not causal).

    fa2 (FA2 Algorithm 1): Q read once; K and V read sum_i c_i rows; O and lse written once (lines 4, 7, 12-13).
    fa1 (FA1 Algorithm 1): O, l, m initialised in HBM (line 2); K, V read once (line 6); per visited tile
    Q_i, O_i, l_i, m_i read (line 8) and O_i, l_i, m_i written (lines 12-13): sum_i r_i n_i rows each."""
    nq, nk, d = call.args
    kw = call.kwargs
    bq, bk, e = kw["block_q"], kw["block_k"], kw["element_bytes"]
    starts = np.arange(0, nq, bq)
    rows = np.minimum(starts + bq, nq) - starts
    t_c = -(-nk // bk)
    if kw["causal"]:
        last = starts + rows - 1 + (nk - nq)
        n_blocks = np.where(last >= 0, np.minimum(np.maximum(last, 0) // bk + 1, t_c), 0)
    else:
        n_blocks = np.full(len(starts), t_c)
    cols = np.minimum(n_blocks * bk, nk)
    row = float(d * e)
    out = np.zeros((2, 5))
    if kw["order"] == "fa2":
        out[0, :3] = [nq * row, cols.sum() * row, cols.sum() * row]
        out[1, 3:] = [nq * row, nq * STATS_BYTES]
    else:
        streamed = float((rows * n_blocks).sum())
        out[0] = [streamed * row, nk * row, nk * row, streamed * row, 2 * STATS_BYTES * streamed]
        out[1, 3:] = [(nq + streamed) * row, 2 * STATS_BYTES * (nq + streamed)]
    return [out]


def _hbm(rng=None, order="fa2", causal=False, nq=None, nk=None, e=None, **kw):
    """A counting case; ragged lengths (no multiple of the blocks) unless given."""
    n = ragged(rng, 40, 400) if rng is not None else 20
    p = dict(Nq=nq or n, Nk=nk or n, d=int(rng.choice([16, 64, 128])) if rng is not None else 8,
             block_q=int(rng.choice([8, 16, 32, 64])) if rng is not None else 8,
             block_k=int(rng.choice([8, 16, 32, 64])) if rng is not None else 8,
             element_bytes=e or (int(rng.choice([1, 2, 4, 8])) if rng is not None else 2),
             causal=causal, order=order)
    p.update(kw)
    return p


def _hbm_cases(r, order):
    """Ragged square and rectangular, causal with Nq < Nk and Nq > Nk (whole query blocks masked), a block
    larger than N, and always one 2-byte case (statistics stay 4 bytes)."""
    return [_hbm(r, order, e=2), _hbm(r, order, nq=ragged(r, 5, 90), nk=ragged(r, 100, 300)),
            _hbm(r, order, causal=True), _hbm(r, order, causal=True, nq=ragged(r, 5, 90), nk=ragged(r, 100, 300)),
            _hbm(r, order, causal=True, nq=ragged(r, 100, 300), nk=ragged(r, 5, 90), block_q=16),
            _hbm(r, order, nq=37, nk=37, block_q=64, block_k=8, causal=bool(r.integers(0, 2)))]


HBM_TESTS = [
    Test(f"{SHORT}.forward_hbm_bytes: a2's loop order (query blocks outer; K, V re-read per query block; "
         "ragged, causal Nq != Nk)", f"{SHORT}.forward_hbm_bytes", 6,
         [_hbm(), _hbm(causal=True, nq=19, nk=6)], lambda r: _hbm_cases(r, "fa2")),
    Test(f"{SHORT}.forward_hbm_bytes: FA1's loop order (key blocks outer; Q, O, l, m per key block)",
         f"{SHORT}.forward_hbm_bytes", 4, [_hbm(order="fa1")], lambda r: _hbm_cases(r, "fa1")),
]

TESTS = _tests("flash_attention_forward", [8, 8, 8, 7, 5, 5, 4, 5]) + [
    Test(f"{SHORT}.flash_attention_forward: speed vs reference tiled forward (CPU)",
         f"{SHORT}.flash_attention_forward", 5, [], lambda r: [SPEED], kind="speed", speed_full=2.0,
         speed_zero=6.0, reps=5),
] + _tests("flash_attention_backward", [10, 8, 8, 8, 6, 5]) + HBM_TESTS

TASKS = {
    "a2.flash_attention_forward": Task("a2.flash_attention_forward", "flash_attention_forward",
                                       build_flash_forward, oracle_flash_forward,
                                       reference="reference.numpy.flash:flash_attention_forward",
                                       tiled=tiled_qk("block_q", "block_k")),
    "a2.flash_attention_backward": Task("a2.flash_attention_backward", "flash_attention_backward",
                                        build_flash_backward, oracle_flash_backward,
                                        reference="reference.numpy.flash:flash_attention_backward",
                                        tiled=tiled_qk("block_q", "block_k")),
    "a2.forward_hbm_bytes": Task("a2.forward_hbm_bytes", "forward_hbm_bytes", build_hbm, oracle_hbm),
}

ASSIGNMENT = Spec("a2_flash_numpy", SHORT, TASKS, TESTS, forbidden_imports=FORBIDDEN, load_timeout=30, total_timeout=400)
