"""Inputs, tolerances and fixtures the torch/Triton test files share (test files import from here or from
``tests/common_numpy.py``, never from each other; ``tests/test_layout_tests_benchmarks.py`` checks it).

Tolerances are relative errors against the float64 oracle of ``tests/oracle.py``. The NumPy-only pieces
(NumPy tolerances and shapes, ``load_solution``) live in ``tests/common_numpy.py``, which imports neither torch
nor Triton.
"""
import pytest
import torch

from reference.triton import DEVICE, INTERPRET

# ---- Triton kernels ----------------------------------------------------------------------------------------------
# FlashAttention. fp16/bf16: P is rounded to the input dtype before P @ V, as in FlashAttention. fp32: exact fp32
# dots in the interpreter; TF32 dots on a GPU (about 1e-3).
FLASH_O_TOL = {torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5 if INTERPRET else 5e-3}
FLASH_G_TOL = {torch.float16: 6e-3, torch.bfloat16: 4e-2, torch.float32: 1e-5 if INTERPRET else 1e-2}
FLASH_LSE_TOL = {torch.float16: 1e-5, torch.bfloat16: 1e-5, torch.float32: 1e-6 if INTERPRET else 1e-3}

@pytest.fixture(autouse=True)
def pinned_flash_configs():
    """One block configuration per FlashAttention kernel (``configs.FWD_PINS["tests"]``, ``BWD_PINS["tests"]``
    on a GPU; the interpreter default is already a pin), so tests are fast and deterministic; a test file turns it
    on with ``from tests.common import pinned_flash_configs``."""
    from reference.triton import configs
    if INTERPRET:
        yield
        return
    with configs.pinned(fwd=configs.FWD_PINS["tests"], bwd=configs.BWD_PINS["tests"]):
        yield

# Decode: fp32 dots run in true fp32; fp16/bf16 round P to the input dtype before the P @ V dot.
DECODE_TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def make_decode(rng, B, Hq, Hkv, n, d, dtype, spread=1.0):
    """Fresh non-uniform random decode inputs ``q (B, Hq, d)``, ``k, v (B, Hkv, n, d)`` on DEVICE (never zeros)."""
    def t(*shape):
        x = rng.standard_normal(shape) * spread + rng.uniform(-0.5, 0.5)
        return torch.tensor(x, dtype=dtype, device=DEVICE)
    return t(B, Hq, d), t(B, Hkv, n, d), t(B, Hkv, n, d)


def gluon_bwd_inputs(rng, B, Hq, Hkv, Nq, Nk, d, dtype=torch.bfloat16):
    """Fresh standard-normal ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)``, ``do (B, Hq, Nq, d)`` on DEVICE, for the
    Gluon backward tests (warp-specialised, autograd op)."""
    def t(*shape):
        return torch.tensor(rng.standard_normal(shape), dtype=dtype, device=DEVICE)
    return t(B, Hq, Nq, d), t(B, Hkv, Nk, d), t(B, Hkv, Nk, d), t(B, Hq, Nq, d)
