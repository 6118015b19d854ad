"""``autograder.interp_fast``: the interpreter without its per-helper-call re-patching, its unread overflow checks,
its rebuilt type objects and its rebuilt dtype table gives bit-identical results (reference kernels built from
``@triton.jit`` helpers, ragged shapes), leaves ``triton.language`` unpatched after a launch as the shipped interpreter does, shares block
types that compare as the shipped ones, and ``uninstall`` restores the interpreter's own functions."""
import pytest
import torch

from reference.triton import INTERPRET  # first: it turns the interpreter on (no GPU) before Triton is imported

import triton.language as tl  # noqa: E402

from autograder import interp_fast  # noqa: E402

pytestmark = [pytest.mark.autograder,
              pytest.mark.skipif(not INTERPRET, reason="a change to the interpreter (CPU tensors)")]


import triton  # noqa: E402


@triton.jit
def _int_mix(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """int32 arithmetic that wraps (what the overflow sanitizer computes a verdict for) and mixed int/float."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0)
    y = x * 65599 + offs * 40503 - 7
    y = y * y + (x - offs) * 3
    tl.store(y_ptr + offs, y + (x.to(tl.float32) * 0.5).to(tl.int32), mask=m)


def _run_all(rng):
    from reference.triton import flash_attention_forward, flash_decode, softmax
    from tests.common import make_decode
    x = torch.tensor(rng.standard_normal((3, 77)), dtype=torch.float32)
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, n, 16)), dtype=torch.float32) for n in (37, 45, 45))
    qd, kd, vd = make_decode(rng, 2, 4, 2, 53, 16, torch.float32)
    lens = torch.tensor([53, 20], dtype=torch.int32)
    xi = torch.tensor(rng.integers(-(1 << 31), 1 << 31, 100), dtype=torch.int32)
    yi = torch.empty_like(xi)
    _int_mix[(4,)](xi, yi, 100, BLOCK=32)
    return [softmax(x), *flash_attention_forward(q, k, v, causal=True), flash_decode(qd, kd, vd, lens, num_splits=3),
            yi]


@pytest.fixture
def shipped():
    """The interpreter as Triton ships it for the test's duration (the suite installs the fast one)."""
    was = bool(interp_fast._SAVED)
    interp_fast.uninstall()
    yield
    if was:
        interp_fast.install()


def test_same_bits_as_the_shipped_interpreter(rng, shipped):
    seed = int(rng.integers(1 << 31))
    import numpy as np
    slow = _run_all(np.random.default_rng(seed))
    interp_fast.install()
    try:
        fast = _run_all(np.random.default_rng(seed))
    finally:
        interp_fast.uninstall()
    for a, b in zip(slow, fast):
        assert torch.equal(a, b)


def test_language_is_unpatched_after_a_launch(rng, shipped):
    before = {name: getattr(tl, name) for name in ("program_id", "load", "store", "dot", "max")}
    interp_fast.install()
    try:
        _run_all(rng)
        assert {name: getattr(tl, name) for name in before} == before
    finally:
        interp_fast.uninstall()


def test_uninstall_restores_the_interpreter(shipped):
    from triton.runtime import interpreter
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    options = interpreter.interpreter_builder.options
    tensor_init, block_init = tl.core.tensor.__init__, tl.core.block_type.__init__
    np_dtype = interpreter._get_np_dtype
    assert options.sanitize_overflow and not options.debug          # as shipped: checks computed, never read
    interp_fast.install()
    assert interpreter._patch_lang is not patch_lang and interpreter.GridExecutor.__call__ is not launch
    assert interpreter._get_np_dtype is not np_dtype
    for ty in (tl.float16, tl.bfloat16, tl.int1, tl.pointer_type(tl.float32), tl.block_type(tl.float8e4nv, [4])):
        assert interpreter._get_np_dtype(ty) == np_dtype(ty) == interpreter._get_np_dtype(ty)   # asked, then kept
    assert not interpreter.interpreter_builder.options.sanitize_overflow
    interp_fast.uninstall()
    assert interpreter._patch_lang is patch_lang and interpreter.GridExecutor.__call__ is launch
    assert interpreter.interpreter_builder.options is options
    assert tl.block_type(tl.float32, [2, 4]) is not tl.block_type(tl.float32, [2, 4])        # built each time again
    assert tl.core.tensor.__init__ is tensor_init and tl.core.block_type.__init__ is block_init
    assert interpreter._get_np_dtype is np_dtype


def test_block_types_are_shared_and_behave_as_built(shipped):
    """One object per element type and shape while installed, equal (and printing, hashing, comparing) as the
    shipped interpreter's own; a bad shape raises as before; Gluon's subclass is built as before."""
    from triton.experimental.gluon.language import _core as gl_core
    from triton.experimental.gluon.language._layouts import BlockedLayout
    ptr, cptr = tl.pointer_type(tl.float16), tl.pointer_type(tl.float16, const=True)
    shipped_types = [tl.block_type(t, shape) for t in (tl.float32, tl.int32, ptr, cptr) for shape in ([4, 8], [8])]
    interp_fast.install()
    try:
        made = [tl.block_type(t, shape) for t in (tl.float32, tl.int32, ptr, cptr) for shape in ([4, 8], [8])]
        again = [tl.block_type(t, [tl.constexpr(n) for n in shape])
                 for t in (tl.float32, tl.int32, tl.pointer_type(tl.float16), tl.pointer_type(tl.float16, const=True))
                 for shape in ([4, 8], [8])]
        assert all(a is b for a, b in zip(made, again))
        assert len({id(t) for t in made}) == len(made)              # other element or shape: another object
        for a, b in zip(shipped_types, made):
            assert a == b and str(a) == str(b) and a.shape == b.shape and a.numel == b.numel and a.scalar == b.scalar
        with pytest.raises(TypeError, match="0d block_type"):
            tl.block_type(tl.float32, [])
        layout = BlockedLayout([1, 1], [1, 32], [1, 1], [1, 0])
        d1, d2 = gl_core.distributed_type(tl.float32, [4, 8], layout), gl_core.distributed_type(tl.float32, [4, 8], layout)
        assert d1 is not d2 and d1 == d2 and d1.layout == layout and "BlockedLayout" in d1.name
        x = tl.core.tensor(None, made[0])
        y = tl.core.tensor(None, made[0])
        assert [int(s) for s in x.shape] == [4, 8] and int(x.numel) == 32 and x.dtype == tl.float32 and y.shape == x.shape
        shape = made[0].shape
        assert bool(shape == [4, 8]) and not bool(shape == [4, 9]) and not bool(shape == (4,)) and shape != [8, 4]
        assert bool(shape == tl.core.tuple([4, 8])) and bool(shape == tl.constexpr((4, 8)))
        s = tl.core.tensor(None, tl.int32)
        assert tuple(s.shape) == () and int(s.numel) == 1 and s.dtype == tl.int32
    finally:
        interp_fast.uninstall()


def test_overflow_checks_are_never_read_by_the_shipped_interpreter(shipped):
    """Why switching them off changes nothing: the shipped interpreter's ``debug`` is off, so a wrapping int32
    product runs to the end (no assertion) and gives the wrapped value, with or without the checks."""
    import numpy as np
    xi = torch.tensor([1 << 30, -(1 << 30), 123456789, 7], dtype=torch.int32)
    want = torch.tensor(np.array([
        (int(x) * 65599 + i * 40503 - 7) for i, x in enumerate(xi.tolist())], dtype=np.int64).astype(np.int32))
    want = want * want + (xi - torch.arange(4, dtype=torch.int32)) * 3 + (xi.to(torch.float32) * 0.5).to(torch.int32)
    out = []
    for fast in (False, True):
        if fast:
            interp_fast.install()
        try:
            yi = torch.empty_like(xi)
            _int_mix[(1,)](xi, yi, 4, BLOCK=4)
            out.append(yi)
        finally:
            interp_fast.uninstall()
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], want)
