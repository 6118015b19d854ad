"""reference.triton.flash_decode (split-KV decode, GQA packing) vs the float64 oracle and the NumPy reference.

Runs on CUDA when there is one, else in the Triton interpreter on CPU (small shapes: the interpreter is slow).
"""
import numpy as np
import pytest
import torch

from reference.triton import DEVICE, flash_decode
from reference.triton.decode import choose_num_splits
from tests.common import DECODE_TOL as TOL
from tests.common import decode_nan_tails
from tests.common import make_decode as make
from tests.oracle import decode_ref, rel_err

pytestmark = pytest.mark.triton_flash_decode

def lens_tensor(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv", [(8, 2), (4, 1), (2, 2)])
def test_ragged_gqa_vs_oracle_and_numpy(rng, dtype, hq, hkv):
    n_max, d = 150, 64
    q, k, v = make(rng, 4, hq, hkv, n_max, d, dtype)
    lens = [n_max, 1, 0, int(rng.integers(2, n_max))]  # full, a single key, empty, ragged
    sl = lens_tensor(lens)
    o = flash_decode(q, k, v, seq_lens=sl)
    assert o.dtype == dtype and o.shape == q.shape and o.device.type == DEVICE.type
    ref = decode_ref(q, k, v, lens)
    assert rel_err(o, ref) < TOL[dtype]
    assert torch.all(o[2] == 0), "seq_len 0 must give output 0"
    o3 = flash_decode(q, k, v, seq_lens=sl, num_splits=3)  # the heuristic picks 1 split here: also merge
    assert rel_err(o3, ref) < TOL[dtype] and torch.all(o3[2] == 0)
    # A single key: the output is that key's value row, for every query head of the group.
    group = hq // hkv
    v1 = v[1, :, 0].double().repeat_interleave(group, dim=0)
    assert rel_err(o[1], v1) < TOL[dtype]
    # The NumPy reference (same algorithm, float32 here) agrees too.
    from reference.numpy.decoding import flash_decoding
    o_np, _ = flash_decoding(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                             num_splits=3, seq_lens=np.array(lens))
    assert rel_err(o, torch.from_numpy(o_np)) < TOL[dtype]


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 40])
def test_num_splits_any(rng, num_splits):
    # 200 keys = 4 key blocks of 64: 7 and 40 splits leave most splits empty (lse -inf, merged as weight 0).
    q, k, v = make(rng, 2, 8, 2, 200, 32, torch.float32)
    sl = lens_tensor([200, 67], dtype=torch.int64)
    o = flash_decode(q, k, v, seq_lens=sl, num_splits=num_splits)
    assert rel_err(o, decode_ref(q, k, v, sl)) < TOL[torch.float32]


@pytest.mark.parametrize("hq,hkv,num_splits", [(8, 2, 5), (32, 1, 9), (6, 3, 12)])
def test_fused_merge_matches_merge_kernel_and_resets_tickets(rng, hq, hkv, num_splits):
    # The merge inside stage 1 (last ticket of a group merges) against the separate stage-2 kernel; repeated
    # calls must find every ticket counter back at 0 (a leftover count would merge too early or never).
    # 333 keys = 6 key blocks of 64: 12 splits leave half of them empty (lse -inf), row 1 (length 0) all of them;
    # 32 q heads per kv head merge in chunks of 4 splits (9 = 4 + 4 + 1). (12, not 40, splits: 4 times fewer
    # interpreted programs; 40 splits of the fused merge stay in test_num_splits_any[40].)
    import dataclasses

    from reference.triton import configs, decode_serving
    q, k, v = make(rng, 3, hq, hkv, 333, 32, torch.float32)
    sl = lens_tensor([333, 0, int(rng.integers(1, 333))])
    assert configs.DECODE_PINS["fp32"].fuse_merge  # the default below is the fused merge
    separate = dataclasses.replace(configs.DECODE_PINS["fp32"], fuse_merge=False)
    o_sep = flash_decode(q, k, v, seq_lens=sl, num_splits=num_splits, config=separate)
    for _ in range(2 if DEVICE.type == "cpu" else 50):
        o = flash_decode(q, k, v, seq_lens=sl, num_splits=num_splits)
        assert rel_err(o, o_sep) < 1e-6 and torch.all(o[1] == 0)
    assert rel_err(o, decode_ref(q, k, v, sl)) < TOL[torch.float32]
    assert int(sum(b.abs().sum() for key, b in decode_serving._COUNTERS.items() if key[:2] == (o.device.type, o.device.index))) == 0


