"""The Hopper cascade prefix pass (``reference.triton.hopper.cascade_prefix_gluon``, selected by
``CascadeConfig.prefix_gluon``): sm_90a compile on the CPU, the selection rule and its errors, and on an H100/H200
the whole cascade (Gluon prefix launch + Triton suffix/merge launch) against a float64 oracle."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from reference.triton import DEVICE, INTERPRET, cascade_decode
from reference.triton.cascade import CascadeConfig
from tests.common import cascade_case as _case
from tests.common import cascade_oracle as _oracle
from tests.oracle import lse_err, rel_err
from tests import sm90_compile

HOPPER = torch.cuda.is_available() and not INTERPRET and torch.cuda.get_device_capability() == (9, 0)

_AOT_CHILD = """
import json
from reference.triton.hopper._aot import resource_usage
from reference.triton.hopper.cascade_prefix_gluon import compile_cascade_prefix
out = {}
for name, kw in (("g4_d128_s2", {}), ("g4_d128_s3", dict(stages=3)), ("g8_d64", dict(group=8, head_dim=64))):
    c = compile_cascade_prefix(**kw)
    out[name] = dict(resource_usage(c), named_bar_128="bar.sync \\t2, 128;" in c.asm["ptx"])
from reference.triton import cascade, configs
out_t = {"suffix_merge": resource_usage(cascade.compile_sm90(prefix_done=True)),
         "one_launch": resource_usage(cascade.compile_sm90())}
