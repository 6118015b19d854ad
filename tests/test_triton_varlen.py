"""reference.triton.flash_attention_varlen (forward and backward) vs the float64 oracle, sequence by sequence.

Ragged packed batches (lengths not multiples of the blocks, N = 1, empty sequences), causal with Nq != Nk
(fully masked rows: o = 0, lse = -inf, zero gradients), GQA, fp16/bf16/fp32, and bad cu_seqlens raising before
any launch. Runs in the Triton interpreter on CPU without a GPU (pinned small blocks).
"""
import numpy as np
import pytest
import torch

from reference.triton import DEVICE, INTERPRET, flash_attention_varlen, flash_attention_varlen_forward
from tests.common import FLASH_G_TOL as G_TOL
from tests.common import FLASH_LSE_TOL as LSE_TOL
from tests.common import FLASH_O_TOL as O_TOL
from tests.common import pinned_flash_configs  # noqa: F401  (autouse fixture)
from tests.oracle import attention_grads, attention_ref, lse_err, rel_err


def packed(rng, lens, h, d, dtype):
    x = rng.standard_normal((int(sum(lens)), h, d)) + rng.uniform(-0.5, 0.5)
    return torch.tensor(x, dtype=dtype, device=DEVICE)


def cu(lens):
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=DEVICE)


def seqs(lens):
    c = np.concatenate([[0], np.cumsum(lens)])
    return [slice(int(c[b]), int(c[b + 1])) for b in range(len(lens))]


def heads_first(x):
    return x.transpose(0, 1)


CASES = [  # q lengths, k lengths, Hq, Hkv, d
    ([37, 1, 20], [37, 1, 20], 2, 1, 16),     # self-attention, ragged, N = 1, GQA 2
    ([5, 40], [19, 33], 2, 2, 32),            # Nq < Nk and Nq > Nk (causal: fully masked rows)
    ([0, 9, 3], [6, 0, 3], 3, 1, 16),         # an empty query sequence, a sequence without keys, GQA 3
]


@pytest.mark.triton_varlen
@pytest.mark.parametrize("lq,lk,hq,hkv,d", CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_forward_backward(rng, lq, lk, hq, hkv, d, causal):
    dtype = torch.float32 if INTERPRET else torch.float16
    q, k, v = packed(rng, lq, hq, d, dtype), packed(rng, lk, hkv, d, dtype), packed(rng, lk, hkv, d, dtype)
    do = packed(rng, lq, hq, d, dtype)
    o, lse = flash_attention_varlen_forward(q, k, v, cu(lq), cu(lk), max(lq), max(lk), causal=causal)
    assert o.shape == q.shape and lse.shape == (hq, q.shape[0]) and lse.dtype == torch.float32
    qq, kk, vv = (x.clone().requires_grad_(True) for x in (q, k, v))
    o2 = flash_attention_varlen(qq, kk, vv, cu(lq), cu(lk), max(lq), max(lk), causal=causal)
    o2.backward(do)
    assert torch.equal(o, o2.detach())
    for sq, sk in zip(seqs(lq), seqs(lk)):
        if sq.stop == sq.start:
            continue
        if sk.stop == sk.start:  # no keys: o = 0, lse = -inf, dq = 0
            assert torch.all(o[sq] == 0) and torch.all(lse[:, sq] == float("-inf")) and torch.all(qq.grad[sq] == 0)
            continue
        ro, rl, _ = attention_ref(heads_first(q[sq]), heads_first(k[sk]), heads_first(v[sk]), causal=causal)
        assert rel_err(heads_first(o[sq]), ro) < O_TOL[dtype]
        assert lse_err(lse[:, sq], rl) < LSE_TOL[dtype]
        g = attention_grads(heads_first(q[sq]), heads_first(k[sk]), heads_first(v[sk]), heads_first(do[sq]),
                            causal=causal)
        for got, ref in zip((qq.grad[sq], kk.grad[sk], vv.grad[sk]), g):
            assert rel_err(heads_first(got), ref) < G_TOL[dtype]
    assert not torch.isnan(o).any() and not torch.isnan(qq.grad).any() and not torch.isnan(kk.grad).any()


@pytest.mark.triton_varlen
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_varlen_low_precision_forward(rng, dtype):
    lq = [33, 7]
    q, k, v = packed(rng, lq, 2, 16, dtype), packed(rng, lq, 2, 16, dtype), packed(rng, lq, 2, 16, dtype)
    o, lse = flash_attention_varlen_forward(q, k, v, cu(lq), cu(lq), 33, 33, causal=True)
    for s in seqs(lq):
        ro, rl, _ = attention_ref(heads_first(q[s]), heads_first(k[s]), heads_first(v[s]), causal=True)
        assert rel_err(heads_first(o[s]), ro) < O_TOL[dtype] and lse_err(lse[:, s], rl) < LSE_TOL[dtype]


BAD = [
    (lambda c: c.flip(0), ValueError, "cu_seqlens_q must start at 0"),
    (lambda c: torch.tensor([0, 30, 20, 40], dtype=torch.int32, device=DEVICE), ValueError, "non-decreasing"),
    (lambda c: c + torch.tensor([0, 0, 0, 1], dtype=torch.int32, device=DEVICE), ValueError,
     "must equal the number of packed tokens 40"),
    (lambda c: c.float(), TypeError, "cu_seqlens_q must have dtype in"),
    (lambda c: c[None], ValueError, "cu_seqlens_q must have 1 dimensions"),
]


@pytest.mark.triton_varlen
@pytest.mark.parametrize("mutate,exc,msg", BAD)
def test_varlen_bad_cu_seqlens(rng, mutate, exc, msg):
    lens = [10, 20, 10]
    q = packed(rng, lens, 2, 16, torch.float32)
    with pytest.raises(exc, match=msg):
        flash_attention_varlen(q, q, q, mutate(cu(lens)), cu(lens), 20, 20)


@pytest.mark.triton_varlen
def test_varlen_bad_arguments(rng):
    lens = [10, 20, 10]
    q = packed(rng, lens, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="max_seqlen for cu_seqlens_k is 12 but sequence 1 has 20"):
        flash_attention_varlen(q, q, q, cu(lens), cu(lens), 20, 12)
    with pytest.raises(ValueError, match="cu_seqlens_k must have B \\+ 1 = 4 entries"):
        flash_attention_varlen(q, q, q, cu(lens), cu([20, 20]), 20, 20)
    with pytest.raises(TypeError, match="q, k, v must have the same dtype"):
        flash_attention_varlen(q, q.half(), q, cu(lens), cu(lens), 20, 20)
    with pytest.raises(TypeError, match="max_seqlen_q must be a non-negative int"):
        flash_attention_varlen(q, q, q, cu(lens), cu(lens), 20.0, 20)