def test_splits_agree_with_one_split(rng):
    q, k, v = make(rng, 1, 4, 2, 300, 64, torch.float32)
    o1 = flash_decode(q, k, v, num_splits=1)
    o5 = flash_decode(q, k, v, num_splits=5)
    assert rel_err(o5, o1) < 1e-6


@pytest.mark.parametrize("d", [16, 32, 128])
def test_head_dims(rng, d):
    q, k, v = make(rng, 2, 4, 2, 70, d, torch.float16)
    o = flash_decode(q, k, v, num_splits=2)
    assert rel_err(o, decode_ref(q, k, v)) < TOL[torch.float16]


@pytest.mark.parametrize("hq,hkv", [(6, 2), (32, 1)])
def test_group_not_power_of_two_or_wider_than_16(rng, hq, hkv):
    # G = 3 pads to 16 rows; G = 32 (MQA) makes a 32-row tile.
    q, k, v = make(rng, 2, hq, hkv, 90, 32, torch.float32)
    o = flash_decode(q, k, v, num_splits=2)
    assert rel_err(o, decode_ref(q, k, v)) < TOL[torch.float32]


def test_large_logits_fp16_and_custom_scale(rng):
    # Scores of several hundred: exp overflows fp16/fp32 without the running-max subtraction.
    q, k, v = make(rng, 2, 4, 2, 130, 64, torch.float16, spread=6.0)
    o = flash_decode(q, k, v, num_splits=3, scale=0.5)
    ref = decode_ref(q, k, v, scale=0.5)
    assert torch.isfinite(o).all()
    assert rel_err(o, ref) < 5e-3


def test_strided_kv_and_inputs_untouched(rng):
    # k, v as (B, N, Hkv, d) buffers viewed as (B, Hkv, N, d): the kernel follows the strides.
    q, k, v = make(rng, 2, 4, 2, 80, 32, torch.float32)
    kb, vb = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    ks, vs = kb.transpose(1, 2), vb.transpose(1, 2)
    assert not ks.is_contiguous()
    snapshot = [x.clone() for x in (q, kb, vb)]
    sl = lens_tensor([80, 33])
    o = flash_decode(q, ks, vs, seq_lens=sl, num_splits=2)
    assert rel_err(o, decode_ref(q, k, v, sl)) < TOL[torch.float32]
    for a, b in zip(snapshot, (q, kb, vb)):
        assert torch.equal(a, b)


def test_choose_num_splits_heuristic():
    # round(2 * 132 / 8) = 33 wanted at batch 1; 512 blocks of 128 keys in splits of ceil(512/33) = 16
    # blocks need only 32 programs (the 33rd would be empty)
    assert choose_num_splits(1, 8, 65536, sms=132) == 32
    assert choose_num_splits(1, 8, 131072 - 128 * 200, sms=132) == 33  # 824 blocks: 25 per split, all used
    assert choose_num_splits(8, 8, 65536, sms=132) == 4
    assert choose_num_splits(32, 8, 65536, sms=132) == 1  # 256 programs already fill 132 SMs
    assert choose_num_splits(1, 8, 1024, sms=132, block_n=64) == 4  # 16 key blocks / 4 per split
    assert choose_num_splits(1, 8, 10, sms=132) == 1


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(seq_lens=[10, 10]), TypeError, "seq_lens must be a torch.Tensor"),
    (dict(seq_lens=torch.tensor([10.0, 10.0])), TypeError, "seq_lens must have dtype"),
    (dict(seq_lens=torch.tensor([10, 10, 10])), ValueError, r"seq_lens must have shape \(B,\)"),
    (dict(seq_lens=torch.tensor([10, 11])), ValueError, r"seq_lens must lie in \[0, 10\]"),
    (dict(seq_lens=torch.tensor([-1, 3])), ValueError, r"seq_lens must lie in \[0, 10\]"),
    (dict(num_splits=0), ValueError, "num_splits must be a positive integer"),
    (dict(num_splits=2.0), TypeError, "num_splits must be a positive integer"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
    (dict(config={"block_n": 64}), TypeError, "config must be a reference.triton.configs.DecodeConfig"),
    (dict(fast_launch=1), TypeError, "fast_launch must be a bool"),
])
def test_bad_options_raise(kwargs, exc, match):
    q = torch.randn(2, 4, 32, device=DEVICE)
    k = torch.randn(2, 2, 10, 32, device=DEVICE)
    v = torch.randn(2, 2, 10, 32, device=DEVICE)
    if isinstance(kwargs.get("seq_lens"), torch.Tensor):
        kwargs = dict(kwargs, seq_lens=kwargs["seq_lens"].to(DEVICE))
    with pytest.raises(exc, match=match):
        flash_decode(q, k, v, **kwargs)


