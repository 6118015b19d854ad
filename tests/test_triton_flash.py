"""reference.triton FlashAttention-2 forward (o, lse) and backward (dq, dk, dv) vs the float64 oracle.

Covers causal and not, bottom-right causal with Nq != Nk (Nq > Nk leaves fully masked rows: o = 0, lse = -inf,
zero gradients, never NaN), GQA, ragged N, N = 1, every head dim, fp16/bf16/fp32, large logits, strided
inputs and both load paths (pointers and tensor descriptors); bad input is tested in ``test_spec_api.py``.

Runs on CUDA when there is one, else in the Triton interpreter on CPU (small shapes: the interpreter is slow).
Block configurations are pinned (``reference.triton.configs``) so the tests are fast and deterministic; the benchmark
exercises the autotuned configurations and checks them against SDPA.
"""
import pytest
import torch

from reference.triton import DEVICE, INTERPRET, flash_attention, flash_attention_forward
from reference.triton import flash_bwd
from tests.common import FLASH_G_TOL as G_TOL
from tests.common import FLASH_LSE_TOL as LSE_TOL
from tests.common import FLASH_O_TOL as O_TOL
from tests.common import pinned_flash_configs  # noqa: F401  (autouse fixture)
from tests.oracle import attention_grads, attention_ref, lse_err, rel_err, tf32_lse_violation


def make(rng, B, Hq, Hkv, Nq, Nk, d, dtype, spread=1.0):
    """Fresh non-uniform random q, k, v on DEVICE (never zeros)."""
    def t(*shape):
        x = rng.standard_normal(shape) * spread + rng.uniform(-0.5, 0.5)
        return torch.tensor(x, dtype=dtype, device=DEVICE)
    return t(B, Hq, Nq, d), t(B, Hkv, Nk, d), t(B, Hkv, Nk, d)


def check_forward(q, k, v, causal, scale=None, forward=flash_attention_forward):
    o, lse = forward(q, k, v, causal=causal, scale=scale)
    ro, rl, _ = attention_ref(q, k, v, causal=causal, scale=scale)
    assert o.shape == q.shape and o.dtype == q.dtype and o.device.type == DEVICE.type
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert rel_err(o, ro) < O_TOL[q.dtype], rel_err(o, ro)
    if q.dtype == torch.float32 and not INTERPRET:  # TF32 dots on the GPU: an absolute bound on lse
        viol = tf32_lse_violation(lse, rl, q, k, scale)
        assert viol <= 1.0, viol
    else:
        assert lse_err(lse, rl) < LSE_TOL[q.dtype], lse_err(lse, rl)  # inf if -inf rows do not match
    empty = torch.isinf(rl)
    if empty.any():
        assert torch.all(o.cpu()[empty] == 0), "rows that see no key must give o = 0"
    return o, lse


# (B, Hq, Hkv, Nq, Nk, d, causal, dtype)
FWD_CASES = [
    (1, 2, 2, 64, 64, 16, False, torch.float16),   # block multiples
    (1, 2, 2, 61, 61, 32, True, torch.bfloat16),   # ragged, causal square
    (1, 4, 2, 37, 80, 64, True, torch.float16),    # GQA, Nq < Nk (bottom-right: every row sees >= 44 keys)
    (1, 1, 1, 77, 29, 128, True, torch.bfloat16),  # Nq > Nk: the first 48 rows see no key
    (2, 4, 2, 33, 47, 64, False, torch.float32),   # batch 2, GQA, fp32
    (1, 2, 1, 1, 40, 32, True, torch.float16),     # a single query (decode): sees every key
    (1, 1, 1, 50, 1, 16, True, torch.float32),     # a single key: only the last row sees it
    (1, 2, 2, 45, 45, 128, False, torch.float16),
]


@pytest.mark.triton_flash_forward
@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,d,causal,dtype", FWD_CASES)
def test_forward_matches_oracle(rng, B, Hq, Hkv, Nq, Nk, d, causal, dtype):
    check_forward(*make(rng, B, Hq, Hkv, Nq, Nk, d, dtype), causal)


@pytest.mark.triton_flash_forward
@pytest.mark.parametrize("use_tma", [False, True])
def test_forward_pointer_and_descriptor_paths(rng, use_tma):
    if use_tma and not INTERPRET and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need a Hopper or newer GPU")
    q, k, v = make(rng, 1, 4, 2, 70, 53, 64, torch.float16)
    check_forward(q, k, v, causal=True,
                  forward=lambda *a, **kw: flash_attention_forward(*a, **kw, use_tma=use_tma))


