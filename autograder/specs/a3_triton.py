"""Spec of assignment a3_triton, in three parts on torch tensors: fused softmax; the FlashAttention-2 forward
without a mask (``flash_attention_forward_basic``, Hq == Hkv); the forward with a bottom-right causal mask and
GQA (``flash_attention_forward``). The backward is assignment a3b_triton_backward. An optional fourth part, an
FP8 forward (``flash_attention_forward_fp8``, ``_fp8.py``), adds 10 bonus points on a Hopper GPU (7 on CPU),
outside the denominator (``Test.optional``: ``max_bonus``, not ``max_score``).

Without a GPU the kernels run in the Triton interpreter on small shapes and the speed tests are "not run"
(excluded from max_score). Required points total 100 on a GPU (80 without one), plus up to 10 bonus points
(``score 80 / 80 (100.0%) + 7 / 7 bonus`` on CPU). Each graded call must launch at least one Triton kernel.
An ungraded warm-up (``scale_rows``, ``Spec.warmups``) has visible cases for ``check()`` and nothing else.
Tiles: at most ``MAX_TILE`` = 64 (BLOCK_M, BLOCK_N; the softmax's column block at most 4096, FP8 64 x 128);
hidden lengths reach 2-3 tiles plus a ragged tail.
"""
from __future__ import annotations

import numpy as np

from ._attn import build_triton_forward, oracle_triton_forward, tiled_qk, triton_case, triton_visible
from ._base import TOL_TRITON, Call, Spec, Task, Test, Tiled
from ._fp8 import fp8_task, fp8_tests
from ._gen import arr, multi_tile, out, ragged, randn
from .. import oracles

SHORT = "a3"
FORBIDDEN = ("scipy", "jax", "tensorflow", "flash_attn", "xformers")
# The largest tiles the spec expects (the solution's BLOCK_M = BLOCK_N = 64, on a GPU and in the interpreter; the
# softmax's column block capped at 4096): every grading has hidden lengths of 2-3 such tiles plus a ragged tail.
MAX_TILE = 64
SOFTMAX_MAX_TILE = 4096


def build_softmax(p, rng):
    x = randn(rng, p["shape"], p["dtype"])
    if p.get("shift"):
        x = (x.astype(np.float64) + p["shift"]).astype(x.dtype)
    tol = TOL_TRITON[p["dtype"]] * max(1.0, p.get("shift", 0.0) / 10.0)
    c = Call([arr(x, p["dtype"])], {}, [out("p", p["dtype"], tol, "torch", dtypes=(p["dtype"],))])
    c.arg_names = ["x"]
    return c


def oracle_softmax(call):
    return [oracles.softmax(call.args[0].value)]


def build_scale_rows(p, rng):
    """The warm-up: ``x (rows, cols)`` float32 and one scale per row ``s (rows,)``."""
    x = randn(rng, p["shape"], "float32")
    s = randn(rng, (p["shape"][0],), "float32")
    c = Call([arr(x, "float32"), arr(s, "float32")], {},
             [out("y", "float32", TOL_TRITON["float32"], "torch", dtypes=("float32",))])
    c.arg_names = ["x", "s"]
    return c


def oracle_scale_rows(call):
    x, s = (np.asarray(a.value, dtype=np.float64) for a in call.args)
    return [x * s[:, None]]


_att, _v = triton_case, triton_visible


def _t(task, name, points, visible, hidden, **kw):
    return Test(f"{SHORT}.{task}: {name}", f"{SHORT}.{task}", points, visible, hidden, **kw)


def _long(rng, causal=False, same=False, nq=None, **kw):
    """Nq and Nk of 2-3 tiles of ``MAX_TILE`` plus a ragged tail (one head, d = 16 unless given: cheap in the
    interpreter): the kernel must carry (m, l, acc) over several key tiles, rescaling by alpha, in several query
    blocks (>= 129 query rows: some row's running max grows after its first key tile on every draw).
    ``same``: Nq == Nk (a causal case of a test other than "Nq != Nk", where a top-left mask is still right);
    ``nq``: a query length of its own (Nq != Nk)."""
    nq = nq or multi_tile(rng, MAX_TILE)
    if causal:
        kw["causal"] = True
    kw = {"hq": 1, "hkv": 1, "d": 16, **kw}
    return _att(rng, nq=nq, nk=nq if same else multi_tile(rng, MAX_TILE), **kw)


def _long_rows(rng, dtype="float32", **kw):
    """A softmax case of eight rows spanning 2-3 column blocks of ``SOFTMAX_MAX_TILE`` plus a ragged tail."""
    return dict(shape=(8, multi_tile(rng, SOFTMAX_MAX_TILE)), dtype=dtype, **kw)


