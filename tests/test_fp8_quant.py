"""The fused FP8 quantisation (``reference.triton.hopper.fp8_quant.quantize_qkv_fp8``) against the torch path
(``flash_fp8.quantize_fp8_blocks`` + ``rotate`` + ``permute_keys``) and a float64 oracle.

CPU (interpreter): ragged shapes, GQA, blocks of 16 / 32 and 64 / 128 rows, Hadamard on and off, float16 /
bfloat16 / float32 and strided inputs: without the rotation the e4m3 bytes and the scales equal the torch path's
bit for bit; with it the bytes are within one e4m3 step and the scales within float32 rounding. Independently of
the torch path, the dequantised values are checked against float64 (``x`` or ``x J`` in float64) with e4m3's
error bound and each scale against the float64 block maximum / 448. End to end, the Triton FP8 forward on the
fused quantisation equals it on the torch path and stays within the FP8 bounds of float64 attention. Bad input
raises naming the argument. The kernel is compiled for sm_90a on CPU (registers, no spills). On a Hopper GPU the
same comparisons run compiled, and the Gluon entry point (which uses the fused kernel there) against float64.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from reference.triton import DEVICE, INTERPRET
from reference.triton.configs import Fp8QuantConfig
from reference.triton.hopper import fp8_quant as fq
from reference.triton.hopper.flash_fp8 import (Fp8KeyPermuted, attention_fp8, prepare_fp8, quantize_fp8_blocks,
                                               rotate)
from tests.oracle import attention_ref, rel_err
from tests import sm90_compile

pytestmark = pytest.mark.triton_hopper
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
SMALL = Fp8QuantConfig(q_per_program=2, kv_per_program=1, num_warps=4)
#: relative difference of the scales with the rotation: float32 sums in another order (interpreter: NumPy's; GPU: the
#: bf16 tensor core's fp32 accumulation against cuBLAS's fp32 matmul)
ROT_RTOL = 1e-6 if INTERPRET else 1e-5


def t(rng, *shape, dtype=torch.bfloat16, spread=1.0):
    x = rng.standard_normal(shape) * spread * rng.uniform(0.01, 10, (*shape[:-1], 1)) + rng.uniform(-0.5, 0.5)
    return torch.tensor(x, dtype=dtype, device=DEVICE)


def randn(rng, *shape):
    """N(0, 1) bfloat16: attention's FP8 error against exact attention is bounded (0.1) for such inputs."""
    return torch.tensor(rng.standard_normal(shape), dtype=torch.bfloat16, device=DEVICE)