@pytest.mark.triton_flash_forward
def test_forward_block_n_larger_than_block_m(rng):
    """The causal key-range split must hold for any block shapes, e.g. BLOCK_N > BLOCK_M."""
    pin = {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
    fwd = lambda *a, **kw: flash_attention_forward(*a, **kw, config=pin)  # noqa: E731
    check_forward(*make(rng, 1, 1, 1, 75, 58, 32, torch.float16), causal=True, forward=fwd)
    check_forward(*make(rng, 1, 1, 1, 41, 66, 32, torch.float16), causal=True, forward=fwd)


@pytest.mark.triton_flash_forward
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_large_logits(rng, dtype):
    """Scores in the thousands: exp overflows without the running max."""
    q, k, v = make(rng, 1, 2, 2, 40, 56, 64, dtype, spread=8.0)
    check_forward(q, k, v, causal=True)


@pytest.mark.triton_flash_forward
def test_forward_strided_inputs_and_scale(rng):
    """q, k, v as views of a (B, N, H, d) projection (non-contiguous) and a custom scale."""
    x = torch.tensor(rng.standard_normal((1, 52, 3 * 2, 32)), dtype=torch.float16, device=DEVICE)
    q, k, v = (x[:, :, 2 * i:2 * i + 2].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    check_forward(q, k, v, causal=True, scale=0.3)


@pytest.mark.triton_flash_forward
def test_forward_does_not_modify_inputs(rng):
    q, k, v = make(rng, 1, 2, 1, 20, 30, 16, torch.float16)
    before = [t.clone() for t in (q, k, v)]
    flash_attention_forward(q, k, v, causal=True)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before))


# (B, Hq, Hkv, Nq, Nk, d, causal, dtype)
BWD_CASES = [
    (1, 2, 2, 64, 64, 16, False, torch.float16),
    (1, 2, 2, 61, 61, 32, True, torch.bfloat16),
    (1, 4, 2, 37, 80, 64, True, torch.float16),    # GQA: dk, dv summed over the 2 query heads per kv head
    (1, 1, 1, 77, 29, 128, True, torch.float16),   # fully masked rows: their dq is 0, they add nothing
    (1, 3, 1, 33, 47, 64, False, torch.float32),   # MQA, ragged, fp32
    (1, 2, 2, 1, 40, 32, True, torch.bfloat16),    # N = 1 query
]


@pytest.mark.triton_flash_backward
@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,d,causal,dtype", BWD_CASES)
def test_backward_matches_oracle(rng, B, Hq, Hkv, Nq, Nk, d, causal, dtype):
    q, k, v = make(rng, B, Hq, Hkv, Nq, Nk, d, dtype)
    do = make(rng, B, Hq, Hq, Nq, 1, d, dtype)[0]
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = flash_attention(qq, kk, vv, causal=causal)
    o.backward(do)
    rq, rk, rv = attention_grads(q, k, v, do, causal=causal)
    ro, rl, _ = attention_ref(q, k, v, causal=causal)
    assert rel_err(o, ro) < O_TOL[dtype]
    for name, g, r, ref_shape in (("dq", qq.grad, rq, q), ("dk", kk.grad, rk, k), ("dv", vv.grad, rv, v)):
        assert g.shape == ref_shape.shape and g.dtype == dtype, name
        assert not torch.isnan(g).any(), name
        assert rel_err(g, r) < G_TOL[dtype], (name, rel_err(g, r))
    empty = torch.isinf(rl)
    if empty.any():
        assert torch.all(qq.grad.cpu()[empty] == 0), "rows that see no key must get dq = 0"


@pytest.mark.triton_flash_backward
def test_backward_broadcast_grad_and_custom_scale(rng):
    """``o.sum().backward()`` hands the backward an expanded (stride-0) dO; scale is not 1/sqrt(d)."""
    q, k, v = make(rng, 1, 2, 2, 30, 45, 32, torch.float16)
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
    flash_attention(qq, kk, vv, causal=True, scale=0.2).sum().backward()
    do = torch.ones_like(q)
    rq, rk, rv = attention_grads(q, k, v, do, causal=True, scale=0.2)
    for g, r in ((qq.grad, rq), (kk.grad, rk), (vv.grad, rv)):
        assert rel_err(g, r) < G_TOL[torch.float16]


@pytest.mark.triton_flash_backward
def test_backward_function_api(rng):
    """flash_bwd.flash_attention_backward from the forward's (o, lse) equals the autograd path."""
    q, k, v = make(rng, 1, 2, 1, 25, 33, 16, torch.float32)
    do = make(rng, 1, 2, 2, 25, 1, 16, torch.float32)[0]
    o, lse = flash_attention_forward(q, k, v, causal=True)
    dq, dk, dv = flash_bwd.flash_attention_backward(q, k, v, o, lse, do, causal=True)
    rq, rk, rv = attention_grads(q, k, v, do, causal=True)
    for g, r in ((dq, rq), (dk, rk), (dv, rv)):
        assert rel_err(g, r) < G_TOL[torch.float32]
    with pytest.raises(ValueError, match="lse must have shape"):
        flash_bwd.flash_attention_backward(q, k, v, o, lse[:, :1], do, causal=True)
    with pytest.raises(ValueError, match="do must have q's shape"):
        flash_bwd.flash_attention_backward(q, k, v, o, lse, do[:, :, :3], causal=True)




@pytest.mark.triton_flash_backward
def test_backward_option_errors(rng):
    q, k, v = make(rng, 1, 1, 1, 8, 8, 16, torch.float32)
    o, lse = flash_attention_forward(q, k, v)
    with pytest.raises(ValueError, match="config must be"):
        flash_attention_forward(q, k, v, config={"BLOCK_M": 16})
    if INTERPRET:  # tensor descriptors need a Hopper GPU: asking for them elsewhere is an error, not a fallback
        with pytest.raises(ValueError, match="use_tma=True needs a Hopper GPU"):
            flash_bwd.flash_attention_backward(q, k, v, o, lse, o, use_tma=True)
