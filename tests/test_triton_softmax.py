"""reference.triton.softmax vs a float64 torch softmax: both code paths (rows in registers, online long rows),
odd lengths, large logits, -inf entries, strided input, and bad-input errors raised before any launch.

Runs on CUDA when there is one, else in the Triton interpreter on CPU (small shapes).
"""
import pytest
import torch

from reference.triton import DEVICE, softmax
from tests.oracle import rel_err

pytestmark = pytest.mark.triton_softmax

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def make(rng, shape, dtype, spread=1.0):
    x = rng.standard_normal(shape) * spread + rng.uniform(-2, 2)
    return torch.tensor(x, dtype=dtype, device=DEVICE)


def ref(x):
    return torch.softmax(x.detach().to("cpu", torch.float64), dim=-1)


@pytest.mark.parametrize("shape,dtype,max_single", [
    ((3, 5, 37), torch.float16, None),     # odd length, 3-D, several rows per program
    ((7, 1000), torch.bfloat16, None),
    ((2, 1), torch.float32, None),          # a row of one element: softmax = 1
    ((3, 1025), torch.float32, None),       # just past a power of two
    ((129,), torch.float16, None),          # 1-D
    ((4, 300), torch.float32, 64),          # online path: 5 column blocks, ragged last block
    ((5, 129), torch.bfloat16, 32),         # online path, one element in the last block
])
def test_matches_float64(rng, shape, dtype, max_single):
    x = make(rng, shape, dtype)
    y = softmax(x, max_single=max_single)
    assert y.shape == x.shape and y.dtype == dtype and y.device.type == DEVICE.type
    assert rel_err(y, ref(x)) < TOL[dtype]
    sums = y.double().sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=20 * TOL[dtype])


@pytest.mark.parametrize("max_single", [None, 64])
@pytest.mark.parametrize("dtype,spread", [(torch.float32, 1e4), (torch.float16, 5e3), (torch.bfloat16, 1e30)])
def test_large_logits_do_not_overflow(rng, dtype, spread, max_single):
    """exp(x) overflows for x > 88 (fp32) or > 11 (fp16) without the max trick."""
    x = make(rng, (4, 200), dtype, spread=spread)
    y = softmax(x, max_single=max_single)
    assert not torch.isnan(y).any()
    assert rel_err(y, ref(x)) < TOL[dtype]


@pytest.mark.parametrize("max_single", [None, 16])
def test_minus_inf_entries(rng, max_single):
    """Masked logits (-inf) get probability 0; a block that is all -inf in the online path must not NaN."""
    x = make(rng, (3, 70), torch.float32)
    x[0, :40] = float("-inf")  # the first two 16-wide blocks of row 0 are all -inf
    x[1, ::3] = float("-inf")
    y = softmax(x, max_single=max_single)
    assert torch.all(y[0, :40] == 0) and torch.all(y[1, ::3] == 0)
    assert rel_err(y, ref(x)) < TOL[torch.float32]


def test_strided_input(rng):
    x = make(rng, (40, 6), torch.float32).t()  # last axis not contiguous
    y = softmax(x)
    assert y.is_contiguous() and rel_err(y, ref(x)) < TOL[torch.float32]
    x2 = make(rng, (6, 80), torch.float16)[:, 3:70]  # row stride != row length
    assert rel_err(softmax(x2), ref(x2)) < TOL[torch.float16]


def test_does_not_modify_input(rng):
    x = make(rng, (5, 33), torch.float32)
    before = x.clone()
    softmax(x)
    assert torch.equal(x, before)


def test_bad_input_raises():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        softmax([1.0, 2.0])
    with pytest.raises(TypeError, match="x must have dtype"):
        softmax(torch.ones(3, 4, dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="x must have dtype"):
        softmax(torch.ones(3, 4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(ValueError, match="at least 1 dimension"):
        softmax(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="x must be on device"):
        softmax(torch.ones(3, 4, device="meta"))
    with pytest.raises(ValueError, match="max_single"):
        softmax(torch.ones(3, 4, device=DEVICE), max_single=48)
