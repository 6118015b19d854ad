"""The interpreter's bounds check (``autograder.interp_bounds``): an access outside every tensor of a launch is an
``OutOfBoundsAccess`` naming the kernel, the access and the nearest argument, raised before a byte moves; masked
accesses, block pointers with ``boundary_check``, views and atomics inside their tensors are not. The reference
kernels run clean under it on ragged shapes (they are what the grader compares against)."""
import numpy as np
import pytest
import torch

from reference.triton import INTERPRET  # first: it turns the interpreter on (no GPU) before @triton.jit runs

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from autograder import interp_bounds  # noqa: E402
from autograder.diagnose import out_of_bounds  # noqa: E402

pytestmark = [pytest.mark.autograder,
              pytest.mark.skipif(not INTERPRET, reason="the bounds check is the interpreter's (CPU tensors)")]


@pytest.fixture
def checked():
    interp_bounds.install()
    yield
    interp_bounds.uninstall()


@triton.jit
def _double(x_ptr, y_ptr, n, shift, BLOCK: tl.constexpr, MASK_LOAD: tl.constexpr, MASK_STORE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + shift
    if MASK_LOAD:
        x = tl.load(x_ptr + offs, mask=(offs < n) & (offs >= 0), other=0.0)
    else:
        x = tl.load(x_ptr + offs)
    if MASK_STORE:
        tl.store(y_ptr + offs, x * 2, mask=(offs < n) & (offs >= 0))
    else:
        tl.store(y_ptr + offs, x * 2)


@triton.jit
def _block_copy(x_ptr, y_ptr, m, n, BM: tl.constexpr, BN: tl.constexpr, CHECK: tl.constexpr):
    src = tl.make_block_ptr(x_ptr, (m, n), (n, 1), (tl.program_id(0) * BM, 0), (BM, BN), (1, 0))
    dst = tl.make_block_ptr(y_ptr, (m, n), (n, 1), (tl.program_id(0) * BM, 0), (BM, BN), (1, 0))
    if CHECK:
        tl.store(dst, tl.load(src, boundary_check=(0, 1), padding_option="zero"), boundary_check=(0, 1))
    else:
        tl.store(dst, tl.load(src))


@triton.jit
def _count(hist_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    i = tl.load(idx_ptr + offs, mask=offs < n, other=0)
    tl.atomic_add(hist_ptr + i, 1, mask=offs < n)


def _data(rng, n):
    return torch.tensor(rng.standard_normal(n), dtype=torch.float32)


def test_masked_kernel_runs_and_is_right(rng, checked):
    n = int(rng.integers(33, 63))
    x, y = _data(rng, n), torch.zeros(n)
    _double[(2,)](x, y, n, 0, BLOCK=32, MASK_LOAD=True, MASK_STORE=True)
    np.testing.assert_array_equal(y.numpy(), 2 * x.numpy())


def test_unmasked_store_on_a_ragged_tail_is_named_before_it_writes(rng, checked):
    n = int(rng.integers(33, 63))
    x, y = _data(rng, n), torch.zeros(n)
    with pytest.raises(Exception) as info:
        _double[(2,)](x, y, n, 0, BLOCK=32, MASK_LOAD=True, MASK_STORE=False)
    err = info.value.__cause__ or info.value
    assert isinstance(err, interp_bounds.OutOfBoundsAccess), repr(info.value)
    msg = str(err)
    assert f"tl.store in `_double` wrote {64 - n} elements outside" in msg, msg
    assert "1 element past the end of `y_ptr`" in msg and interp_bounds.MASK_HINT in msg, msg
    # the first program's stores (all in bounds) landed; the failing one moved nothing
    np.testing.assert_array_equal(y[:32].numpy(), 2 * x[:32].numpy())
    assert not y[32:].any()


def test_a_read_before_the_start_names_the_argument(rng, checked):
    x, y = _data(rng, 40), torch.zeros(40)
    with pytest.raises(Exception) as info:
        _double[(1,)](x, y, 40, -3, BLOCK=32, MASK_LOAD=False, MASK_STORE=True)
    msg = str(info.value.__cause__)
    assert "tl.load in `_double` read 3 elements outside" in msg and "before the start of `x_ptr`" in msg, msg


def test_a_wild_address_asks_for_the_offset_not_the_mask(rng, checked):
    x, y = _data(rng, 40), torch.zeros(40)
    with pytest.raises(Exception) as info:
        _double[(1,)](x, y, 40, 1 << 40, BLOCK=32, MASK_LOAD=False, MASK_STORE=False)
    msg = str(info.value.__cause__)
    assert "tl.load in `_double` read 32 elements outside" in msg and "lands 1.1e+12 elements from the nearest" in msg
    assert interp_bounds.FAR_HINT in msg and interp_bounds.MASK_HINT not in msg, msg


def test_views_and_block_pointers_stay_inside_their_storage(rng, checked):
    m, n = int(rng.integers(5, 12)), int(rng.integers(5, 12))
    big = _data(rng, 4 * m * n)
    x = big[m * n: 2 * m * n].view(m, n)           # a view: its storage is the whole buffer
    y = torch.zeros(m, n)
    _block_copy[(triton.cdiv(m, 4),)](x, y, m, n, BM=4, BN=16, CHECK=True)
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    with pytest.raises(Exception) as info:          # without boundary_check the tile runs past y's end
        _block_copy[(triton.cdiv(m, 4),)](x, torch.zeros(m, n), m, n, BM=4, BN=16, CHECK=False)
    assert isinstance(info.value.__cause__, interp_bounds.OutOfBoundsAccess), repr(info.value)


def test_atomics_are_checked(rng, checked):
    bins = int(rng.integers(3, 9))
    idx = torch.tensor(rng.integers(0, bins, 20), dtype=torch.int32)
    hist = torch.zeros(bins, dtype=torch.int32)
    _count[(1,)](hist, idx, 20, BLOCK=32)
    np.testing.assert_array_equal(hist.numpy(), np.bincount(idx.numpy(), minlength=bins))
    idx[int(rng.integers(0, 20))] = bins + 2
    with pytest.raises(Exception) as info:
        _count[(1,)](torch.zeros(bins, dtype=torch.int32), idx, 20, BLOCK=32)
    msg = str(info.value.__cause__)
    assert "an atomic in `_count` touched 1 element outside" in msg and "3 elements past the end of `hist_ptr`" in msg, msg


def test_uninstall_restores_the_interpreter(rng):
    from triton.runtime.interpreter import InterpreterBuilder
    before = InterpreterBuilder.create_masked_store
    interp_bounds.install()
    assert InterpreterBuilder.create_masked_store is not before
    interp_bounds.uninstall()
    assert InterpreterBuilder.create_masked_store is before


def test_the_grader_diagnosis_adds_the_ragged_axis():
    from autograder.specs import find_task
    tiled = find_task("a3.flash_attention_forward_basic")[1].tiled
    reason = ("tl.store in `_fwd` wrote 7 elements outside every tensor passed to the kernel (the first 1 element "
              f"past the end of `o_ptr`): {interp_bounds.MASK_HINT}")
    params = {"B": 1, "H": 2, "Nq": 37, "Nk": 64, "d": 16}
    msg = out_of_bounds("flash_attention_forward_basic", "", reason, tiled, params)
    assert msg.startswith("flash_attention_forward_basic failed: tl.store in `_fwd` wrote 7 elements"), msg
    assert "= 37, not a multiple of a block of" in msg and msg.endswith(interp_bounds.MASK_HINT), msg


def test_reference_kernels_stay_in_bounds_on_ragged_shapes(rng, checked):
    """What the grader compares against must not trip the check it applies to students."""
    from reference.triton import flash_attention_forward, flash_decode, paged_decode, softmax
    from tests.common import make_decode
    from tests.oracle import attention_ref, rel_err
    x = _data(rng, 3 * 77).view(3, 77)
    assert rel_err(softmax(x), torch.softmax(x.double(), -1)) < 1e-5
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, n, 16)), dtype=torch.float32) for n in (37, 45, 45))
    for causal in (False, True):
        out, _ = flash_attention_forward(q, k, v, causal=causal)
        assert rel_err(out, attention_ref(q, k, v, causal=causal)[0]) < 1e-4
    q, k, v = make_decode(rng, 2, 4, 2, 53, 16, torch.float32)
    lens = torch.tensor([53, 20], dtype=torch.int32)
    out = flash_decode(q, k, v, lens, num_splits=3)
    want = torch.stack([attention_ref(q[b:b + 1, :, None], k[b:b + 1, :, :int(lens[b])],
                                      v[b:b + 1, :, :int(lens[b])])[0][0, :, 0] for b in range(2)])
    assert rel_err(out, want) < 1e-4
    page = 16
    kc = torch.tensor(rng.standard_normal((8, page, 2, 16)), dtype=torch.float32)
    vc = torch.tensor(rng.standard_normal((8, page, 2, 16)), dtype=torch.float32)
    table = torch.tensor(rng.permutation(8).reshape(2, 4), dtype=torch.int32)
    lens = torch.tensor([53, 9], dtype=torch.int32)
    out = paged_decode(q, kc, vc, table, lens)
    for b in range(2):
        kb = kc[table[b].long()].reshape(-1, 2, 16).permute(1, 0, 2)[:, :int(lens[b])]
        vb = vc[table[b].long()].reshape(-1, 2, 16).permute(1, 0, 2)[:, :int(lens[b])]
        want = attention_ref(q[b:b + 1, :, None], kb[None], vb[None])[0][0, :, 0]
        assert rel_err(out[b], want) < 1e-4
