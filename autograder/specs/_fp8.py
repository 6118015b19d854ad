"""The optional FP8 forward part of a3 (FlashAttention-3, Shah et al. 2024, section 3.3): its cases, bounds and tests.

``flash_attention_forward_fp8(q, k, v, causal=False, scale=None) -> (o bfloat16, lse float32)`` on bf16 inputs,
judged against float64 attention of those inputs (``oracles.attention``).

Bounds (relative error over the whole tensor, the grader's usual measure). e4m3 keeps 3 mantissa bits, so
rounding moves an entry by up to ``u = 2^-4`` of itself (RMS about ``u / 2``). ``o`` collects the roundings of
Q, K (through the scores), V and P; an ideal FP8 pipeline (every rounding exact to the bit, everything else in
float64: ``tests/test_a3_fp8_bonus.py``) measures 0.04-0.06 on normal inputs, whatever the block sizes, and
the reference kernel 0.047-0.055 on an H100/H200 (notes/hopper.md). Bound ``O_TOL["normal"] = 0.1``. With a
few channels of Q and K times 10 the logits are ~20x larger and so is their absolute rounding error: the ideal
pipeline measures 0.05-0.36 (mean 0.17), the reference kernel 0.23 at d = 128; bound 0.5. The log-sum-exp
moves by the rounding of the scores it is made of: <= 0.035 relative measured, bound 0.1. A missing
dequantisation scale, or none at all (values above 448 saturate or turn NaN, values below 2^-9 vanish), is
off by 0.7 to 10^6.

Outlier inputs also give the kv heads of V magnitudes near 1e-4 and 1e4 (per-block scales keep both; a plain
cast to e4m3 does not), and one case ramps V from 1e-2 to 1e2 along the keys (normal Q, K), so that a kernel
that mixes the scales of different key blocks of one head fails. FP8 needs compute capability 9.0 on a GPU:
the tests say "not run" on older GPUs (``Test.min_capability``); on CPU the accuracy tests run in the Triton
interpreter and the speed test is not run. The tests are ``optional``: bonus points on top of the assignment's
100, outside its max_score, as a4's optional part is.
"""
from __future__ import annotations

import numpy as np

from ._attn import _bf, _kw, shapes, tiled_qk
from ._base import Call, Out, Task, Test
from ._gen import arr, bf16_round, multi_tile, ragged
from .. import oracles

O_TOL = {"normal": 0.1, "outliers": 0.5}
LSE_TOL = 0.1
OUTLIER_FACTOR = 10.0
FP8_DIMS = (32, 64)          # head dimensions of the CPU cases (the kernels take 32, 64, 128)
# The largest tiles the spec expects (the solution's GPU tiles, BLOCK_M x BLOCK_N = 64 x 128; it uses 16 x 32 in
# the interpreter): every grading has a hidden case of 2-3 such tiles plus a ragged tail on both axes.
MAX_TILE_M, MAX_TILE_N = 64, 128
HOPPER = (9, 0)
# speed: full points at <= 1/1.2 of the bf16 reference forward's time, none at >= its time
SPEED_FULL, SPEED_ZERO = round(1 / 1.2, 4), 1.0
# d = 128 and long sequences, where the FP8 matmuls decide the time; quantisation included in the timing
# (``timing_only``: the parent's template is zeros of the right shapes; the timing children draw the values)
GPU_CASES = [dict(B=2, Hq=16, Hkv=16, Nq=8192, Nk=8192, d=128, dtype="bfloat16", timing_only=True),
             dict(B=1, Hq=16, Hkv=16, Nq=16384, Nk=16384, d=128, dtype="bfloat16", causal=True, timing_only=True)]


def make_fp8_qkv(p, rng):
    """Standard-normal q, k, v rounded to bf16. ``outliers=n``: n channels of q and k (the same ones) times
    ``OUTLIER_FACTOR`` (the FlashAttention-3 talk's outlier features), and kv head h of v scaled by about
    1e-4 (even h) or 1e4 (odd h). ``v_ramp``: row j of v times ``10^(4 j / (Nk - 1) - 2)``, 1e-2 to 1e2 along
    the keys, so that the key blocks of one head have different scales whatever the block size."""
    qs, ks = shapes(p)
    if p.get("timing_only"):
        return np.zeros(qs, np.float32), np.zeros(ks, np.float32), np.zeros(ks, np.float32)
    q, k, v = rng.standard_normal(qs), rng.standard_normal(ks), rng.standard_normal(ks)
    n = p.get("outliers", 0)
    if n:
        ch = rng.choice(p["d"], n, replace=False)
        q[..., ch] *= OUTLIER_FACTOR
        k[..., ch] *= OUTLIER_FACTOR
        exps = np.where(np.arange(p["Hkv"]) % 2 == 0, -4.0, 4.0) + rng.uniform(-0.3, 0.3, p["Hkv"])
        v = v * (10.0 ** exps)[None, :, None, None]
    if p.get("v_ramp"):
        v = v * (10.0 ** np.linspace(-2.0, 2.0, p["Nk"]))[:, None]
    return bf16_round(q), bf16_round(k), bf16_round(v)


