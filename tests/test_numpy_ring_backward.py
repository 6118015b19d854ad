"""``reference.numpy.ring.ring_backward_step`` run over a whole simulated ring (every rank, every step, dK/dV
accumulators handed on) equals torch autograd of plain causal attention over the whole sequence."""
import numpy as np
import pytest
import torch

from reference.numpy.ring import ring_backward_step


def positions(n, world, rank, layout):
    if layout == "contiguous":
        return np.array_split(np.arange(n), world)[rank]
    chunks = np.array_split(np.arange(n), 2 * world)
    return np.concatenate([chunks[rank], chunks[2 * world - 1 - rank]])


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal,world,hq,hkv", [(True, 3, 4, 2), (False, 2, 2, 2), (True, 4, 3, 1)])
def test_whole_ring_backward_matches_autograd(layout, causal, world, hq, hkv):
    rng = np.random.default_rng([world, hq, hkv, int(causal)])
    n, d = int(rng.integers(4 * world, 12 * world)) | 1, 8        # ragged: odd, not a multiple of 2W
    q, do = (rng.standard_normal((2, hq, n, d)) for _ in range(2))
    k, v = (rng.standard_normal((2, hkv, n, d)) for _ in range(2))
    qt, kt, vt = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    g = hq // hkv
    s = qt @ kt.repeat_interleave(g, 1).transpose(-1, -2) / d ** 0.5
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ vt.repeat_interleave(g, 1)
    o.backward(torch.tensor(do))
    lse, o = lse.detach().numpy(), o.detach().numpy()
    delta = (do * o).sum(-1)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    acc = {src: [np.zeros((2, hkv, len(positions(n, world, src, layout)), d)) for _ in range(2)] for src in range(world)}
    for step in range(world):
        for r in range(world):
            src = (r - step) % world                        # the chunk rank r holds at this step
            qp, kp = positions(n, world, r, layout), positions(n, world, src, layout)
            dq_r, acc[src][0], acc[src][1] = ring_backward_step(
                dq[:, :, qp], acc[src][0], acc[src][1], q[:, :, qp], k[:, :, kp], v[:, :, kp], do[:, :, qp],
                lse[:, :, qp], delta[:, :, qp], qp, kp, causal=causal)
            dq[:, :, qp] = dq_r
    for src in range(world):
        kp = positions(n, world, src, layout)
        dk[:, :, kp], dv[:, :, kp] = acc[src]
    for got, want in ((dq, qt.grad), (dk, kt.grad), (dv, vt.grad)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-10)


def test_bad_shapes_name_the_argument():
    x = np.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match="dk"):
        ring_backward_step(x, np.zeros((1, 2, 5, 4)), x, x, x, x, x, np.zeros((1, 2, 3)), np.zeros((1, 2, 3)),
                           np.arange(3), np.arange(3))