print(json.dumps([out, out_t]))
"""


@pytest.mark.triton_gluon
@pytest.mark.slow
def test_sm90_compile_runs_on_wgmma_tma_and_warp_specialised_without_spills():
    """Compiled for sm_90a on the CPU: wgmma (HGMMA, no mma.sync), TMA loads, setmaxnreg budgets (168 registers
    a thread kernel-wide), a named barrier of one warpgroup (128 threads) before its Q tile is read, no spills,
    shared memory within a CTA's 227 KiB (3 stages at d = 128 fit: 229,688 B). The Triton kernel's suffix-and-merge
    launch that follows (``PREFIX_DONE``) compiles without the prefix tiles."""
    out = sm90_compile.run(["-c", _AOT_CHILD], timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    u, t = json.loads(out.stdout.strip().splitlines()[-1])
    # the suffix-and-merge kernel after it: no prefix tiles compiled (no wgmma), mma.sync suffix tiles, no spills
    assert t["suffix_merge"]["HGMMA"] == 0 and t["suffix_merge"]["HMMA"] > 0, t
    assert t["suffix_merge"]["LDL"] == 0 and t["suffix_merge"]["STL"] == 0, t
    assert t["one_launch"]["HGMMA"] > 0, t
    for name, usage in u.items():
        assert usage["HGMMA"] > 0 and usage["HMMA"] == 0 and usage["UTMALDG"] > 0, (name, usage)
        assert usage["LDL"] == 0 and usage["STL"] == 0 and usage["stack"] == 0, (name, usage)
        assert usage["USETMAXREG"] > 0 and usage["registers"] == 168, (name, usage)
        assert usage["shared_bytes"] <= 227 * 1024 and usage["named_bar_128"], (name, usage)
    assert u["g4_d128_s3"]["shared_bytes"] > u["g4_d128_s2"]["shared_bytes"]


@pytest.mark.triton_serving
def test_split_rule_and_tiles():
    """One CTA per SM: 132 SMs, 8 kv heads, 32k prefix: B = 8..32 (one 128-row tile) -> 16 splits, B = 64 (two
    tiles) -> 8; never below min_split_keys keys a split."""
    from reference.triton.hopper.cascade_prefix_gluon import gluon_num_splits, tiles
    assert tiles(8, 4) == (1, 1) and tiles(16, 4) == (1, 1) and tiles(32, 4) == (2, 1) and tiles(64, 4) == (4, 2)
    assert tiles(17, 4) == (2, 1) and tiles(33, 4) == (3, 2)
    assert [gluon_num_splits(B, 4, 8, 32768, 132, 512) for B in (8, 16, 32, 64)] == [16, 16, 16, 8]
    assert gluon_num_splits(64, 4, 8, 1000, 132, 512) == 1


@pytest.mark.triton_serving
@pytest.mark.parametrize("kw, match", [
    (dict(prefix_gluon=1), "CascadeConfig.prefix_gluon must be a bool or None"),
    (dict(gluon_min_rows=0), "CascadeConfig.gluon_min_rows must be a positive int"),
    (dict(eager_gluon_min_rows=2.5), "CascadeConfig.eager_gluon_min_rows must be a positive int"),
    (dict(gluon_block_n=32), "gluon_block_n / gluon_stages: .*block_n must be one of"),
    (dict(gluon_stages=5), "gluon_block_n / gluon_stages: .*stages must be one of")])
def test_config_rejects_bad_fields(kw, match):
    with pytest.raises(ValueError, match=match):
        CascadeConfig(**kw)


@pytest.mark.triton_serving
@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the Gluon prefix pass needs an H100/H200 (sm_90)")
@pytest.mark.parametrize("B,hq,hkv,d,P,dtype,splits,stages", [
    (37, 32, 8, 128, 3001, torch.bfloat16, None, 2),  # 148 packed rows: 3 64-row tiles (second CTA half idle)
    (64, 32, 8, 128, 4096, torch.bfloat16, 5, 3),
    (5, 16, 2, 64, 777, torch.float16, 3, 2),  # d = 64, 40 packed rows of one tile
    (9, 16, 2, 128, 129, torch.bfloat16, None, 2),  # G = 8; a prefix one key past a block
    (16, 8, 8, 128, 1000, torch.bfloat16, 2, 2)])  # G = 1 (MHA)
def test_gluon_cascade_matches_float64(rng, B, hq, hkv, d, P, dtype, splits, stages):
    """Random inputs (rounded to the kernel's dtype; the oracle computes in float64 from the rounded values):
    ragged suffixes of 0 .. 70 tokens on 16-token pages, the prefix not a whole number of key blocks, an odd
    count of 64-row tiles; the Gluon path equals the oracle within bf16/fp16 rounding and the Triton path's error;
    its recorded eager launch repeats it bit for bit on new inputs."""
    from reference.triton import cascade, configs
    suffix = [int(x) for x in rng.integers(0, 70, B)]
    suffix[0] = 0
    args, ref = _case(rng, B, hq, hkv, d, P, suffix, 16, dtype)
    cfg = dataclasses.replace(configs.CASCADE_DEFAULT, prefix_gluon=True, gluon_stages=stages)
    o, lse = cascade_decode(*args, num_splits=splits, config=cfg, fast_launch=False)
    ro, rl = _oracle(ref, suffix, 16)
    tol = 8e-3 if dtype == torch.bfloat16 else 2e-3
    e_o, e_l = rel_err(o, ro), lse_err(lse, rl)
    o_t, lse_t = cascade_decode(*args, num_splits=splits, config=dataclasses.replace(cfg, prefix_gluon=False),
                                fast_launch=False)
    assert e_o < tol and e_l < 1e-3, (e_o, e_l)
    assert e_o < 2 * rel_err(o_t, ro) + 1e-3, (e_o, rel_err(o_t, ro))
    cascade.clear_launch_cache()
    first = cascade_decode(*args, num_splits=splits, config=cfg, validate=False)
    assert isinstance(cascade.LAUNCH_CACHE[next(iter(cascade.LAUNCH_CACHE))], tuple)  # two recorded launches
    args2, ref2 = _case(rng, B, hq, hkv, d, P, suffix, 16, dtype)
    again = cascade_decode(*args2, num_splits=splits, config=cfg, validate=False)  # the recorded launches
    full = cascade_decode(*args2, num_splits=splits, config=cfg, validate=False, fast_launch=False)
    assert torch.equal(first[0], o) and torch.equal(again[0], full[0]) and torch.equal(again[1], full[1])


@pytest.mark.triton_serving
@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the selection rule's Hopper side")
def test_auto_selection_on_hopper(rng):
    """prefix_gluon=None: Gluon from gluon_min_rows packed rows a kv head on; prefix_gluon=True with a group that
    does not divide 64 is refused by name."""
    from reference.triton.cascade import use_gluon_prefix
    cfg = CascadeConfig()
    pk = torch.zeros(64, 8, 128, device=DEVICE, dtype=torch.bfloat16)
    # the defaults measured on the H100: B G >= 32 under graph capture, >= 256 in an eager call
    for B, graph, eager in ((4, False, False), (7, False, False), (8, True, False), (16, True, False),
                            (63, True, False), (64, True, True)):
        q = torch.zeros(B, 32, 128, device=DEVICE, dtype=torch.bfloat16)
        assert use_gluon_prefix(cfg, q, pk, pk, capturing=True) is graph
        assert use_gluon_prefix(cfg, q, pk, pk, capturing=False) is eager
        assert use_gluon_prefix(cfg, q, pk, pk) is eager  # this test runs eagerly
    q = torch.zeros(16, 32, 128, device=DEVICE, dtype=torch.bfloat16)
    assert use_gluon_prefix(dataclasses.replace(cfg, eager_gluon_min_rows=1), q, pk, pk, capturing=False)
    q = torch.zeros(4, 24, 128, device=DEVICE, dtype=torch.bfloat16)  # G = 3
    assert use_gluon_prefix(cfg, q, pk, pk) is False
    with pytest.raises(ValueError, match="prefix_gluon=True needs"):
        use_gluon_prefix(dataclasses.replace(cfg, prefix_gluon=True), q, pk, pk)


@pytest.mark.triton_serving
@pytest.mark.skipif(HOPPER, reason="checks the error raised where no Hopper GPU runs the kernel")
def test_prefix_gluon_true_without_hopper_is_named(rng):
    """prefix_gluon=True on the CPU / another GPU: a ValueError naming the requirement, before any launch."""
    args, _ = _case(rng, 2, 4, 2, 16, 20, [3, 0], 8, torch.float32 if INTERPRET else torch.float16)
    with pytest.raises(ValueError, match="prefix_gluon=True needs"):
        cascade_decode(*args, config=CascadeConfig(prefix_gluon=True))