def build_fp8(p, rng):
    q, k, v = make_fp8_qkv(p, rng)
    kind = "outliers" if p.get("outliers") or p.get("v_ramp") else "normal"
    c = Call([arr(x, torch_dtype="bfloat16") for x in (q, k, v)], _kw(p),
             [_bf("o", O_TOL[kind]), Out("lse", ("float32",), LSE_TOL, "torch")])
    c.arg_names = ["q", "k", "v"]
    return c


def oracle_fp8(call):
    q, k, v = (a.value for a in call.args)
    return list(oracles.attention(q, k, v, call.kwargs.get("causal", False), call.kwargs.get("scale")))


def _case(rng, nq=None, nk=None, hq=None, hkv=1, **extra):
    n = ragged(rng, 9, 90)
    return dict(B=1, Hq=hq or hkv * int(rng.integers(1, 3)), Hkv=hkv, Nq=nq or n, Nk=nk or n,
                d=int(rng.choice(FP8_DIMS)), dtype="bfloat16", **extra)


def _long(rng, axis):
    """One head, d = 32: ``axis`` "k": Nk of 2-3 tiles of ``MAX_TILE_N`` plus a ragged tail (a few query rows);
    "q": Nq of 2-3 tiles of ``MAX_TILE_M`` plus a tail (a few keys). Apart, each costs a third of both at once
    in the interpreter (Nq x Nk), and every a3 grading of the selftest runs them."""
    if axis == "k":
        return dict(B=1, Hq=1, Hkv=1, Nq=ragged(rng, 17, 40), Nk=multi_tile(rng, MAX_TILE_N), d=32,
                    dtype="bfloat16")
    return dict(B=1, Hq=1, Hkv=1, Nq=multi_tile(rng, MAX_TILE_M), Nk=ragged(rng, 20, 60), d=32, dtype="bfloat16")


def _visible(**kw):
    base = dict(B=1, Hq=2, Hkv=2, Nq=40, Nk=40, d=32, dtype="bfloat16")
    base.update(kw)
    return base


def fp8_task(short):
    tid = f"{short}.flash_attention_forward_fp8"
    # the given Hadamard rotation ``q.float() @ J`` multiplies input data by a constant matrix: allowed with at
    # most one operand derived from the inputs (``q @ k^T`` has two)
    return Task(tid, "flash_attention_forward_fp8", build_fp8, oracle_fp8, framework="torch",
                reference="reference.triton:flash_attention_forward", case_timeout=180, audit_allow=("mm:1",),
                tiled=tiled_qk(MAX_TILE_M, MAX_TILE_N))


def fp8_evidence(params, audit):
    """The FP8 part's defining property (docs/design.md §6): float8 tiles reach the matmuls. Evidence from the op
    audit's record of the Triton launches: some kernel receives at least two float8 (e4m3) tensors (Q8 and K8,
    or K8 and V8). A forward that never quantises (an fp32 or bf16 kernel passes the accuracy bounds) has none."""
    launches = audit.get("launches", [])
    if not launches or max(g.get("float8_args", 0) for g in launches) >= 2:
        return None
    return ("no Triton kernel received float8 tensors (Q8/K8/V8): the FP8 forward must feed e4m3 tiles to "
            f"tl.dot ({len(launches)} launch(es), float8 arguments per launch: "
            f"{[g.get('float8_args', 0) for g in launches][:6]})")


def fp8_tests(short, points=(4, 3, 3)):
    """The three bonus tests: accuracy on normal inputs, accuracy with outliers, speed (Hopper only)."""
    tid = f"{short}.flash_attention_forward_fp8"

    def t(name, pts, visible, hidden, **kw):
        return Test(f"{tid}: optional (FP8): {name}", tid, pts, visible, hidden, min_capability=HOPPER,
                    optional=True, **kw)

    return [
        t("accuracy, normal inputs (ragged N, causal Nq != Nk, GQA)", points[0],
          [_visible(), _visible(Hq=4, Hkv=2, Nq=40, Nk=19, causal=True)],
          lambda r: [_case(r), _case(r, causal=True, nq=ragged(r, 30, 70), nk=ragged(r, 5, 25)),
                     _case(r, hq=4, hkv=2, causal=True), _long(r, "k"), _long(r, "q")],
          gate=True, evidence=fp8_evidence),
        t(f"accuracy, outlier channels (x{OUTLIER_FACTOR:.0f}), V at 1e-4 / 1e4 by head and 1e-2..1e2 along N",
          points[1], [_visible(outliers=3, d=64), _visible(outliers=3, Hq=4, Hkv=2, Nq=40, Nk=19, causal=True)],
          lambda r: [_case(r, hkv=2, outliers=int(r.integers(2, 5))),
                     _case(r, hq=4, hkv=2, outliers=int(r.integers(2, 5)), causal=True),
                     _case(r, v_ramp=True, nk=ragged(r, 70, 130), causal=bool(r.integers(2)))],
          evidence=fp8_evidence),
        t("speed vs the reference bf16 forward (Hopper GPU)", points[2], [], lambda r: GPU_CASES,
          kind="speed", gpu_only=True, speed_full=SPEED_FULL, speed_zero=SPEED_ZERO, reps=4),
    ]
