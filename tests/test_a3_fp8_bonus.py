"""a3's optional FP8 part: where its error bounds come from, the given e4m3 helpers, the solution, the Hopper skip.

The bounds of ``autograder/specs/_fp8.py`` are checked against an *ideal* FP8 pipeline written here in NumPy:
Q, K, V rounded to e4m3 per block of rows (one scale ``amax / 448`` each), ``P`` rounded to e4m3, everything
else exact in float64. A correct kernel differs from it only in block sizes and the order of sums, so the
bound must sit well above its error on the spec's own case generators, and well below the error of the
mistakes the zoo's mutants make (no V dequantisation scale, no scale at all).
"""
from __future__ import annotations

import numpy as np
import pytest

import torch

from reference.triton import DEVICE  # first: sets TRITON_INTERPRET=1 without a GPU
import triton  # noqa: E402

from autograder import engine
from autograder.compare import rel_error
from autograder.specs import _fp8, load
from tests.common_numpy import load_solution as _load_solution

pytestmark = pytest.mark.a3_fp8

E4M3_MAX = 448.0


def e4m3(x):
    """Round to the nearest float8 e4m3 value (ties to even): 3 mantissa bits, subnormal step 2^-9."""
    e = np.floor(np.log2(np.maximum(np.abs(x), 2.0 ** -6)))
    step = 2.0 ** (e - 3)
    return np.clip(np.rint(x / step) * step, -E4M3_MAX, E4M3_MAX)


