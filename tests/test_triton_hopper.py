"""The FlashAttention-3 kernels: FP8 forward (+ random Hadamard) and the persistent LPT-ordered forward.

Interpreter (CPU) coverage: the FP8 kernel runs under the interpreter with one difference (P is not rounded to
FP8 there: the interpreter's float32 -> float8 cast rounds wrongly), so there its output is checked tightly
(float32 output, 1e-5) against a float64 oracle fed the *dequantised* Q, K, V: that pins every scale, the
P x 256 and V-scale folds, the masks and the GQA indexing. Quantisation and the Hadamard rotation are checked
in torch on CPU. On a GPU the same tests run compiled, with FP8 P (looser tolerance), and
``benchmarks/course/bench_hopper.py`` measures the error against float64 at scale.
"""
import pytest
import torch

from reference.simulators import scheduling as sched
from reference.triton import DEVICE, INTERPRET
from reference.triton.hopper import flash_fp8, flash_persistent
from reference.triton.hopper.flash_fp8 import (attention_fp8, flash_attention_forward_fp8, prepare_fp8,
                                               quantize_fp8_blocks)
from reference.triton.hopper.flash_persistent import flash_attention_forward_persistent, work_items
from tests.oracle import (FP8_MMA_BITS, attention_ref, fp8_lse_violation, fp32_dot_bits, lse_err, rel_err,
                          tf32_lse_violation)

pytestmark = pytest.mark.triton_hopper

# vs float64 on the dequantised inputs. GPU: P is rounded to e4m3 (relative step 2^-3, so up to 6% per entry;
# o averages many entries); lse comes from the unrounded P and is checked per row by ``oracle.fp8_lse_bound``:
# the e4m3 MMA's accumulation bits on the GPU, an fp32 dot's worst case under the interpreter.
O_TOL_FP8 = 1e-5 if INTERPRET else 6e-2


def lse_bits_fp8(d: int) -> float:
    """``bits`` of ``oracle.fp8_lse_bound`` for the FP8 kernels here: fp32 dots in the interpreter, else e4m3 MMA."""
    return fp32_dot_bits(d) if INTERPRET else FP8_MMA_BITS


def t(rng, *shape, dtype=torch.bfloat16, spread=1.0):
    return torch.tensor(rng.standard_normal(shape) * spread + rng.uniform(-0.5, 0.5), dtype=dtype, device=DEVICE)


# ---------------------------------------------------------------- quantisation and rotation (torch, CPU)
@pytest.mark.parametrize("n, block", [(37, 16), (64, 32), (1, 16)])
@pytest.mark.parametrize("transposed", [False, True])
def test_quantize_blocks_scales_and_error(rng, n, block, transposed):
    x = torch.tensor(rng.standard_normal((2, 3, n, 32)) * rng.uniform(0.01, 100, (2, 3, n, 1)))
    q = quantize_fp8_blocks(x, block, transposed=transposed)
    nb = -(-n // block)
    assert q.scale.shape == (2, 3, nb) and q.data.dtype == torch.float8_e4m3fn
    assert q.data.shape == ((2, 3, 32, nb * block) if transposed else (2, 3, nb * block, 32))
    # each block's largest entry maps to 448 (e4m3's max), padding rows are zeros
    xb = torch.nn.functional.pad(x, (0, 0, 0, nb * block - n)).view(2, 3, nb, block, 32)
    assert torch.allclose(q.scale.double(), xb.abs().amax(dim=(-1, -2)) / 448, rtol=1e-6)
    back = q.dequantize().double()
    assert back.shape == x.shape
    # e4m3 has 3 mantissa bits: relative rounding error <= 2^-4 for normal numbers, absolute below that
    err = (back - x).abs()
    bound = torch.maximum(x.abs() * 2.0 ** -4, q.scale.repeat_interleave(block, -1)[..., :n, None] * 2.0 ** -9)
    assert bool((err <= bound * 1.0001).all())


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="finite"):
        quantize_fp8_blocks(torch.tensor([[[[1.0, float("nan")]]]]), 16)
    with pytest.raises(TypeError, match="block"):
        quantize_fp8_blocks(torch.ones(1, 1, 4, 4), 2.5)
    with pytest.raises(ValueError, match="4 dimensions"):
        quantize_fp8_blocks(torch.ones(4, 4), 16)
    zero = quantize_fp8_blocks(torch.zeros(1, 1, 20, 8), 16)  # an all-zero block gets scale 1, data 0
    assert torch.all(zero.scale == 1) and torch.all(zero.dequantize() == 0)


