"""``autograder.interp_fast``: the interpreter without its per-helper-call re-patching gives bit-identical results
(reference kernels built from ``@triton.jit`` helpers, ragged shapes), leaves ``triton.language`` unpatched after
a launch as the shipped interpreter does, and ``uninstall`` restores the interpreter's own functions."""
import pytest
import torch

from reference.triton import INTERPRET  # first: it turns the interpreter on (no GPU) before Triton is imported

import triton.language as tl  # noqa: E402

from autograder import interp_fast  # noqa: E402

pytestmark = [pytest.mark.autograder,
              pytest.mark.skipif(not INTERPRET, reason="a change to the interpreter (CPU tensors)")]


def _run_all(rng):
    from reference.triton import flash_attention_forward, flash_decode, softmax
    from tests.common import make_decode
    x = torch.tensor(rng.standard_normal((3, 77)), dtype=torch.float32)
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, n, 16)), dtype=torch.float32) for n in (37, 45, 45))
    qd, kd, vd = make_decode(rng, 2, 4, 2, 53, 16, torch.float32)
    lens = torch.tensor([53, 20], dtype=torch.int32)
    return [softmax(x), *flash_attention_forward(q, k, v, causal=True), flash_decode(qd, kd, vd, lens, num_splits=3)]


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
    interp_fast.install()
    assert interpreter._patch_lang is not patch_lang and interpreter.GridExecutor.__call__ is not launch
    interp_fast.uninstall()
    assert interpreter._patch_lang is patch_lang and interpreter.GridExecutor.__call__ is launch
