"""The Gluon backward for Hopper (``reference.triton.flash_gluon_bwd``): fused dK/dV/dQ, dQ by atomics.

On CPU (CI) the kernel is compiled for sm_90a ahead of time in a child process in compile-only mode
(``TRITON_INTERPRET=0``; the interpreter cannot run Gluon): it must build, use wgmma (HGMMA: the five matmuls of
FA2 Algorithm 2 lines 10-16, no recomputation), TMA loads and vector reductions for dQ, and not spill. On an
H100/H200 the gradients are compared with float64 autograd (``benchmarks/course/bench_gluon_bwd.py`` does it at scale).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from reference.triton import DEVICE
from reference.triton.flash_gluon_bwd import flash_attention_backward_gluon
from tests.common import gluon_bwd_inputs as _inputs
from tests.oracle import attention_grads, attention_ref, rel_err

pytestmark = pytest.mark.triton_gluon
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
G_TOL = 2e-2

_CHILD = """
import json
from reference.triton._aot import resource_usage
from reference.triton.flash_gluon_bwd import compile_backward
print(json.dumps(resource_usage(compile_backward(128, True))))
"""


@pytest.mark.slow
def test_compiles_for_hopper_without_spills():
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    usage = json.loads(out.stdout.strip().splitlines()[-1])
    # d=128, BLOCK_M=64, BLOCK_N=128, 8 warps: per step S^T, dP^T (8 k-steps each), dV, dK (4), dQ (8) = 32 HGMMA;
    # a recomputing (14 N^2 d) kernel would have more
    assert usage["HGMMA"] == 32 and usage["HMMA"] == 0, usage
    assert usage["UTMALDG"] > 0, usage
    assert usage["LDL"] == 0 and usage["STL"] == 0 and usage["stack"] == 0, usage
    assert usage["registers"] <= 255, usage


def test_bad_inputs_are_named(rng):
    q, k, v, do = _inputs(rng, 1, 2, 2, 8, 8, 64)
    lse = torch.zeros(1, 2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        flash_attention_backward_gluon(q.float(), k.float(), v.float(), q.float(), lse, do.float())
    with pytest.raises(ValueError, match="do must have"):
        flash_attention_backward_gluon(q, k, v, q, lse, do[:, :, :4])
    with pytest.raises(ValueError, match="lse must have"):
        flash_attention_backward_gluon(q, k, v, q, lse[:, :1], do)
    q32, k32, v32, do32 = _inputs(rng, 1, 2, 2, 8, 8, 32)
    with pytest.raises(ValueError, match="head dimension"):
        flash_attention_backward_gluon(q32, k32, v32, q32, lse, do32)


@pytest.mark.skipif(HOPPER, reason="checks the error raised where no Hopper GPU is present")
def test_needs_a_hopper_gpu(rng):
    q, k, v, do = _inputs(rng, 1, 2, 2, 8, 8, 64)
    with pytest.raises(RuntimeError, match="compute capability 9.0"):
        flash_attention_backward_gluon(q, k, v, q, torch.zeros(1, 2, 8, device=DEVICE), do)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,d,causal,dtype", [
    (2, 4, 4, 256, 256, 128, False, torch.bfloat16), (1, 4, 2, 300, 1000, 128, True, torch.bfloat16),
    (1, 2, 2, 1000, 300, 128, True, torch.bfloat16), (1, 2, 2, 333, 333, 64, False, torch.float16),
    (1, 2, 2, 1, 5, 64, True, torch.bfloat16)])
def test_gradients_match_float64_autograd(rng, B, Hq, Hkv, Nq, Nk, d, causal, dtype):
    q, k, v, do = _inputs(rng, B, Hq, Hkv, Nq, Nk, d, dtype)
    o, lse, _ = attention_ref(q, k, v, causal=causal)
    got = flash_attention_backward_gluon(q, k, v, o.to(DEVICE, dtype), lse.to(DEVICE, torch.float32), do,
                                         causal=causal)
    for name, a, r in zip(("dq", "dk", "dv"), got, attention_grads(q, k, v, do, causal=causal)):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, r) < G_TOL, (name, rel_err(a, r))
