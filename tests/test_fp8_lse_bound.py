"""The FP8 forwards' lse bound (``tests/oracle.fp8_lse_bound``): the model behind the check, and that it still
catches a wrong lse.

The FP8 kernels' lse sits ~1e-3 from float64 on the same (dequantised) inputs on an H100 and ~1e-6 under the
interpreter (notes/hopper.md, "The FP8 lse bound crossed twice"): the e4m3 MMA keeps ``FP8_MMA_BITS`` bits of
each dot product (``benchmarks/tuning/probe_fp8_accumulation.py``), so each score errs by up to
``scale sum_i |q_i k_i| 2^-bits`` and lse, a soft maximum of the scores, by at most the largest of those. A flat
1e-3 sat inside that error; the bound is per row. Here: fresh random inputs, float64 reference; noise inside the
bound passes, an offset of a few bounds, a wrong softmax scale, a dropped key or a -inf row that is not fails.
"""
import math

import pytest
import torch

from tests.oracle import (FP8_MMA_BITS, allowed_mask, attention_ref, fp32_dot_bits, fp8_lse_bound,
                          fp8_lse_violation)

pytestmark = pytest.mark.triton_hopper


def _qk(rng, B=2, Hq=4, Hkv=2, Nq=96, Nk=130, d=128):
    q = torch.tensor(rng.standard_normal((B, Hq, Nq, d)))
    k = torch.tensor(rng.standard_normal((B, Hkv, Nk, d)))
    return q, k, torch.tensor(rng.standard_normal((B, Hkv, Nk, d)))


def test_bound_follows_the_model(rng):
    """Every row: ``scale max_j sum_i |q_i k_ji| 2^-bits`` (keys the row sees) plus the small fp32 terms; one bit
    more halves the MMA term; the probe's bits put a randn row at d = 128 at a few 1e-3 (the flat 1e-3 it
    replaces sat inside the hardware's error)."""
    q, k, _ = _qk(rng, Nq=20, Nk=33)
    sc = 128 ** -0.5
    for causal in (False, True):
        b = fp8_lse_bound(q, k, causal=causal)
        b1 = fp8_lse_bound(q, k, causal=causal, bits=FP8_MMA_BITS + 1)
        ke = k.repeat_interleave(2, dim=1)
        for (bb, h, i) in ((0, 0, 0), (1, 3, 19), (0, 2, 7)):
            seen = allowed_mask(20, 33)[i] if causal else torch.ones(33, dtype=torch.bool)
            mma = sc * max(float((q[bb, h, i].abs() * ke[bb, h, j].abs()).sum()) for j in range(33) if seen[j])
            assert mma * 2.0 ** -FP8_MMA_BITS <= float(b[bb, h, i]) <= mma * 2.0 ** -FP8_MMA_BITS + 1e-5
            assert float(b[bb, h, i] - b1[bb, h, i]) == pytest.approx(mma * 2.0 ** -(FP8_MMA_BITS + 1), rel=1e-9)
    assert 1e-3 < float(fp8_lse_bound(q, k).median()) < 1e-2
    assert fp32_dot_bits(128) == 17.0


@pytest.mark.parametrize("causal", [False, True])
def test_noise_inside_the_bound_passes_and_an_offset_fails(rng, causal):
    q, k, v = _qk(rng)
    _, ref, _ = attention_ref(q, k, v, causal=causal)
    bound = fp8_lse_bound(q, k, causal=causal)
    inside = ref + bound * torch.tensor(rng.uniform(-0.99, 0.99, ref.shape))
    assert fp8_lse_violation(inside, ref, q, k, causal=causal) < 1
    for factor in (3.0, -4.0):  # one row moved by a few bounds: caught
        bad = inside.clone()
        bad[1, 2, 50] = ref[1, 2, 50] + factor * bound[1, 2, 50]
        assert fp8_lse_violation(bad, ref, q, k, causal=causal) >= abs(factor) * 0.99
    bad = inside + 3 * bound.max()  # every row a few bounds off
    assert fp8_lse_violation(bad, ref, q, k, causal=causal) > 2.5


def test_a_wrong_scale_or_a_dropped_key_fails(rng):
    """Bugs an FP8 kernel could have: the softmax scale off by 1% (e.g. a block scale applied twice or not at
    all would be far worse), one key left out of every row."""
    q, k, v = _qk(rng)
    sc = 128 ** -0.5
    _, ref, _ = attention_ref(q, k, v, scale=sc)
    _, wrong_scale, _ = attention_ref(q, k, v, scale=sc * 1.01)
    assert fp8_lse_violation(wrong_scale, ref, q, k) > 3
    _, dropped, _ = attention_ref(q, k[:, :, 1:], v[:, :, 1:], scale=sc)
    assert fp8_lse_violation(dropped, ref, q, k) > 3


def test_empty_rows_and_nan():
    """Nq > Nk, bottom-right causal: the first rows see no key (-inf); a finite value there, or a NaN, is inf."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, n, 64, generator=g) for n in (8, 5, 5))
    _, ref, _ = attention_ref(q, k, v, causal=True)
    assert torch.isinf(ref[0, 0, :3]).all() and math.isfinite(float(ref[0, 0, 3]))
    assert fp8_lse_violation(ref, ref, q, k, causal=True) == 0.0
    bad = ref.clone()
    bad[0, 0, 0] = 0.0
    assert fp8_lse_violation(bad, ref, q, k, causal=True) == float("inf")
    bad = ref.clone()
    bad[0, 0, 5] = float("nan")
    assert fp8_lse_violation(bad, ref, q, k, causal=True) == float("inf")
