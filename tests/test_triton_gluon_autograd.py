"""``reference.triton.flash_attention_gluon``: the Gluon forward and warp-specialised backward as one autograd op.

On CPU (CI) only the input checks run (the interpreter cannot run Gluon; the kernels' sm_90a compiles are tested in
``test_triton_gluon.py`` and ``test_triton_gluon_bwd_ws.py``). On an H100/H200, ``o`` and the gradients from
``o.backward(do)`` are compared with float64 autograd, and with ``flash_attention`` (the Triton kernels).
"""
import pytest
import torch

from reference.triton import DEVICE, flash_attention_gluon
from tests.oracle import attention_grads, attention_ref, rel_err
from tests.common import gluon_bwd_inputs as _inputs

pytestmark = pytest.mark.triton_gluon
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)



def test_bad_inputs_are_named(rng):
    q, k, v, _ = _inputs(rng, 1, 2, 2, 8, 8, 64)
    with pytest.raises(ValueError, match="flash_attention_gluon: q, k, v must be bfloat16 or float16"):
        flash_attention_gluon(q.float(), k.float(), v.float())
    q32, k32, v32, _ = _inputs(rng, 1, 2, 2, 8, 8, 32)
    with pytest.raises(ValueError, match="head dimension"):
        flash_attention_gluon(q32, k32, v32)
    with pytest.raises((TypeError, ValueError), match="causal"):
        flash_attention_gluon(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="scale must be finite"):
        flash_attention_gluon(q, k, v, scale=float("inf"))
    with pytest.raises(ValueError, match="key_loop"):
        flash_attention_gluon(q, k, v, key_loop={"fenced": True})
    with pytest.raises(TypeError, match="bwd_config: config must be a reference.triton.configs.GluonBackwardConfig"):
        flash_attention_gluon(q, k, v, bwd_config=(64, 2, True, True, True, True))
    with pytest.raises(ValueError, match="bwd_order_heads: order_heads must be an int >= 0"):
        flash_attention_gluon(q, k, v, bwd_order_heads=-1)


@pytest.mark.skipif(HOPPER, reason="checks the error raised where no Hopper GPU is present")
def test_needs_a_hopper_gpu(rng):
    q, k, v, _ = _inputs(rng, 1, 2, 2, 8, 8, 64)
    with pytest.raises(RuntimeError, match="flash_attention_gluon needs .*compute capability 9.0"):
        flash_attention_gluon(q, k, v)


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,d,causal,dtype", [
    (2, 4, 4, 512, 512, 128, False, torch.bfloat16), (1, 8, 2, 700, 700, 128, True, torch.bfloat16),
    (1, 2, 2, 300, 1000, 128, True, torch.bfloat16), (1, 2, 2, 1000, 300, 64, True, torch.float16),
    (1, 2, 1, 1, 77, 64, False, torch.bfloat16)])
@pytest.mark.parametrize("key_loop", [None, {"fence": True}, {"peeled": True, "fence": True}])
def test_output_and_gradients_match_float64(rng, B, Hq, Hkv, Nq, Nk, d, causal, dtype, key_loop):
    """The pinned forward and its key-loop options (``flash_gluon.attend_overlapped``: ``fence``, ``peeled``)."""
    q, k, v, do = _inputs(rng, B, Hq, Hkv, Nq, Nk, d, dtype)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o = flash_attention_gluon(*leaves, causal=causal, key_loop=key_loop)
    o.backward(do)
    ro, _, _ = attention_ref(q, k, v, causal=causal)
    assert o.dtype == dtype and rel_err(o, ro) < 1e-2
    for name, leaf, r in zip(("dq", "dk", "dv"), leaves, attention_grads(q, k, v, do, causal=causal)):
        assert leaf.grad.shape == leaf.shape and leaf.grad.dtype == dtype, name
        assert torch.isfinite(leaf.grad).all(), name
        assert rel_err(leaf.grad, r) < 2e-2, (name, rel_err(leaf.grad, r))


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
def test_agrees_with_the_triton_autograd_op(rng):
    from reference.triton import flash_attention
    q, k, v, do = _inputs(rng, 2, 4, 4, 384, 384, 128)
    grads = []
    for op in (flash_attention_gluon, flash_attention):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        op(*leaves, causal=True).backward(do)
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        assert rel_err(a, b) < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="Gluon kernels need an H100/H200 (sm_90)")
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("B,Hq,Hkv,N,d,causal", [(2, 4, 4, 384, 128, True), (1, 8, 2, 700, 64, False)])
def test_repeated_steps_take_the_recorded_launches(rng, B, Hq, Hkv, N, d, causal, persistent):
    """A training loop's second step with the same shapes repeats the recorded forward and backward launches
    (``_fastlaunch``: no Triton launch path, no descriptor objects) on its own fresh tensors: its output and
    gradients match float64 as the first step's do, and the caches hold no reference to the first step's tensors.
    With the persistent backward the recorded launch keeps its schedule, not a step's tensors."""
    import dataclasses
    from reference.triton.configs import GLUON_BACKWARD
    bwd_config = dataclasses.replace(GLUON_BACKWARD[d], persistent=persistent)
    import gc
    import weakref
    from reference.triton.hopper.flash_gluon_autograd import clear_recorded_launches, recorded_launches
    clear_recorded_launches()

    def step_refs(step):
        q, k, v, do = _inputs(rng, B, Hq, Hkv, N, N, d)
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        o = flash_attention_gluon(*leaves, causal=causal, bwd_config=bwd_config)
        o.backward(do)
        assert recorded_launches() == (1, 1), step
        assert rel_err(o, attention_ref(q, k, v, causal=causal)[0]) < 1e-2, step
        for name, leaf, r in zip(("dq", "dk", "dv"), leaves, attention_grads(q, k, v, do, causal=causal)):
            assert rel_err(leaf.grad, r) < 2e-2, (step, name, rel_err(leaf.grad, r))
        return [weakref.ref(x) for x in (*leaves, o)]

    refs = [r for step in range(3) for r in step_refs(step)]
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)