def test_hadamard_rotation_keeps_scores(rng):
    d = 64
    j = flash_fp8.hadamard_matrix(d, 5, "cpu").double()
    assert torch.allclose(j @ j.T, torch.eye(d, dtype=torch.float64), atol=1e-6)
    q, k = torch.randn(30, d, dtype=torch.float64), torch.randn(20, d, dtype=torch.float64)
    assert torch.allclose((q @ j) @ (k @ j).T, q @ k.T, atol=1e-5)
    assert not torch.allclose(j, flash_fp8.hadamard_matrix(d, 6, "cpu").double())  # the seed matters


@pytest.mark.parametrize("factor", [10.0, 100.0])
def test_hadamard_lowers_score_error_with_outlier_channels(rng, factor):
    """A few channels of Q and K x10..x100 (the talk's outlier features): with per-block scales the block's
    scale is set by the outlier, so the other channels lose their bits; the rotation spreads the outlier over
    all d channels first. Measured here: the error of S = Q K^T drops ~5x (x10) to ~9x (x100)."""
    d = 128
    q, k = (torch.tensor(rng.standard_normal((1, 1, 256, d))) for _ in range(2))
    ch = rng.choice(d, 3, replace=False)
    q[..., ch] *= factor
    k[..., ch] *= factor
    s = q @ k.transpose(-1, -2)
    j = flash_fp8.hadamard_matrix(d, int(rng.integers(1000)), "cpu").double()

    def deq(x):
        return quantize_fp8_blocks(x, 64).dequantize().double()
    plain = (deq(q) @ deq(k).transpose(-1, -2) - s).norm() / s.norm()
    rot = (deq(q @ j) @ deq(k @ j).transpose(-1, -2) - s).norm() / s.norm()
    assert plain / rot > 2.0, (float(plain), float(rot))


# ---------------------------------------------------------------- the FP8 kernel
FP8_CASES = [  # (B, Hq, Hkv, Nq, Nk, d, causal, block_m, block_n)
    (1, 2, 2, 64, 64, 32, False, 32, 32),
    (1, 2, 1, 37, 70, 32, True, 16, 32),      # GQA, ragged, bottom-right causal, Nq < Nk
    (2, 2, 2, 45, 20, 64, True, 16, 32),      # Nq > Nk: fully masked rows -> o = 0, lse = -inf
    (1, 4, 2, 1, 50, 32, False, 16, 32),      # one query row
    (1, 1, 1, 50, 1, 128, True, 16, 32),      # one key
]


@pytest.mark.parametrize("case", FP8_CASES)
@pytest.mark.parametrize("hadamard", [False, True])
def test_fp8_kernel_vs_float64_on_dequantised_inputs(rng, case, hadamard):
    B, Hq, Hkv, Nq, Nk, d, causal, bm, bn = case
    q, k = t(rng, B, Hq, Nq, d), t(rng, B, Hkv, Nk, d)
    # V blocks of very different magnitude exercise the per-block V scales folded into P
    v = t(rng, B, Hkv, Nk, d) * torch.tensor(rng.uniform(0.01, 50, (1, 1, Nk, 1)), dtype=torch.bfloat16,
                                             device=DEVICE)
    x = prepare_fp8(q, k, v, causal=causal, hadamard=hadamard, seed=int(rng.integers(1000)), block_m=bm, block_n=bn)
    o, lse = attention_fp8(x, out_dtype=torch.float32)
    ro, rl, _ = attention_ref(x.q.dequantize(), x.k.dequantize(), x.v.dequantize(), causal=causal, scale=d ** -0.5)
    assert o.shape == (B, Hq, Nq, d) and lse.shape == (B, Hq, Nq)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert rel_err(o, ro) < O_TOL_FP8, rel_err(o, ro)
    viol = fp8_lse_violation(lse, rl, x.q.dequantize(), x.k.dequantize(), causal, d ** -0.5, lse_bits_fp8(d))
    assert viol < 1, viol
    empty = torch.isinf(rl)
    assert torch.all(o.cpu()[empty] == 0)