def _mha(rng, **kw):
    """A Part 2 case: one kv head per query head, no mask."""
    h = int(rng.integers(1, 3))
    return _att(rng, hq=h, hkv=h, **kw)


def _custom_scale(rng) -> dict:
    """``d`` and a scale at least 1.5x away from the default ``1/sqrt(d)``: a draw near the default would let a
    kernel that ignores its scale argument pass (mutant ``w_basic_ignores_scale``)."""
    d = int(rng.choice([16, 32]))
    factor = float(rng.uniform(0.25, 0.65)) if rng.integers(2) else float(rng.uniform(1.5, 2.0))
    return dict(d=d, scale=factor / d ** 0.5)


# Speed cases follow the FlashAttention benchmarks' convention, batch x sequence = 16k tokens, so that the
# kernel and not the host (launch, descriptor set-up: ~50 us) decides the ratio (notes/gpu_validation.md).
GPU_FWD = [dict(B=4, Hq=16, Hkv=16, Nq=4096, Nk=4096, d=64, dtype="bfloat16", timing_only=True),
           dict(B=2, Hq=16, Hkv=16, Nq=8192, Nk=8192, d=128, dtype="bfloat16", timing_only=True)]
# Full points up to 1.5x the reference's time: the reference is autotuned (TMA loads, the causal loop split into
# unmasked and diagonal blocks); a plain 64 x 64, 4-warp kernel like the solution's is its best pinned config
# (notes/triton_attention.md, "Pinned forward configs") without those two, and should not lose points for them.
FWD_FULL = 1.5
GPU_CAUSAL = [dict(B=4, Hq=16, Hkv=16, Nq=4096, Nk=4096, d=64, dtype="bfloat16", causal=True, timing_only=True),
              dict(B=2, Hq=16, Hkv=4, Nq=8192, Nk=8192, d=128, dtype="bfloat16", causal=True, timing_only=True)]

TESTS = [
    # Part 1: fused softmax
    _t("softmax", "basic", 6, [dict(shape=(5, 37), dtype="float32")],
       lambda r: [dict(shape=(int(r.integers(2, 20)), ragged(r, 5, 300)), dtype="float32"),
                  dict(shape=(2, 3, ragged(r, 5, 100)), dtype="float32"), _long_rows(r)]),
    _t("softmax", "long rows", 4, [dict(shape=(2, 4500), dtype="float32")],
       lambda r: [dict(shape=(3, ragged(r, 1025, 5000)), dtype="float32"),
                  _long_rows(r)]),
    _t("softmax", "large logits", 4, [dict(shape=(3, 40), dtype="float32", shift=100.0)],
       lambda r: [dict(shape=(4, ragged(r, 5, 300)), dtype="float32", shift=100.0), _long_rows(r, shift=100.0)]),
    _t("softmax", "float16 / bfloat16", 2, [dict(shape=(3, 40), dtype="float16")],
       lambda r: [dict(shape=(4, ragged(r, 5, 300)), dtype="float16"),
                  dict(shape=(4, ragged(r, 5, 300)), dtype="bfloat16", gpu=True), _long_rows(r, "float16")]),
    # Full points up to 1.5x: graded on the device clock, these 8-15 us kernels are no longer hidden by the host
    # time of a call (0.93-1.04x on the host clock), and the reference packs several short rows per program,
    # which the assignment does not ask for; 3x the kernel time still scores 0 (notes/speed_calibration.md)
    _t("softmax", "speed vs reference fused softmax (GPU)", 4, [],
       lambda r: [dict(shape=(4096, 4096), dtype="float16"), dict(shape=(8192, 1000), dtype="bfloat16")],
       kind="speed", gpu_only=True, reps=5, speed_full=1.5),

    # Part 2: the forward kernel without a mask, Hq == Hkv
    _t("flash_attention_forward_basic", "basic (ragged N, N = 1)", 12, [_v(), _v(Nq=1, Nk=1)],
       lambda r: [_mha(r), _mha(r, nq=1, nk=1), _mha(r, d=64), _long(r, same=True)]),
    _t("flash_attention_forward_basic", "Nq != Nk", 8, [_v(Nq=7, Nk=45)],
       lambda r: [_mha(r, nq=ragged(r, 5, 40), nk=ragged(r, 40, 90)),
                  _mha(r, nq=ragged(r, 40, 90), nk=ragged(r, 2, 30)), _long(r)]),
    _t("flash_attention_forward_basic", "scale argument", 5, [_v(scale=0.3)],
       lambda r: [_mha(r, **_custom_scale(r)), _long(r, same=True, **_custom_scale(r))]),
    _t("flash_attention_forward_basic", "large logits", 6, [_v(shift=100.0)],
       lambda r: [_mha(r, shift=100.0), _long(r, same=True, shift=100.0)]),
    _t("flash_attention_forward_basic", "float16 / bfloat16", 4, [_v(dtype="float16")],
       lambda r: [_mha(r, dtype="float16"), _mha(r, dtype="bfloat16", gpu=True), _long(r, same=True, dtype="float16")]),
    _t("flash_attention_forward_basic", "speed vs reference FA2 forward (GPU)", 8, [], lambda r: GPU_FWD,
       kind="speed", gpu_only=True, reps=4, speed_full=FWD_FULL),

    # Part 3: bottom-right causal mask and GQA
    _t("flash_attention_forward", "causal", 10, [_v(causal=True)],
       lambda r: [_att(r, causal=True), _att(r, causal=True, d=32), _long(r, causal=True, same=True)]),
    _t("flash_attention_forward", "causal, Nq != Nk (bottom-right; fully masked rows)", 8,
       [_v(Nq=7, Nk=19, causal=True), _v(Hq=4, Hkv=2, Nq=19, Nk=7, causal=True)],
       lambda r: [_att(r, causal=True, nq=ragged(r, 5, 30), nk=ragged(r, 40, 80)),
                  _att(r, causal=True, nq=ragged(r, 40, 80), nk=ragged(r, 5, 30)),
                  _att(r, causal=True, nq=ragged(r, 17, 40), nk=multi_tile(r, MAX_TILE), hq=1, d=16)]),
    _t("flash_attention_forward", "GQA / MQA (causal and not)", 8, [_v(Hq=4, Hkv=2), _v(Hq=4, Hkv=1, causal=True)],
       lambda r: [_att(r, hq=4, hkv=2), _att(r, hq=6, hkv=2, causal=True), _att(r, hq=4, hkv=1, causal=True),
                  _long(r, causal=True, same=True, hq=2, hkv=1)]),
    _t("flash_attention_forward", "float16 / bfloat16", 3, [_v(dtype="float16", causal=True, Hq=4, Hkv=2)],
       lambda r: [_att(r, "float16", causal=True), _att(r, "bfloat16", causal=True, gpu=True),
                  _long(r, causal=True, same=True, dtype="float16")]),
    _t("flash_attention_forward", "speed vs reference FA2 forward, causal + GQA (GPU)", 8, [],
       lambda r: GPU_CAUSAL, kind="speed", gpu_only=True, reps=4, speed_full=FWD_FULL),

    # Part 4 (optional bonus, on top of the 100): an FP8 forward; Hopper GPUs only (CPU: the interpreter)
    *fp8_tests(SHORT),
]