def quantize(x, block, scaled=True, dequantize=True):
    """Dequantised values of ``x (B, H, N, d)`` after per-block e4m3 rounding (``scaled=False``: plain cast;
    ``dequantize=False``: the e4m3 values without their scale)."""
    B, H, N, d = x.shape
    nb = -(-N // block)
    xp = np.zeros((B, H, nb * block, d))
    xp[:, :, :N] = x
    xb = xp.reshape(B, H, nb, block, d)
    amax = np.abs(xb).max(axis=(-1, -2), keepdims=True)
    s = np.where(amax > 0, amax / E4M3_MAX, 1.0) if scaled else np.ones_like(amax)
    return (e4m3(xb / s) * (s if dequantize else 1.0)).reshape(B, H, nb * block, d)[:, :, :N]


def ideal_fp8(q, k, v, causal, bm=32, bn=32, scaled=True, v_scale=True):
    """o of the ideal FP8 pipeline (module docstring); ``v_scale=False`` drops V's dequantisation scale."""
    qd, kd = quantize(q, bm, scaled), quantize(k, bn, scaled)
    vd = quantize(v, bn, scaled, dequantize=v_scale)
    g = q.shape[1] // k.shape[1]
    kd, vd = np.repeat(kd, g, 1), np.repeat(vd, g, 1)
    s = qd @ kd.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    nq, nk = s.shape[-2:]
    if causal:
        s = np.where(np.arange(nk)[None] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        return (e4m3(p * 256) / 256) @ vd / np.where(l > 0, l, 1.0)


def _cases(test, n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        for p in test.hidden(rng):
            call = _fp8.build_fp8(p, rng)
            yield p, call, _fp8.oracle_fp8(call)


def _err(o, expected):
    err, msg = rel_error(o, expected)
    return float("inf") if msg else err


@pytest.mark.parametrize("which, margin", [(0, 1.5), (1, 1.2)])
def test_bounds_sit_above_an_ideal_fp8_pipeline(which, margin):
    """Every block size a student may choose stays under the bound with room to spare."""
    test = _fp8.fp8_tests("a3")[which]
    worst = 0.0
    for p, call, (o, _) in _cases(test, 25, which):
        q, k, v = (a.value.astype(np.float64) for a in call.args)
        for bm, bn in ((16, 32), (64, 128)):
            worst = max(worst, _err(ideal_fp8(q, k, v, p.get("causal", False), bm, bn), o))
    tol = call.outs[0].tol
    assert worst * margin < tol, (worst, tol)
    assert worst > tol / 20  # the bound is not vacuous: FP8's own error is a sizeable part of it


def test_bounds_catch_the_zoo_mistakes():
    """A missing V scale fails both accuracy tests; a plain cast (no scale) fails the outlier test."""
    normal, outliers = _fp8.fp8_tests("a3")[:2]
    # without V's scale o is off by amax / 448 of V's blocks: ~150x on normal inputs, ~1/100 on the heads at 1e4
    for test, factor in ((normal, 100), (outliers, 1.5)):
        for p, call, (o, _) in _cases(test, 3, 7):
            q, k, v = (a.value.astype(np.float64) for a in call.args)
            assert _err(ideal_fp8(q, k, v, p.get("causal", False), v_scale=False), o) > factor * call.outs[0].tol
    for p, call, (o, _) in _cases(outliers, 3, 8):
        if p.get("v_ramp"):  # 1e-2..1e2 fits e4m3's range: the outlier cases of the test catch a plain cast
            continue
        q, k, v = (a.value.astype(np.float64) for a in call.args)
        assert _err(ideal_fp8(q, k, v, p.get("causal", False), scaled=False), o) > 1.5 * call.outs[0].tol


def test_e4m3_rounding_matches_torch():
    """Round to nearest even, subnormals included, inside e4m3's range (|x| <= 448). Past it torch versions
    differ (2.13 saturates to 448, 2.11 gives NaN; measured on the H100's torch 2.11) and ``e4m3`` clips;
    the block scales keep every quantised value inside the range, so only the range is compared."""
    x = np.random.default_rng(0).standard_normal(20000) * 10.0 ** np.random.default_rng(1).uniform(-4, 2.6, 20000)
    x = np.concatenate([x, [0.4963, 100.0, 0.0156, 447.9, -3.3e-3, 0.0, 448.0, -448.0, 1.5 * 2.0 ** -9]])
    x = x[np.abs(x.astype(np.float32)) <= E4M3_MAX]
    assert x.size > 19000
    got = torch.from_numpy(x).float().to(torch.float8_e4m3fn).double().numpy()
    assert np.array_equal(e4m3(x.astype(np.float32).astype(np.float64)), got)
    assert e4m3(np.array([500.0, -1e4]))[0] == E4M3_MAX and e4m3(np.array([-1e4]))[0] == -E4M3_MAX


@pytest.mark.parametrize("cap, runs", [((8, 0, "NVIDIA A100"), False), ((8, 9, "NVIDIA L4"), False),
                                       ((9, 0, "NVIDIA H100"), True), ((10, 0, "NVIDIA B200"), True)])
def test_grader_skips_fp8_tests_before_hopper(monkeypatch, cap, runs):
    monkeypatch.setattr(engine, "gpu_capability", lambda: cap)
    fp8 = _fp8.fp8_tests("a3")
    assert len(fp8) == 3 and all(t.min_capability == (9, 0) for t in fp8)
    g = engine.Grader("a3_triton", device="cuda")
    for t in fp8:
        why = g.not_run_here(t)
        if runs:
            assert why is None
        else:
            assert f"sm_{cap[0]}{cap[1]}" in why and "compute capability >= 9.0" in why and cap[2] in why
    others = [t for t in load("a3_triton").tests if "(FP8)" not in t.name]
    assert all(g.not_run_here(t) is None for t in others)  # nothing else depends on the GPU's generation
    cpu = engine.Grader("a3_triton", device="cpu")
    assert [cpu.not_run_here(t) for t in fp8] == [None, None, "not run: no GPU (excluded from max_score)"]


# ---------------------------------------------------------------- the solution source and the a3 spec
@pytest.fixture(scope="module")
def sol(tmp_path_factory):
    return _load_solution("a3_triton", tmp_path_factory.mktemp("a3fp8"))


def test_given_to_fp8_rounds_like_torch_under_the_interpreter(sol):
    """The interpreter's own cast gets carries wrong (0.4963 -> 0.25); the quantisation through the given
    ``to_fp8`` matches torch's cast (blocks whose amax is 448 have scale 1, so their values reach the cast as
    they are)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * 10.0 ** (torch.rand(4096, generator=gen) * 5.5 - 3)
    x[:7] = torch.tensor([0.4963, 101.0, 0.0156, 447.9, -0.4963, 0.0, -3.3e-3])
    x = x.clamp(-448, 448).view(1, 1, 128, 32)
    x[:, :, ::32, 31] = 448.0  # one 448 in each block of 32 rows
    y8, scales = sol.quantize_fp8(x.to(DEVICE), 32)
    assert torch.allclose(scales.cpu(), torch.ones(1, 1, 4), rtol=1e-6, atol=0)
    got = y8.cpu().float()
    assert got.flatten()[:3].tolist() == [0.5, 104.0, 0.015625]
    # compiled, x / scale may be off by an ulp (approximate division), which can flip a value lying next to a
    # rounding midpoint: allow a few such flips by one e4m3 step, nothing else
    want = x.to(torch.float8_e4m3fn).float()
    diff = got != want
    assert int(diff.sum()) <= 2 and bool(((got - want).abs() <= want.abs() * 2.0 ** -3 + 2.0 ** -9)[diff].all())


@pytest.mark.parametrize("n, block, transposed", [(37, 16, False), (70, 32, True), (1, 16, True)])
def test_solution_block_quantisation(sol, n, block, transposed):
    rng = np.random.default_rng(n)
    x = torch.tensor(rng.standard_normal((2, 3, n, 32)) * 10.0 ** rng.uniform(-3, 3, (2, 3, n, 1)),
                     dtype=torch.float32)
    x8, s = (t.cpu() for t in sol.quantize_fp8(x.to(DEVICE), block, transposed=transposed))
    nb = -(-n // block)
    assert s.shape == (2, 3, nb) and x8.dtype == torch.float8_e4m3fn
    data = x8.float().transpose(-1, -2) if transposed else x8.float()
    assert data.shape == (2, 3, nb * block, 32)
    assert torch.all(data[:, :, n:] == 0)  # padding rows are zeros
    xp = torch.nn.functional.pad(x, (0, 0, 0, nb * block - n)).view(2, 3, nb, block, 32)
    assert torch.allclose(s, xp.abs().amax(dim=(-1, -2)) / E4M3_MAX, rtol=1e-6)
    back = (data.view(2, 3, nb, block, 32) * s[..., None, None]).view(2, 3, nb * block, 32)[:, :, :n].double()
    # e4m3 has 3 mantissa bits: relative rounding error <= 2^-4 for normal numbers, absolute below that
    floor = s.double().repeat_interleave(block, -1)[..., :n, None] * 2.0 ** -9
    assert bool(((back - x.double()).abs() <= torch.maximum(x.double().abs() * 2.0 ** -4, floor) * 1.0001).all())
    # and the nearest e4m3 value, but for ulp-level flips next to rounding midpoints (approximate GPU division)
    want = torch.from_numpy(quantize(x.double().numpy(), block))
    assert float((~torch.isclose(back, want, rtol=1e-6, atol=0)).double().mean()) < 1e-3


def test_solution_hadamard_lowers_the_outlier_error(sol):
    """The ungraded option works: with outlier channels the rotation lowers the error (notes/hopper.md: 3x)."""
    rng = np.random.default_rng(3)
    p = dict(B=1, Hq=4, Hkv=2, Nq=64, Nk=64, d=64, dtype="bfloat16", outliers=3)
    q, k, v = (torch.tensor(x).to(DEVICE, torch.bfloat16) for x in _fp8.make_fp8_qkv(p, rng))
    o_ref = _fp8.oracles.attention(*(x.cpu().float().numpy() for x in (q, k, v)))[0]

    def err(hadamard, seed):
        o = sol.flash_attention_forward_fp8(q, k, v, hadamard=hadamard, seed=seed)[0]
        return _err(o.cpu().float().numpy(), o_ref)
    errs = [np.mean([err(h, s) for s in range(3)]) for h in (False, True)]
    assert errs[1] * 1.5 < errs[0], errs


def test_solution_needs_hopper(sol, monkeypatch):
    monkeypatch.setattr(sol, "INTERPRET", triton.language.constexpr(False))  # a compiled run on an A100
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(RuntimeError, match=r"compute capability >= 9\.0 \(Hopper.*A100 is sm_80"):
        sol.check_fp8_device(torch.device("cuda"))
    sol.check_fp8_device(torch.device("cpu"))
    monkeypatch.setattr(sol, "INTERPRET", triton.language.constexpr(True))
    sol.check_fp8_device(torch.device("cuda"))  # the interpreter runs anywhere
    q = torch.ones(1, 1, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head dimension"):
        sol.flash_attention_forward_fp8(q, q, q)


def test_random_hadamard_is_orthogonal(sol):
    j = sol.random_hadamard(64, 5, "cpu").double()
    assert torch.allclose(j @ j.T, torch.eye(64, dtype=torch.float64), atol=1e-6)
    assert not torch.equal(j, sol.random_hadamard(64, 6, "cpu").double())


def test_bonus_leaves_the_other_points_alone():
    spec = load("a3_triton")
    fp8 = [t for t in spec.tests if "optional (FP8)" in t.name]
    assert sum(t.points for t in fp8) == 10 and all(t.optional for t in fp8)
    assert spec.max_bonus == 10 and spec.max_points == 100          # bonus: outside the required 100