def test_fp8_entry_point_close_to_exact_attention(rng):
    q, k, v = t(rng, 1, 2, 70, 64), t(rng, 1, 2, 70, 64), t(rng, 1, 2, 70, 64)
    for had in (False, True):
        o, lse = flash_attention_forward_fp8(q, k, v, causal=True, hadamard=had)
        ro, rl, _ = attention_ref(q, k, v, causal=True)
        assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
        assert rel_err(o, ro) < 0.1  # FP8 inputs: e4m3 rounds each entry by up to 2^-4
        assert lse_err(lse, rl) < 0.05


def test_fp8_entry_point_takes_an_explicit_config(rng):
    # config= (the benchmark's best tile) instead of changing the module's CONFIG: same result as preparing and
    # running with those blocks by hand; the module pin is untouched
    from reference.triton.hopper import flash_fp8
    q, k, v = t(rng, 1, 2, 50, 64), t(rng, 1, 2, 70, 64), t(rng, 1, 2, 70, 64)
    pin = dict(flash_fp8.CONFIG)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
    o, lse = flash_attention_forward_fp8(q, k, v, causal=True, config=cfg)
    o2, lse2 = attention_fp8(prepare_fp8(q, k, v, causal=True, block_m=16, block_n=32),
                             config={"num_warps": 4, "num_stages": 1})
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    assert flash_fp8.CONFIG == pin
    ro, _, _ = attention_ref(q, k, v, causal=True)
    assert rel_err(o, ro) < 0.1
    with pytest.raises(ValueError, match="config must be a dict"):
        flash_attention_forward_fp8(q, k, v, config={"BLOCK_M": 16})


def test_fp8_errors_name_the_argument(rng):
    q = t(rng, 1, 1, 8, 32)
    with pytest.raises(ValueError, match="head dimension"):
        flash_attention_forward_fp8(t(rng, 1, 1, 8, 16), t(rng, 1, 1, 8, 16), t(rng, 1, 1, 8, 16))
    with pytest.raises(TypeError, match="hadamard"):
        flash_attention_forward_fp8(q, q, q, hadamard=1)
    with pytest.raises(TypeError, match="causal"):
        flash_attention_forward_fp8(q, q, q, causal="yes")
    with pytest.raises(TypeError, match="seed"):
        flash_attention_forward_fp8(q, q, q, seed=-1)
    with pytest.raises(ValueError, match="block_m"):
        prepare_fp8(q, q, q, block_m=24)
    with pytest.raises(ValueError, match="block_n"):
        prepare_fp8(q, q, q, block_n=16)