# The ungraded warm-up (``Spec.warmups``): the first Triton kernel a student writes, checked by ``check()`` on
# visible cases only; 0 points, no hidden cases, never run by the grader. Ragged rows and columns, a row longer
# than one column block, a single element.
WARMUP_TESTS = [
    Test(f"{SHORT}.scale_rows: warm-up (not graded)", f"{SHORT}.scale_rows", 0,
         [dict(shape=(3, 50)), dict(shape=(5, 1000)), dict(shape=(1, 1))]),
]
WARMUPS = {"a3.scale_rows": Task("a3.scale_rows", "scale_rows", build_scale_rows, oracle_scale_rows,
                                 framework="torch", case_timeout=60)}

TASKS = {
    "a3.softmax": Task("a3.softmax", "softmax", build_softmax, oracle_softmax, framework="torch",
                       reference="reference.triton:softmax", case_timeout=120,
                       tiled=(Tiled("row length", lambda p: p["shape"][-1], lambda p: SOFTMAX_MAX_TILE),)),
    "a3.flash_attention_forward_basic": Task("a3.flash_attention_forward_basic", "flash_attention_forward_basic",
                                             build_triton_forward, oracle_triton_forward, framework="torch",
                                             reference="reference.triton:flash_attention_forward",
                                             case_timeout=180, tiled=tiled_qk(MAX_TILE)),
    "a3.flash_attention_forward": Task("a3.flash_attention_forward", "flash_attention_forward",
                                       build_triton_forward, oracle_triton_forward, framework="torch",
                                       reference="reference.triton:flash_attention_forward", case_timeout=180,
                                       tiled=tiled_qk(MAX_TILE)),
    "a3.flash_attention_forward_fp8": fp8_task(SHORT),
}

ASSIGNMENT = Spec("a3_triton", SHORT, TASKS, TESTS, forbidden_imports=FORBIDDEN, needs_torch=True,
            address_space=8 << 30, rss_limit=4 << 30,
            load_timeout=120, total_timeout=1200, warmups=WARMUPS, warmup_tests=WARMUP_TESTS)
