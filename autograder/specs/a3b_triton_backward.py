"""Spec of assignment a3b_triton_backward: the FlashAttention-2 backward in Triton, in four parts graded on
their own -- ``flash_bwd_preprocess`` (D = rowsum(dO o O)), ``flash_bwd_dkdv``, ``flash_bwd_dq`` (each called
with ``lse`` and ``delta`` from the exact float64 forward, so a bug in one stage costs only that stage), and
``flash_attention_backward`` / the differentiable ``flash_attention`` that tie them to the given forward.

Without a GPU the kernels run in the Triton interpreter on small shapes and the speed test is "not run"
(excluded from max_score). Points total 100 on a GPU. Each graded call must launch at least one Triton kernel.
Tiles: at most ``MAX_TILE`` = 64; hidden lengths reach 2-3 tiles plus a ragged tail (dK/dV: >= 3 query blocks).
"""
from __future__ import annotations

from ._attn import (build_triton_autograd_given_forward, build_triton_backward, build_triton_bwd_dkdv, build_triton_bwd_dq,
                    build_triton_bwd_preprocess, oracle_triton_autograd, oracle_triton_backward,
                    oracle_triton_bwd_dkdv, oracle_triton_bwd_dq, oracle_triton_bwd_preprocess, triton_case,
                    tiled_qk, triton_visible)
from ._base import Spec, Task, Test, tiled
from ._gen import multi_tile, ragged

SHORT = "a3b"
FORBIDDEN = ("scipy", "jax", "tensorflow", "flash_attn", "xformers")
# The largest tile the spec expects (the solution's BLOCK_M = BLOCK_N = 64): every grading has hidden lengths of
# 2-3 such tiles plus a ragged tail, so dK/dV loops over >= 3 query blocks and dQ over >= 3 key blocks.
MAX_TILE = 64


_att, _v = triton_case, triton_visible


def _t(task, name, points, visible, hidden, **kw):
    return Test(f"{SHORT}.{task}: {name}", f"{SHORT}.{task}", points, visible, hidden, **kw)


def _long(r, dtype="float32", causal=False, same=False, **kw):
    """Nq and Nk of 2-3 tiles of ``MAX_TILE`` plus a ragged tail (d = 16): dK/dV must visit >= 3 query blocks per
    key block, dQ >= 3 key blocks per query block. ``same``: Nq == Nk (Part 4: no fully masked rows)."""
    if causal:
        kw["causal"] = True
    nq = multi_tile(r, MAX_TILE)
    return _att(r, dtype, nq=nq, nk=nq if same else multi_tile(r, MAX_TILE), d=16, **kw)


def _masked_rows(r):
    """Causal cases with Nq != Nk both ways: Nq > Nk leaves the first Nq - Nk rows fully masked (lse = -inf,
    zero gradients; 3-12 of them, under half of the rows, so that most of dq is nonzero); Nk > 64 > Nq puts keys
    past the first 64-key block in view of every row (a kernel that starts its query loop as if the mask were
    aligned top-left skips them)."""
    nq = ragged(r, 30, 70)
    return [_att(r, causal=True, nq=ragged(r, 5, 30), nk=ragged(r, 70, 130)),
            _att(r, causal=True, nq=nq, nk=nq - int(r.integers(3, 13)))]


def _stage_tests(task, p):
    """The four correctness lines shared by the dK/dV and dQ stages (points ``p``: basic, causal, GQA, dtypes).
    Each dK/dV line also has a case of >= 3 query blocks (``_long``): a query loop that stops early loses them all."""
    dkdv = task.endswith("dkdv")

    def long(r, *a, **kw):
        return [_long(r, *a, **kw)] if dkdv else []

    return [
        # (Nq = 1 with many keys, not N = 1: with one key P = 1 and dS = P o (dP - D) = 0, so dq = dk = 0)
        _t(task, "basic (ragged N, Nq = 1)", p[0], [_v(), _v(Hq=4, Hkv=2, Nq=1, Nk=20)],
           lambda r: [_att(r), _att(r, nq=1, nk=ragged(r, 5, 90)),
                      _att(r, nq=ragged(r, 5, 40), nk=ragged(r, 40, 90)), _long(r, hq=1)]),
        _t(task, "causal (Nq != Nk; fully masked rows)", p[1],
           [_v(causal=True), _v(Hq=4, Hkv=2, Nq=19, Nk=7, causal=True), _v(Nq=7, Nk=70, causal=True)],
           lambda r: [_att(r, causal=True), *_masked_rows(r), *long(r, hq=1, causal=True)]),
        _t(task, "GQA (summed over the group)" if task.endswith("dkdv") else "GQA", p[2], [_v(Hq=4, Hkv=2)],
           lambda r: [_att(r, hq=4, hkv=2), _att(r, hq=6, hkv=2, causal=True), *long(r, hq=2, hkv=1)]),
        _t(task, "float16 / bfloat16", p[3], [_v(dtype="float16", Hq=4, Hkv=2, Nq=20, Nk=27, causal=True)],
           lambda r: [_att(r, "float16", causal=True), _att(r, "bfloat16", gpu=True),
                      *long(r, "float16", hq=1)]),
    ]


# FlashAttention benchmark convention: batch x sequence = 16k tokens, so the kernels, not the host, decide.
GPU_BWD = [dict(B=4, Hq=16, Hkv=16, Nq=4096, Nk=4096, d=64, dtype="bfloat16", timing_only=True),
           dict(B=4, Hq=16, Hkv=16, Nq=4096, Nk=4096, d=64, dtype="bfloat16", causal=True, timing_only=True)]