@pytest.mark.parametrize("bad,match", [(dict(block_n=48), "block_n must be a power of two"),
                                       (dict(num_warps=3), "num_warps must be a power of two"),
                                       (dict(num_stages=0), "num_stages must be a positive int"),
                                       (dict(fuse_merge=1), "fuse_merge must be a bool"),
                                       (dict(use_tma=None), "use_tma must be a bool"),
                                       (dict(merge_rows=24), "merge_rows must be a power of two >= 2"),
                                       (dict(merge_rows=1), "merge_rows must be a power of two >= 2")])
def test_decode_config_rejects_bad_fields(bad, match):
    from reference.triton.configs import DecodeConfig
    with pytest.raises(ValueError, match=match):
        DecodeConfig(**bad)


def test_explicit_and_scoped_config_select_the_launch(rng, monkeypatch):
    """``config=`` and ``configs.pinned(decode=...)`` reach the launch (the tile, the merge), the default is the
    pin, and every choice computes the same attention (oracle: float64 torch)."""
    from reference.triton import configs, decode
    from reference.triton.configs import DecodeConfig
    seen = []
    real = decode.launch_config

    def spy(*a, **kw):
        out = real(*a, **kw)
        seen.append(out["block_n"])
        return out
    monkeypatch.setattr(decode, "launch_config", spy)  # a spy on a function, not a configuration
    q, k, v = make(rng, 2, 4, 2, 70, 32, torch.float32)
    sl = lens_tensor([70, int(rng.integers(1, 70))])
    ref = decode_ref(q, k, v, sl)
    small = DecodeConfig(block_n=16, num_warps=4, num_stages=1, fuse_merge=False)
    o1 = flash_decode(q, k, v, seq_lens=sl, num_splits=3, config=small)
    assert seen[-1] == 16
    with configs.pinned(decode=DecodeConfig(block_n=32, num_stages=1)):
        o2 = flash_decode(q, k, v, seq_lens=sl, num_splits=3)
        assert seen[-1] == 32
        o3 = flash_decode(q, k, v, seq_lens=sl, num_splits=3, config=small)  # the argument wins over the scope
        assert seen[-1] == 16
    o4 = flash_decode(q, k, v, seq_lens=sl, num_splits=3)
    assert seen[-1] == configs.DECODE_PINS["fp32"].block_n
    for o in (o1, o2, o3, o4):
        assert rel_err(o, ref) < TOL[torch.float32]


def test_validate_false_clamps_instead_of_reading_out_of_bounds(rng):
    q, k, v = make(rng, 2, 4, 2, 20, 32, torch.float32)
    o = flash_decode(q, k, v, seq_lens=lens_tensor([25, 20]), validate=False)  # 25 > Nmax: clamped to 20
    assert rel_err(o, decode_ref(q, k, v)) < TOL[torch.float32]


def _hopper() -> bool:
    return DEVICE.type == "cuda" and torch.cuda.get_device_capability(DEVICE) >= (9, 0)


@pytest.mark.parametrize("block_n,stages", [(64, 4), (32, 3), (128, 3)])
def test_tma_configs_vs_oracle(rng, block_n, stages):
    """``DecodeConfig(use_tma=True)``: TMA boxes on Hopper, the
    portable pointer path everywhere else (CPU interpreter, older GPUs) -- the same attention either way. Ragged
    lengths put a partial last block in most splits; the cache slots past each length hold NaN, which the TMA
    boxes read (they cover whole blocks) and the kernel must mask out of the scores and zero in V."""
    from reference.triton import decode
    from reference.triton.configs import DecodeConfig
    q, k, v, lens, sl = decode_nan_tails(rng)
    ref = decode_ref(q, k, v, lens)
    cfg = DecodeConfig(block_n, 4, stages, use_tma=True)
    from reference.triton._device import device_limits
    assert decode.tma_ok(q, k, v, False, device_limits(DEVICE)) == _hopper()
    for splits in (1, 5):
        o = flash_decode(q, k, v, seq_lens=sl, num_splits=splits, config=cfg)
        assert torch.isfinite(o.float()).all() and rel_err(o, ref) < TOL[torch.bfloat16], (splits, rel_err(o, ref))
        o2 = flash_decode(q, k, v, seq_lens=sl, num_splits=splits, config=cfg)  # the recorded launch on a GPU
        assert torch.equal(o, o2)
    k2, v2 = k.clone(), v.clone()  # new tensors, same shapes: the recorded launch rebuilds its descriptors
    k2[:, :, :1] *= -1
    o3 = flash_decode(q, k2, v2, seq_lens=sl, num_splits=5, config=cfg)
    assert rel_err(o3, decode_ref(q, k2, v2, lens)) < TOL[torch.bfloat16]
