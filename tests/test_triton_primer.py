"""reference.triton.primer (lecture 05a's kernels) against float64 torch: the vector add on ragged lengths (and
what its unmasked variant overwrites), the one-row softmax, the tiled matmul with ragged M, N, K and its
autotuned wrapper; bad inputs raise ValueError; primer_ptx's sm_90a PTX has the mask as predicates.

Runs on CUDA when there is one, else in the Triton interpreter on CPU (small shapes).
"""
import re

import pytest
import torch

from reference.triton import DEVICE, primer
from tests.oracle import rel_err

pytestmark = pytest.mark.triton_primer


def randn(rng, *shape, dtype=torch.float32, scale=1.0):
    return torch.tensor(rng.standard_normal(shape) * scale, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("n,block", [(1, 16), (1000, 256), (4096, 1024), (777, 64)])
def test_add_matches_float64_on_ragged_lengths(rng, n, block):
    x, y = randn(rng, n), randn(rng, n)
    out = torch.full_like(x, float("nan"))                     # every element must be written
    primer.add(x, y, block=block, out=out)
    assert torch.equal(out.double(), (x.double() + y.double()).float().double())


def test_unmasked_add_writes_exactly_the_tail_past_n(rng):
    n, block = int(rng.integers(200, 500)), 128
    n += n % 128 == 0                                          # a ragged tail
    pad = torch.full((n + block,), 5.0, device=DEVICE)         # inputs followed by memory the kernel may read
    x, y = pad.clone(), pad.clone()
    x[:n], y[:n] = randn(rng, n), randn(rng, n)
    buf = torch.full((n + block,), -7.0, device=DEVICE)
    primer.add(x[:n], y[:n], block=block, out=buf[:n], masked=True)
    assert (buf[n:] == -7.0).all()
    primer.add(x[:n], y[:n], block=block, out=buf[:n], masked=False)
    tail = -(-n // block) * block - n
    assert int((buf[n:] != -7.0).sum()) == tail and (buf[n:n + tail] == 10.0).all()
    assert torch.equal(buf[:n], x[:n] + y[:n])


@pytest.mark.parametrize("shape,dtype,tol", [((5, 37), torch.float32, 1e-6), ((3, 1), torch.float32, 1e-6),
                                             ((4, 300), torch.float16, 2e-3), ((2, 1025), torch.float32, 1e-6)])
def test_softmax_rows_matches_float64(rng, shape, dtype, tol):
    x = randn(rng, *shape, dtype=dtype, scale=4.0)
    y = primer.softmax_rows(x)
    assert y.dtype == dtype and y.shape == x.shape
    assert rel_err(y, torch.softmax(x.double().cpu(), -1)) < tol


@pytest.mark.parametrize("m,n,k,blocks", [(70, 45, 100, (32, 32, 32)), (16, 16, 16, (16, 16, 16)),
                                          (33, 17, 65, (16, 32, 16))])
def test_matmul_matches_float64_with_ragged_tiles(rng, m, n, k, blocks):
    a, b = randn(rng, m, k), randn(rng, k, n)
    c = primer.matmul(a, b, *blocks)
    assert c.shape == (m, n) and rel_err(c, a.double().cpu() @ b.double().cpu()) < 1e-5


def test_matmul_tuned_returns_a_listed_config(rng):
    a, b = randn(rng, 40, 50), randn(rng, 50, 30)
    c, cfg = primer.matmul_tuned(a, b)
    assert cfg in primer.MATMUL_CONFIGS
    assert rel_err(c, a.double().cpu() @ b.double().cpu()) < 1e-5


@pytest.mark.parametrize("call,what", [
    (lambda: primer.add(torch.zeros(4), torch.zeros(5)), "x and y"),
    (lambda: primer.add(torch.zeros(4), torch.zeros(4), block=100), "block"),
    (lambda: primer.softmax_rows(torch.zeros(3)), "x must be a 2-d"),
    (lambda: primer.softmax_rows(torch.zeros(2, 20000)), "columns"),
    (lambda: primer.matmul(torch.zeros(3, 4), torch.zeros(5, 2)), "matching K"),
    (lambda: primer.matmul(torch.zeros(3, 4), torch.zeros(4, 2), 8, 16, 16), "16"),
])
def test_bad_inputs_raise_value_error(call, what):
    with pytest.raises(ValueError, match=what):
        call()


@pytest.mark.slow
def test_ptx_for_sm90a_predicates_the_masked_loads_only():
    """Compiled without a GPU (a fresh process, interpreter off): the mask becomes one predicate per load."""
    from reference.triton.primer_ptx import ptx
    masked = ptx("add", {"BLOCK": 256, "MASKED": 1}, num_warps=4, aligned=True)
    unmasked = ptx("add", {"BLOCK": 256, "MASKED": 0}, num_warps=4, aligned=True)
    assert ".target sm_90a" in masked
    ld_m = [ln.strip() for ln in masked.splitlines() if "ld.global" in ln]
    ld_u = [ln.strip() for ln in unmasked.splitlines() if "ld.global" in ln]
    # 256 elements over 128 threads: 2 per thread of x and of y, one 64-bit vector load each when aligned
    assert len(ld_m) == len(ld_u) == 2
    assert all(re.match(r"@%p\d+ ld\.global", ln) for ln in ld_m) and not any(ln.startswith("@") for ln in ld_u)
    with pytest.raises(ValueError, match="name"):
        ptx("nope", {})