def ordinal(x8: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes as signed integers in the order of their values (``+-0`` both 0): adjacent values differ by 1."""
    b = x8.view(torch.uint8).to(torch.int32)
    return (b & 0x7F) * (1 - 2 * ((b >> 7) & 1))


def torch_path(q, k, v, bq, bk, hadamard, seed, permute):
    """The oracle: torch ops (``prepare_fp8(fused=False)``'s steps)."""
    if hadamard:
        j = fq.hadamard_matrix(q.shape[-1], seed, q.device)
        q, k = rotate(q, j), rotate(k, j)
    rv = quantize_fp8_blocks(v, bk, transposed=True)
    vd = fq.permute_keys(rv.data) if permute else rv.data
    rq, rk = quantize_fp8_blocks(q, bq), quantize_fp8_blocks(k, bk)
    return rq.data, rq.scale, rk.data, rk.scale, vd, rv.scale


def dequant64(data, scale, block, n, transposed, permute):
    x = data.cpu()
    if permute:
        x = fq.permute_keys(x, inverse=True)
    x = x.double()
    if transposed:
        x = x.transpose(-1, -2)
    return (x * scale.cpu().double().repeat_interleave(block, dim=-1)[..., None])[..., :n, :]


def check_against_float64(x64, data, scale, block, transposed=False, permute=False):
    """Each scale is the float64 block amax / 448; each dequantised value within e4m3's rounding of ``x64``."""
    B, H, n, d = x64.shape
    nb = -(-n // block)
    xb = torch.nn.functional.pad(x64, (0, 0, 0, nb * block - n)).view(B, H, nb, block, d)
    amax = xb.abs().amax(dim=(-1, -2))
    want = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    assert torch.allclose(scale.cpu().double(), want, rtol=2 * ROT_RTOL, atol=0), "scale != block amax / 448"
    back = dequant64(data, scale, block, n, transposed, permute)
    s = scale.cpu().double().repeat_interleave(block, dim=-1)[..., :n, None]
    # e4m3: 3 mantissa bits, relative step 2^-3 (error <= 2^-4 |x|), subnormal step 2^-9 scale; 1e-5 of slack for
    # the float32 rotation
    bound = torch.maximum(x64.abs() * 2.0 ** -4, s * 2.0 ** -9) * 1.0001 + 10 * ROT_RTOL * s * 448
    assert bool(((back - x64).abs() <= bound).all()), float(((back - x64).abs() - bound).max())
    if data.shape[-2 if not transposed else -1] > n:  # padding rows / columns are zeros
        plain = fq.permute_keys(data.cpu(), inverse=True) if permute else data
        pad = plain[..., n:, :] if not transposed else plain[..., :, n:]
        assert not bool(pad.view(torch.uint8).any())


CASES = [  # (B, Hq, Hkv, Nq, Nk, d, block_q, block_k)
    (1, 4, 2, 100, 70, 32, 16, 32), (2, 2, 2, 1, 33, 64, 16, 32), (1, 2, 1, 70, 200, 64, 64, 128),
    (1, 1, 1, 130, 129, 128, 64, 128),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("hadamard", [False, True])
def test_fused_equals_torch_path_and_float64(rng, case, hadamard):
    B, Hq, Hkv, Nq, Nk, d, bq, bk = case
    q, k, v = t(rng, B, Hq, Nq, d), t(rng, B, Hkv, Nk, d, spread=3), t(rng, B, Hkv, Nk, d, spread=0.01)
    seed = int(rng.integers(1000))
    permute = bool(rng.integers(2)) if bk >= 32 else False
    got = fq.quantize_qkv_fp8(q, k, v, bq, bk, hadamard=hadamard, seed=seed, permute=permute, config=SMALL)
    want = torch_path(q, k, v, bq, bk, hadamard, seed, permute)
    for name, a, b in zip(("q", "q scale", "k", "k scale", "v^T", "v scale"), got, want):
        assert a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous(), name
        if a.dtype == torch.float32:  # scales
            if hadamard and "v" not in name:
                assert torch.allclose(a, b, rtol=ROT_RTOL, atol=0), name
            else:
                assert torch.equal(a, b), name
        else:
            diff = (ordinal(a) - ordinal(b)).abs()
            assert int(diff.max()) <= (1 if hadamard and "v" not in name else 0), name
    # independent of the torch path: float64 rotation and rounding bounds
    q64, k64 = q.double().cpu(), k.double().cpu()
    if hadamard:
        j = torch.tensor(__import__("reference.simulators.fp8_error", fromlist=["x"]).random_hadamard(
            d, np.random.default_rng(seed)), dtype=torch.float64)
        q64, k64 = q64 @ j, k64 @ j
    qd, qs, kd, ks, vd, vs = got
    check_against_float64(q64, qd, qs, bq)
    check_against_float64(k64, kd, ks, bk)
    check_against_float64(v.double().cpu(), vd, vs, bk, transposed=True, permute=permute)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_other_dtypes_and_strided_inputs(rng, dtype):
    """float16 / float32 inputs, and Q, K, V as strided views of a (B, N, H, d) layout: no copy needed."""
    B, H, N, d = 1, 2, 50, 32
    q = t(rng, B, N, H, d, dtype=dtype).transpose(1, 2)
    k = t(rng, B, N, H, d, dtype=dtype).transpose(1, 2)
    v = t(rng, B, N, H, d, dtype=dtype).transpose(1, 2)
    assert not q.is_contiguous()
    for hadamard in (False, True):
        got = fq.quantize_qkv_fp8(q, k, v, 16, 32, hadamard=hadamard, seed=3, permute=True, config=SMALL)
        want = torch_path(q.contiguous(), k.contiguous(), v.contiguous(), 16, 32, hadamard, 3, True)
        for a, b in zip(got, want):
            if a.dtype == torch.float32:
                assert torch.allclose(a, b, rtol=ROT_RTOL, atol=0)
            else:
                assert int((ordinal(a) - ordinal(b)).abs().max()) <= int(hadamard)


def test_zero_blocks_and_extremes():
    """An all-zero block gets scale 1 and zero bytes (as the torch path); a block's largest entry maps to 448;
    huge and tiny magnitudes keep their relative rounding."""
    q = torch.zeros(1, 1, 40, 32, device=DEVICE)
    k = torch.zeros(1, 1, 40, 32, device=DEVICE)
    k[0, 0, 0, 0] = 3e4
    k[0, 0, 1, 1] = -1e-3
    v = torch.full((1, 1, 40, 32), 1e-30, device=DEVICE)
    qd, qs, kd, ks, vd, vs = fq.quantize_qkv_fp8(q, k, v, 16, 32, config=SMALL)
    assert bool((qs == 1).all()) and not bool(qd.view(torch.uint8).any())
    assert float(kd[0, 0, 0, 0].float()) == 448.0 and torch.equal(ks, quantize_fp8_blocks(k, 32).scale)
    want = torch_path(q, k, v, 16, 32, False, 0, False)
    for a, b in zip((qd, qs, kd, ks, vd, vs), want):
        assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                           b.view(torch.uint8) if b.dtype != torch.float32 else b)


def test_round_e4m3_ties_subnormals_and_signs():
    """The interpreter's rounding (``round_e4m3``) against torch's cast on midpoints between e4m3 values (ties
    to even), subnormals, signed zeros and random values, bit for bit."""
    import triton
    import triton.language as tl

    @triton.jit
    def kern(X, Y, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(Y + o, fq.round_e4m3(tl.load(X + o)))

    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # all finite e4m3 >= 0
    mids = (grid[:-1] + grid[1:]) / 2
    rnd = torch.tensor(np.random.default_rng(0).standard_normal(1024) * 30, dtype=torch.float32).clamp(-448, 448)
    x = torch.cat([grid, mids, -mids, mids * (1 + 2 ** -20), rnd, torch.tensor([0.0, -0.0, 2.0 ** -10, -2.0 ** -11])])
    n = 1 << (x.numel() - 1).bit_length()
    x = torch.nn.functional.pad(x, (0, n - x.numel())).to(DEVICE)
    y = torch.empty_like(x)
    kern[(1,)](x, y, N=n)
    want = x.cpu().to(torch.float8_e4m3fn).float()
    assert torch.equal(y.cpu().view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("causal, hadamard", [(False, False), (True, True), (True, False)])
def test_end_to_end_triton_fp8_on_fused_quantisation(rng, causal, hadamard):
    """``prepare_fp8(fused=True)`` feeds the Triton FP8 forward: the same output as the torch path, and within the
    FP8 bounds of float64 attention (o 0.1 exact, 1e-5 / 6e-2 on the dequantised inputs)."""
    B, Hq, Hkv, Nq, Nk, d = 1, 4, 2, 45, 77, 32
    q, k, v = (randn(rng, *s) for s in ((B, Hq, Nq, d), (B, Hkv, Nk, d), (B, Hkv, Nk, d)))
    kw = dict(causal=causal, hadamard=hadamard, seed=5, block_m=16, block_n=32)
    xf = prepare_fp8(q, k, v, fused=True, **kw)
    xt = prepare_fp8(q, k, v, fused=False, **kw)
    of, lf = attention_fp8(xf, out_dtype=torch.float32)
    ot, lt = attention_fp8(xt, out_dtype=torch.float32)
    tol = 1e-5 if INTERPRET else 6e-2
    assert rel_err(of, ot) < (1e-6 if not hadamard else 2e-2)
    ro, _, _ = attention_ref(xf.q.dequantize(), xf.k.dequantize(), xf.v.dequantize(), causal=causal)
    assert rel_err(of, ro) < tol
    eo, _, _ = attention_ref(q.double(), k.double(), v.double(), causal=causal)
    assert rel_err(of, eo) < 0.1
    # Without the rotation the two paths' bytes are equal, so the lse must agree to the kernel's rounding. With it
    # a byte may differ by one e4m3 step (checked above), which moves a row's lse by at most the largest change of
    # its scores (lse is 1-Lipschitz in the max norm): the float64 lse of each path's dequantised inputs measures
    # that move exactly, and the kernel adds its own rounding (1e-4).
    _, rl_f, _ = attention_ref(xf.q.dequantize(), xf.k.dequantize(), xf.v.dequantize(), causal=causal)
    _, rl_t, _ = attention_ref(xt.q.dequantize(), xt.k.dequantize(), xt.v.dequantize(), causal=causal)
    fin = torch.isfinite(rl_f)
    assert torch.equal(fin, torch.isfinite(lf.cpu())) and torch.equal(fin, torch.isfinite(lt.cpu()))
    moved = (rl_f - rl_t).abs()[fin]
    assert ((lf.cpu().double() - lt.cpu().double()).abs()[fin] <= moved + 1e-4).all()


def test_permuted_v_for_the_gluon_kernel(rng):
    """``permute_v`` gives an ``Fp8KeyPermuted`` whose dequantisation equals the plain one (both paths), and the
    Triton kernel refuses it (it reads keys in order)."""
    q, k, v = t(rng, 1, 2, 40, 32), t(rng, 1, 2, 300, 32), t(rng, 1, 2, 300, 32)
    for fused in (True, False):
        xp = prepare_fp8(q, k, v, block_m=16, block_n=32, permute_v=True, fused=fused)
        x = prepare_fp8(q, k, v, block_m=16, block_n=32, fused=fused)
        assert isinstance(xp.v, Fp8KeyPermuted) and not isinstance(x.v, Fp8KeyPermuted)
        assert torch.equal(xp.v.dequantize(), x.v.dequantize())
        assert torch.equal(xp.v.data.view(torch.uint8), fq.permute_keys(x.v.data).view(torch.uint8))
        with pytest.raises(ValueError, match="permute_v"):
            attention_fp8(xp)


def test_bad_input_is_named():
    q = torch.randn(1, 2, 20, 32, device=DEVICE)
    with pytest.raises(TypeError, match="q"):
        fq.quantize_qkv_fp8(q.to(torch.int32), q, q)
    with pytest.raises(TypeError, match="dtype"):
        fq.quantize_qkv_fp8(q, q.half(), q)
    with pytest.raises(ValueError, match="4 dimensions"):
        fq.quantize_qkv_fp8(q[0], q, q)
    with pytest.raises(ValueError, match="same shape"):
        fq.quantize_qkv_fp8(q, q, q[:, :, :10])
    q48 = torch.randn(1, 2, 20, 48, device=DEVICE)
    with pytest.raises(ValueError, match=r"power of two.*hadamard=True"):
        fq.quantize_qkv_fp8(q48, q48, q48, hadamard=True)
    with pytest.raises(ValueError, match="block_k"):
        fq.quantize_qkv_fp8(q, q, q, block_k=16)
    with pytest.raises(ValueError, match="block_q"):
        fq.quantize_qkv_fp8(q, q, q, block_q=24)
    with pytest.raises(TypeError, match="seed"):
        fq.quantize_qkv_fp8(q, q, q, seed=-1)
    with pytest.raises(TypeError, match="permute"):
        fq.quantize_qkv_fp8(q, q, q, permute="yes")
    with pytest.raises(TypeError, match=r"config must be a reference\.triton\.configs\.Fp8QuantConfig or None"):
        fq.quantize_qkv_fp8(q, q, q, config={"q_per_program": 2, "kv_per_program": 1, "num_warps": 8})
    with pytest.raises(ValueError, match="Fp8QuantConfig.num_warps must be 1, 2, 4, 8 or 16"):
        Fp8QuantConfig(num_warps=3)
    with pytest.raises(ValueError, match="Fp8QuantConfig.q_per_program must be a positive int"):
        Fp8QuantConfig(q_per_program=0)
    with pytest.raises(TypeError, match="fused"):
        prepare_fp8(q, q, q, fused=1)


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_non_finite_input_is_named(where):
    x = {n: torch.randn(1, 1, 40, 32, device=DEVICE) for n in "qkv"}
    x[where][0, 0, 33, 5] = float("nan") if where != "k" else float("inf")
    with pytest.raises(ValueError, match=f"^{where} must be finite"):
        fq.quantize_qkv_fp8(x["q"], x["k"], x["v"], 16, 32, config=SMALL)


@pytest.mark.parametrize("where", ["q", "v"])
def test_deferred_non_finite_check_raises_after_the_attention_launch(where):
    """``prepare_fp8(fused=True, defer_check=True)`` (what the entry points do) returns without reading the flag;
    the attention call on those inputs launches, then raises the same ``ValueError`` naming the tensor. Finite
    inputs give the same output as the immediate check, and the flag must be a one-element int32 tensor."""
    gen = torch.Generator().manual_seed(5)
    x = {n: torch.randn(1, 2, 40, 32, generator=gen).to(DEVICE) for n in "qkv"}
    cfg = dict(block_m=16, block_n=32, fused=True)
    ref = attention_fp8(prepare_fp8(x["q"], x["k"], x["v"], **cfg), out_dtype=torch.float32)
    deferred = prepare_fp8(x["q"], x["k"], x["v"], defer_check=True, **cfg)
    assert deferred.pending_flag is not None
    out = attention_fp8(deferred, out_dtype=torch.float32)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    x[where][0, 1, 21, 3] = float("nan")
    with pytest.raises(ValueError, match=f"^{where} must be finite"):
        prepare_fp8(x["q"], x["k"], x["v"], **cfg)                    # the immediate check
    bad = prepare_fp8(x["q"], x["k"], x["v"], defer_check=True, **cfg)  # no raise yet
    with pytest.raises(ValueError, match=f"^{where} must be finite"):
        attention_fp8(bad)
    with pytest.raises(TypeError, match="defer_check"):
        prepare_fp8(x["q"], x["k"], x["v"], defer_check="yes", **cfg)
    with pytest.raises(ValueError, match="flag"):
        fq.quantize_qkv_fp8(x["q"], x["k"], x["v"], 16, 32, flag=torch.zeros(2, dtype=torch.int32, device=DEVICE))


def test_quant_bytes():
    q, k = torch.empty(2, 4, 100, 64, dtype=torch.bfloat16), torch.empty(2, 2, 300, 64, dtype=torch.bfloat16)
    read = 2 * (2 * 4 * 100 * 64 + 2 * 2 * 2 * 300 * 64)
    written = 2 * 4 * 128 * 64 + 2 * 2 * 2 * 384 * 64 + 4 * (2 * 4 * 2 + 2 * 2 * 2 * 3)
    assert fq.quant_bytes(q, k, k) == read + written


# ---------------------------------------------------------------- compile for sm_90a (CPU)
@pytest.mark.slow
def test_compiles_for_hopper_without_spills():
    code = ("import json; from reference.triton.hopper import fp8_quant as fq; "
            "from reference.triton.hopper._aot import resource_usage; "
            "print(json.dumps([resource_usage(fq.compile_quant(128, hadamard=h)) for h in (False, True)]))")
    out = sm90_compile.run(["-c", code], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    plain, had = json.loads(out.stdout.strip().splitlines()[-1])
    for u in (plain, had):
        assert u["LDL"] == 0 and u["STL"] == 0 and u["stack"] == 0, u
        # two CTAs of 8 warps per SM fit the 64k registers (bytes in flight for a memory-bound kernel)
        assert u["registers"] <= 128, u
    assert had["HGMMA"] > 0 and plain["HGMMA"] == 0, (plain, had)  # the rotation is a bf16 wgmma


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the FP8 forwards need an H100/H200 (sm_90)")
@pytest.mark.parametrize("hadamard", [False, True])
def test_gluon_entry_point_uses_the_fused_quantisation(rng, hadamard):
    from reference.triton.hopper import flash_fp8_gluon as fg
    B, Hq, Hkv, Nq, Nk, d = 2, 8, 2, 700, 1000, 128
    q, k, v = (randn(rng, *s) for s in ((B, Hq, Nq, d), (B, Hkv, Nk, d), (B, Hkv, Nk, d)))
    xf = fg.prepare_fp8_gluon(q, k, v, causal=True, hadamard=hadamard, seed=4)
    xt = fg.prepare_fp8_gluon(q, k, v, causal=True, hadamard=hadamard, seed=4, fused=False)
    for a, b in ((xf.q, xt.q), (xf.k, xt.k), (xf.v, xt.v)):
        assert int((ordinal(a.data) - ordinal(b.data)).abs().max()) <= int(hadamard)
        assert torch.allclose(a.scale, b.scale, rtol=ROT_RTOL, atol=0)
    o, lse = fg.flash_attention_forward_fp8_gluon(q, k, v, causal=True, hadamard=hadamard, seed=4)
    eo, _, _ = attention_ref(q.double(), k.double(), v.double(), causal=True)
    assert rel_err(o.float(), eo) < 0.1
    do, _, _ = attention_ref(xf.q.dequantize(), xf.k.dequantize(), xf.v.dequantize(), causal=True)
    assert rel_err(fg.attention_fp8_gluon(xf, out_dtype=torch.float32)[0], do) < 6e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the FP8 forwards need an H100/H200 (sm_90)")
@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_entry_points_raise_on_non_finite_input_after_the_deferred_check(rng, where):
    """Both entry points quantise with ``defer_check=True``: a NaN / inf still raises ``ValueError`` naming the
    tensor (read after the attention's launch)."""
    from reference.triton.hopper.flash_fp8 import flash_attention_forward_fp8
    from reference.triton.hopper.flash_fp8_gluon import flash_attention_forward_fp8_gluon
    x = {n: randn(rng, 1, 2, 300, 128) for n in "qkv"}
    x[where][0, 1, 77, 9] = float("nan") if where != "k" else float("inf")
    for fn in (flash_attention_forward_fp8, flash_attention_forward_fp8_gluon):
        with pytest.raises(ValueError, match=f"^{where} must be finite"):
            fn(x["q"], x["k"], x["v"], causal=True)


def test_check_finite_is_checked_and_refused_under_capture_before_any_launch(rng, monkeypatch):
    """``check_finite``: a non-bool is named; under CUDA-graph capture (faked on the CPU) ``True`` is refused by
    name before the quantisation is launched (the flag read would fail inside the capture), ``False`` is not."""
    from reference.triton.hopper import flash_fp8, flash_fp8_gluon
    q, k, v = (randn(rng, 1, 2, 40, 32) for _ in range(3))
    with pytest.raises(TypeError, match="check_finite must be a bool"):
        flash_fp8.flash_attention_forward_fp8(q, k, v, check_finite="yes")
    launched = []
    monkeypatch.setattr(flash_fp8, "prepare_fp8", lambda *a, **kw: launched.append(1))
    monkeypatch.setattr(flash_fp8_gluon, "prepare_fp8_gluon", lambda *a, **kw: launched.append(1))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    for fn in (flash_fp8.flash_attention_forward_fp8, flash_fp8_gluon.flash_attention_forward_fp8_gluon):
        with pytest.raises(ValueError, match=r"check_finite=True reads .* pass check_finite=False"):
            fn(q, k, v)
    assert launched == []
    from reference.triton.hopper.fp8_quant import check_finite_mode
    assert check_finite_mode(False, "f") is False


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's torch quantisation path")
def test_check_finite_false_gives_the_same_output(rng):
    """Finite inputs: ``check_finite=False`` changes nothing but the flag read (the torch quantisation under the
    interpreter always checks, so NaN still raises there)."""
    from reference.triton.hopper.flash_fp8 import flash_attention_forward_fp8
    q, k, v = (randn(rng, 1, 2, 40, 32) for _ in range(3))
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    a = flash_attention_forward_fp8(q, k, v, causal=True, config=cfg)
    b = flash_attention_forward_fp8(q, k, v, causal=True, config=cfg, check_finite=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    q[0, 1, 3, 4] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        flash_attention_forward_fp8(q, k, v, config=cfg, check_finite=False)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the FP8 forwards need an H100/H200 (sm_90)")
def test_entry_points_without_the_flag_read_capture_into_a_cuda_graph(rng):
    """``check_finite=False``: the same output as the checked call, no error on NaN input (not reported, by
    contract), and the call captures into a CUDA graph whose replay equals the eager call."""
    from reference.triton.hopper.flash_fp8 import flash_attention_forward_fp8
    from reference.triton.hopper.flash_fp8_gluon import flash_attention_forward_fp8_gluon
    for fn in (flash_attention_forward_fp8, flash_attention_forward_fp8_gluon):
        q, k, v = (randn(rng, 1, 4, 500, 128) for _ in range(3))
        a = fn(q, k, v, causal=True)
        b = fn(q, k, v, causal=True, check_finite=False)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(q, k, v, causal=True, check_finite=False)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            o_g, lse_g = fn(q, k, v, causal=True, check_finite=False)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(o_g, a[0]) and torch.equal(lse_g, a[1])
        bad = q.clone()
        bad[0, 1, 7, 3] = float("nan")
        fn(bad, k, v, causal=True, check_finite=False)  # no error: the flag is not read
        torch.cuda.synchronize()


def test_accumulation_probe_reads_float32_precision_under_the_interpreter(tmp_path):
    """``benchmarks/tuning/probe_fp8_accumulation.py --smoke`` (the GPU question: how many bits the e4m3 MMA
    keeps), run as a script under the interpreter, which accumulates in float32: every row must report at least
    20 bits; a wrong product (A B instead of A B^T, a bad scale of the error) reads as a few bits or fewer."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-m", "benchmarks.tuning.probe_fp8_accumulation", "--smoke", "--out",
                          str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads((tmp_path / "cpu-smoke-fp8-accumulation.json").read_text())["rows"]
    assert {r["dtype"] for r in rows} == {"float8_e4m3fn", "float16"}
    assert all(r["bits"] >= 20 for r in rows), rows