TESTS = [
    # Part 1: D = rowsum(dO o O)
    _t("flash_bwd_preprocess", "N a multiple of the block", 3, [dict(B=1, Hq=2, Nq=64, d=16, dtype="float32")],
       lambda r: [dict(B=1, Hq=int(r.integers(1, 4)), Nq=64 * int(r.integers(1, 3)), d=int(r.choice([16, 64])),
                       dtype="float32")]),
    _t("flash_bwd_preprocess", "ragged N, N = 1", 3, [dict(B=1, Hq=2, Nq=37, d=16, dtype="float32")],
       lambda r: [dict(B=1, Hq=2, Nq=ragged(r, 2, 200), d=32, dtype="float32"),
                  dict(B=1, Hq=1, Nq=1, d=16, dtype="float32"),
                  dict(B=1, Hq=1, Nq=multi_tile(r, MAX_TILE), d=16, dtype="float32")]),
    _t("flash_bwd_preprocess", "batch B > 1", 3, [dict(B=2, Hq=2, Nq=20, d=16, dtype="float32")],
       lambda r: [dict(B=int(r.integers(2, 4)), Hq=int(r.integers(1, 4)), Nq=ragged(r, 5, 100), d=16,
                       dtype="float32")]),
    _t("flash_bwd_preprocess", "float16 / bfloat16", 2, [dict(B=1, Hq=2, Nq=64, d=16, dtype="float16")],
       lambda r: [dict(B=1, Hq=2, Nq=128, d=32, dtype="float16"),
                  dict(B=1, Hq=2, Nq=64, d=32, dtype="bfloat16", gpu=True)]),

    # Part 2: dK, dV by key blocks
    *_stage_tests("flash_bwd_dkdv", (12, 12, 10, 4)),
    # Part 3: dQ by query blocks
    *_stage_tests("flash_bwd_dq", (9, 9, 7, 3)),

    # Part 4: the backward end to end, and autograd on top of the given forward
    # (B = 1, Nq == Nk, MQA rather than GQA: a bug that Parts 1-3 grade on its own line -- batch strides, the
    # causal offset, fully masked rows, the order of the query heads of a group -- costs only that line)
    _t("flash_attention_backward", "Parts 1-3 together (causal, MQA)", 5,
       [_v(Hq=4, Hkv=1, causal=True), _v(Hq=2, Hkv=1, causal=True, dtype="float16")],
       lambda r: [_att(r), _att(r, hq=2, hkv=1, causal=True), _att(r, "float16", causal=True),
                  _long(r, hq=1, causal=True, same=True)]),
    _t("flash_attention_backward", "speed vs reference FA2 backward (GPU)", 8, [], lambda r: GPU_BWD,
       kind="speed", gpu_only=True, reps=4, speed_full=1.5),  # reference: autotuned, causal split; not calibrated
    _t("flash_attention", "autograd (ragged N, causal and not, MQA)", 5, [_v(), _v(Hq=4, Hkv=1, causal=True)],
       lambda r: [_att(r), _att(r, hq=4, hkv=1, causal=True), _long(r, hq=1, same=True)]),
    _t("flash_attention", "autograd: scale argument", 5, [_v(scale=0.3, causal=True)],
       lambda r: [_scale_case(r)]),
]

def _scale_case(r):
    """A causal case with a custom scale at least 1.5x away from the default ``1/sqrt(d)`` (a scale drawn close to
    the default would let a backward that drops the scale pass: mutant ``w_autograd_drops_scale``)."""
    d = int(r.choice([16, 32]))
    factor = float(r.uniform(0.25, 0.65)) if r.integers(2) else float(r.uniform(1.5, 2.0))
    return _att(r, d=d, scale=factor / d ** 0.5, causal=True)


# The op audit (docs/design.md §6): torch may sum per-query-head dK/dV over the heads of a GQA group (a sum
# alone computes no gradient); a3b.flash_attention's forward is the notebook's given torch attention_forward.
GQA_SUM = ("sum",)

TASKS = {
    "a3b.flash_bwd_preprocess": Task("a3b.flash_bwd_preprocess", "flash_bwd_preprocess",
                                     build_triton_bwd_preprocess, oracle_triton_bwd_preprocess, framework="torch",
                                     case_timeout=120, tiled=(tiled("query length Nq", "Nq", MAX_TILE),)),
    "a3b.flash_bwd_dkdv": Task("a3b.flash_bwd_dkdv", "flash_bwd_dkdv", build_triton_bwd_dkdv,
                               oracle_triton_bwd_dkdv, framework="torch", case_timeout=300,
                               audit_allow=GQA_SUM, tiled=tiled_qk(MAX_TILE)),
    "a3b.flash_bwd_dq": Task("a3b.flash_bwd_dq", "flash_bwd_dq", build_triton_bwd_dq, oracle_triton_bwd_dq,
                             framework="torch", case_timeout=300, tiled=tiled_qk(MAX_TILE)),
    "a3b.flash_attention_backward": Task("a3b.flash_attention_backward", "flash_attention_backward",
                                         build_triton_backward, oracle_triton_backward, framework="torch",
                                         reference="reference.triton.flash_bwd:flash_attention_backward",
                                         case_timeout=300, audit_allow=GQA_SUM, tiled=tiled_qk(MAX_TILE)),
    "a3b.flash_attention": Task("a3b.flash_attention", "flash_attention", build_triton_autograd_given_forward,
                                oracle_triton_autograd, framework="torch", case_timeout=300,
                                audit_allow=GQA_SUM, audit_given=("attention_forward",), tiled=tiled_qk(MAX_TILE)),
}

ASSIGNMENT = Spec("a3b_triton_backward", SHORT, TASKS, TESTS, forbidden_imports=FORBIDDEN, needs_torch=True,
            address_space=8 << 30, rss_limit=4 << 30, load_timeout=120, total_timeout=1200)
