"""``experiments.decode_variants``: the split-KV decode options measured and not pinned (programmatic dependent launch,
a two-level merge, dynamic splits) against the course's ``flash_decode`` and the float64 oracle; every ticket and chunk
counter back at 0 after the launches. CUDA or the Triton interpreter."""
import dataclasses

import pytest
import torch

from experiments import decode_variants
from experiments.decode_variants import DecodeVariant, flash_decode_variant
from reference.triton import DEVICE, configs, flash_decode
from tests.common import DECODE_TOL as TOL
from tests.common import decode_nan_tails
from tests.common import make_decode as make
from tests.oracle import decode_ref, rel_err

pytestmark = pytest.mark.triton_flash_decode


def lens_tensor(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def variant_of(cfg, **fields) -> DecodeVariant:
    return DecodeVariant(**{**dataclasses.asdict(cfg), **fields})


@pytest.mark.parametrize("hq,hkv,num_splits,fields,tol", [
    # DecodeVariant(merge_group=G): groups of G splits merge first (their own tickets), then the groups; a last
    # group shorter than G (7 = 3 + 3 + 1); G >= num_splits falls back to one level; merge_rows sets the merge
    # tile (rows < group: one split per step). Same sums as the one-level merge, regrouped: 1e-6.
    (8, 2, 7, dict(merge_group=3, merge_rows=8), 1e-6), (32, 1, 9, dict(merge_group=4, merge_rows=64), 1e-6),
    (6, 3, 12, dict(merge_group=5, merge_rows=4), 1e-6), (4, 2, 5, dict(merge_group=8, merge_rows=2), 1e-6),
    # DecodeVariant(dynamic_chunk=C): the programs of a (batch, kv head) draw chunks of C key blocks from a counter
    # (on the interpreter program 0 draws them all; on a GPU the split of the keys changes from call to call), with
    # a one- or two-level merge. The keys are summed in another order: 1e-5 in float32.
    (8, 2, 7, dict(dynamic_chunk=2), 1e-5), (32, 1, 9, dict(dynamic_chunk=1, merge_group=4), 1e-5),
    (6, 3, 4, dict(dynamic_chunk=3), 1e-5)])
def test_merge_options_match_the_default_merge_and_reset_their_counters(rng, hq, hkv, num_splits, fields, tol):
    # Against the default (fixed splits, one-level merge) and float64, with empty splits, an empty row (length
    # 0) and a ragged one; every ticket and chunk counter is back at 0 after the launches (a leftover count
    # would merge too early, or hand the next launch no chunks).
    q, k, v = make(rng, 3, hq, hkv, 333, 32, torch.float32)
    sl = lens_tensor([333, 0, int(rng.integers(1, 333))])
    default = flash_decode(q, k, v, seq_lens=sl, num_splits=num_splits)
    cfg = variant_of(configs.DECODE_PINS["fp32"], **fields)
    for _ in range(2 if DEVICE.type == "cpu" else 50):
        o = flash_decode_variant(q, k, v, seq_lens=sl, num_splits=num_splits, config=cfg)
        assert rel_err(o, default) < tol and torch.all(o[1] == 0)
    assert rel_err(o, decode_ref(q, k, v, sl)) < TOL[torch.float32]
    assert int(sum(b.abs().sum() for key, b in decode_variants._COUNTERS.items() if key[:2] == (o.device.type, o.device.index))) == 0


@pytest.mark.parametrize("block_n,stages", [(64, 4), (32, 3)])
def test_pdl_vs_oracle_and_back_to_back(rng, block_n, stages):
    """``DecodeVariant(pdl=True)`` (with TMA boxes): programmatic dependent launch on Hopper, the plain launch
    elsewhere -- the same attention; cache slots past each length hold NaN (masked out of the scores, zeroed in V);
    on Hopper many back-to-back launches on one stream each wait for the last one's tickets."""
    q, k, v, lens, sl = decode_nan_tails(rng)
    ref = decode_ref(q, k, v, lens)
    cfg = DecodeVariant(block_n, 4, stages, use_tma=True, pdl=True)
    for splits in (1, 5):
        o = flash_decode_variant(q, k, v, seq_lens=sl, num_splits=splits, config=cfg)
        assert torch.isfinite(o.float()).all() and rel_err(o, ref) < TOL[torch.bfloat16], (splits, rel_err(o, ref))
    if DEVICE.type == "cuda" and torch.cuda.get_device_capability(DEVICE) >= (9, 0):
        outs = [flash_decode_variant(q, k, v, seq_lens=sl, num_splits=5, config=cfg) for _ in range(30)]
        assert all(torch.equal(x, outs[0]) for x in outs)


@pytest.mark.parametrize("bad,match", [(dict(pdl=1), "pdl must be a bool"),
                                       (dict(merge_group=1), "merge_group must be 0"),
                                       (dict(merge_group=-2), "merge_group must be 0"),
                                       (dict(merge_group=2.0), "merge_group must be 0"),
                                       (dict(dynamic_chunk=-1), "dynamic_chunk must be an int >= 0"),
                                       (dict(dynamic_chunk=True), "dynamic_chunk must be an int >= 0"),
                                       (dict(dynamic_chunk=2, fuse_merge=False), "dynamic_chunk needs fuse_merge"),
                                       (dict(block_n=48), "block_n must be a power of two")])
def test_decode_variant_rejects_bad_fields(bad, match):
    with pytest.raises(ValueError, match=match):
        DecodeVariant(**bad)


def test_the_course_decode_refuses_a_variant(rng):
    """``flash_decode`` / ``configs.pinned`` take a ``DecodeConfig`` only: a ``DecodeVariant``'s options would be
    ignored there, so it is a ``TypeError`` naming the argument, not a silent plain launch."""
    q, k, v = make(rng, 1, 4, 2, 40, 16, torch.float32)
    with pytest.raises(TypeError, match="config must be a reference.triton.configs.DecodeConfig"):
        flash_decode(q, k, v, config=DecodeVariant(merge_group=2))
    with pytest.raises(TypeError, match="decode must be a DecodeConfig"):
        with configs.pinned(decode=DecodeVariant(pdl=True)):
            pass
