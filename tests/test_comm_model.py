"""The context-parallel communication model (``reference.distributed.comm_model``) against counts made here
independently: the ring's messages enumerated hop by hop, Ulysses' all-to-all as an explicit (sender, receiver)
table of head-slices, the layer's FLOPs from the causal mask itself."""
import numpy as np
import pytest

from reference.distributed import comm_model as cm


def _ring_messages(n, world, hkv, d, backward, act=2, grad=4):
    """Bytes rank 0 sends, message by message, following ring_attention_forward/backward's loop."""
    c = n // world
    sent = 0
    for s in range(world):
        if s < world - 1:
            sent += 2 * c * hkv * d * act           # K and V chunk to rank + 1
        if backward and world > 1:
            sent += 2 * c * hkv * d * grad          # dK, dV accumulators of the held chunk
    return sent


def _ulysses_table(n, world, hq, hkv, d, act=2):
    """Rank 0's sends: for Q, K, V (in) and O (out), its c tokens of every head group owned by another rank."""
    c = n // world
    hkv_eff = max(hkv, world)
    owner_q = np.arange(hq) // (hq // world)
    owner_kv = np.arange(hkv_eff) // (hkv_eff // world)
    per_head = c * d * act
    q = (owner_q != 0).sum() * per_head
    kv = (owner_kv != 0).sum() * per_head
    return 2 * q + 2 * kv                         # Q and O; K and V


@pytest.mark.parametrize("world", [1, 2, 4, 8])
@pytest.mark.parametrize("backward", [False, True])
def test_ring_bytes_match_the_messages_of_the_ring_loop(world, backward):
    n, hkv, d = 4096 * world, 8, 128
    assert cm.comm_bytes("ring", n, world, 32, hkv, d, backward) == _ring_messages(n, world, hkv, d, backward)


@pytest.mark.parametrize("world,hq,hkv", [(2, 32, 8), (4, 32, 8), (8, 32, 8), (8, 32, 2), (4, 4, 1)])
def test_ulysses_bytes_match_an_explicit_all_to_all(world, hq, hkv):
    n, d = 1024 * world, 64
    want = _ulysses_table(n, world, hq, hkv, d)
    assert cm.comm_bytes("ulysses", n, world, hq, hkv, d) == pytest.approx(want)
    assert cm.comm_bytes("ulysses", n, world, hq, hkv, d, backward=True) == pytest.approx(want)


def test_ulysses_needs_heads_divisible_by_the_world():
    with pytest.raises(ValueError, match="hq"):
        cm.comm_bytes("ulysses", 4096, 16, 8, 8, 128)
    with pytest.raises(ValueError, match="hkv"):
        cm.comm_bytes("ulysses", 4096, 8, 24, 3, 128)
    rows = cm.compare(4096, 16, 8, 8, 128, 5e14, 4e11)
    assert {r["scheme"] for r in rows} == {"ring", "allgather"}


def test_allgather_moves_the_ring_forward_bytes_and_a_reduce_scatter_backward():
    n, w, hq, hkv, d = 65536, 4, 32, 8, 128
    assert cm.comm_bytes("allgather", n, w, hq, hkv, d) == cm.comm_bytes("ring", n, w, hq, hkv, d)
    c = n // w
    assert cm.comm_bytes("allgather", n, w, hq, hkv, d, True) == (w - 1) * 2 * c * hkv * d * (2 + 4)


@pytest.mark.parametrize("causal", [False, True])
def test_flops_count_the_visible_pairs(causal):
    rng = np.random.default_rng(0)
    n, w, hq, d = int(rng.integers(50, 90)) * 4, 4, 3, 16
    pairs = n * n if not causal else n * (n + 1) / 2
    want = 4 * pairs * hq * d / w                 # 2 matmuls x 2 FLOPs per multiply-add
    assert cm.attention_flops(n, w, hq, d, causal) == pytest.approx(want, rel=1.0 / n + 1e-12)
    assert cm.attention_flops(n, w, hq, d, causal, backward=True) == pytest.approx(2.5 * want, rel=1.0 / n + 1e-12)


def test_break_even_625_forward_750_backward():
    """Lecture 10's break-even: 500 TFLOP/s, 400 GB/s, GQA 32/8, bf16 K/V, fp32 dK/dV: 625 -> 750 positions."""
    fwd = cm.ring_break_even(32, 8, 500e12, 400e9)
    bwd = cm.ring_break_even(32, 8, 500e12, 400e9, backward=True)
    assert fwd == pytest.approx(625) and bwd == pytest.approx(750)
    assert cm.ring_break_even(32, 32, 500e12, 400e9) == pytest.approx(2500)     # MHA: 4x the bytes
    for backward, c in ((False, fwd), (True, bwd)):
        assert cm.ring_step_ratio(c, 32, 8, 128, 500e12, 400e9, backward) == pytest.approx(1.0)
        assert cm.ring_step_ratio(2 * c, 32, 8, 128, 500e12, 400e9, backward) == pytest.approx(2.0)


def test_ring_exposes_only_what_compute_does_not_hide():
    rows = {(r["scheme"], r["backward"]): r for r in cm.compare(131072, 2, 32, 8, 128, 5e14, 4e11)}
    ring = rows[("ring", False)]
    assert ring["exposed_s"] == 0.0 and ring["compute_s"] > ring["comm_s"]
    assert rows[("allgather", False)]["exposed_s"] == rows[("allgather", False)]["comm_s"] > 0


@pytest.mark.parametrize("bad,match", [(dict(scheme="tree"), "scheme"), (dict(n=0), "n must"),
                                       (dict(world=1.5), "world"), (dict(hq=6, hkv=4), "multiple of hkv"),
                                       (dict(act_bytes=0), "act_bytes")])
def test_bad_input_names_the_argument(bad, match):
    args = dict(scheme="ring", n=1024, world=2, hq=8, hkv=2, d=64)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        cm.comm_bytes(**args)