def test_fp8_needs_hopper(monkeypatch):
    """On a GPU older than compute capability 9.0 the error names the requirement (checked with a fake GPU)."""
    monkeypatch.setattr(flash_fp8, "INTERPRET", False)
    monkeypatch.setattr(flash_fp8, "_device_capability", lambda device: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    q = torch.ones(1, 1, 8, 32, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"compute capability >= 9\.0 \(Hopper.*8\.0"):
        flash_attention_forward_fp8(q, q, q)
    monkeypatch.setattr(flash_fp8, "_device_capability", lambda device: (9, 0))
    flash_fp8.check_fp8_device(DEVICE)  # Hopper passes


# ---------------------------------------------------------------- the persistent LPT kernel
def _check(o, lse, q, k, v, causal, tol=2e-3):
    ro, rl, _ = attention_ref(q, k, v, causal=causal)
    assert rel_err(o, ro) < tol, rel_err(o, ro)
    if q.dtype == torch.float32 and not INTERPRET:  # TF32 dots on the GPU (seen: 1e-5 failed on an H100)
        assert tf32_lse_violation(lse, rl, q, k) <= 1.0, tf32_lse_violation(lse, rl, q, k)
    else:
        assert lse_err(lse, rl) < 1e-5, lse_err(lse, rl)
    assert torch.all(o.cpu()[torch.isinf(rl)] == 0)


@pytest.mark.parametrize("case", [(2, 2, 1, 37, 70, 32, True), (1, 2, 2, 50, 50, 64, False),
                                  (1, 2, 2, 40, 20, 16, True), (1, 1, 1, 1, 1, 16, True)])
@pytest.mark.parametrize("order", ["lpt", "naive"])
@pytest.mark.parametrize("persistent", [True, False])
def test_persistent_vs_float64(rng, monkeypatch, case, order, persistent):
    B, Hq, Hkv, Nq, Nk, d, causal = case
    monkeypatch.setattr(flash_persistent, "num_sms", lambda: 3)  # few programs: each loops over many items
    q, k, v = t(rng, B, Hq, Nq, d, dtype=torch.float16), t(rng, B, Hkv, Nk, d, dtype=torch.float16), \
        t(rng, B, Hkv, Nk, d, dtype=torch.float16)
    o, lse = flash_attention_forward_persistent(q, k, v, causal=causal, order=order, persistent=persistent)
    _check(o, lse, q, k, v, causal)


def test_persistent_mixed_lengths(rng, monkeypatch):
    monkeypatch.setattr(flash_persistent, "num_sms", lambda: 2)
    B, H, N, d = 3, 2, 70, 32
    q, k, v = (t(rng, B, H, N, d, dtype=torch.float32) for _ in range(3))
    lens = torch.tensor([70, 5, 33])
    o, lse = flash_attention_forward_persistent(q, k, v, causal=True, seq_lens=lens)
    for b, L in enumerate(lens.tolist()):
        sl = (slice(b, b + 1), slice(None), slice(0, L))
        _check(o[sl], lse[sl], q[sl], k[sl], v[sl], True, tol=1e-5 if INTERPRET else 5e-3)  # GPU: TF32 dots
        assert torch.all(o[b, :, L:] == 0) and torch.all(torch.isinf(lse[b, :, L:]))


def test_work_items_costs_and_lpt_order():
    tiles = work_items(1, 1, 64, 64, None, True, 16, 16)
    assert [t.cost for t in tiles] == [1, 2, 3, 4]  # query block i visits i + 1 key blocks
    assert [t.cost for t in sched.order_tiles(tiles, "lpt")] == [4, 3, 2, 1]
    two_heads = work_items(1, 2, 32, 32, None, True, 16, 16)  # (h0: 1, 2), (h1: 1, 2)
    assert [(t.head, t.cost) for t in sched.order_tiles(two_heads, "lpt")] == [(0, 2), (1, 2), (0, 1), (1, 1)]
    assert [(t.head, t.cost) for t in sched.order_tiles(two_heads, "lpt", heads_per_group=1)] == \
        [(0, 2), (0, 1), (1, 2), (1, 1)]  # longest first inside each head group
    mixed = work_items(2, 1, 64, 64, (64, 16), False, 16, 16)
    assert [t.cost for t in mixed] == [4, 4, 4, 4, 1]  # the short sequence has one block of cost 1


def test_persistent_bad_input(rng):
    q = t(rng, 2, 1, 8, 16)
    with pytest.raises(ValueError, match="seq_lens"):
        flash_attention_forward_persistent(q, q, q, seq_lens=torch.tensor([8, 9]))
    with pytest.raises(ValueError, match="seq_lens"):
        flash_attention_forward_persistent(q, q, q, seq_lens=torch.tensor([8]))
    with pytest.raises(TypeError, match="seq_lens"):
        flash_attention_forward_persistent(q, q, q, seq_lens=torch.tensor([8.0, 2.0]))
    with pytest.raises(ValueError, match="order"):
        flash_attention_forward_persistent(q, q, q, order="fifo")
    with pytest.raises(TypeError, match="persistent"):
        flash_attention_forward_persistent(q, q, q, persistent=1)
