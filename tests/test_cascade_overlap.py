"""The overlapped Hopper cascade (``CascadeConfig.overlap``: the Gluon prefix kernel and the Triton suffix programs
at once, notes/serving_perf.md "Cascade overlap: both passes at once") and the cached prefix descriptors of eager calls:
sm_90a compiles, the split and program-count rules, the config checks and the descriptor cache on the CPU; on an
H100/H200 both overlap modes against a float64 oracle, their recorded eager launches and their CUDA-graph replay."""
from __future__ import annotations

import dataclasses
import gc
import json
import weakref

import pytest
import torch

from reference.triton import INTERPRET, cascade_decode
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
from reference.triton import cascade, configs
c = compile_cascade_prefix(pdl_trigger=True)
out = {"prefix": dict(resource_usage(c), trigger="griddepcontrol.launch_dependents" in c.asm["ptx"])}
c0 = compile_cascade_prefix()
out["prefix_plain"] = {"trigger": "griddepcontrol" in c0.asm["ptx"]}
for ov in (1, 2, 3):
    k = cascade.compile_sm90(prefix_done=True, overlap=ov, rows=64)
    out[f"overlap{ov}"] = dict(resource_usage(k), wait="griddepcontrol.wait" in k.asm["ptx"])
print(json.dumps(out))
"""


@pytest.mark.triton_gluon
@pytest.mark.slow
def test_sm90_compile_of_the_overlap_kernels():
    """sm_90a on the CPU: the prefix kernel with the dependent-launch trigger keeps its resources (168 registers,
    wgmma, TMA, no spills; the plain one has no griddepcontrol); the suffix programs (1), suffix + wait + merge
    (2, with ``griddepcontrol.wait``) and merge-only (3) kernels have no wgmma, two of them fit an SM beside each
    other (registers x 128 threads, shared memory), and spill at most one word (2: 8 B of stack at 168 registers)."""
    out = sm90_compile.run(["-c", _AOT_CHILD], timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    u = json.loads(out.stdout.strip().splitlines()[-1])
    p = u["prefix"]
    assert p["trigger"] and not u["prefix_plain"]["trigger"], u
    assert p["HGMMA"] > 0 and p["UTMALDG"] > 0 and p["registers"] == 168 and p["LDL"] == p["STL"] == 0, p
    assert u["overlap2"]["wait"] and not u["overlap1"]["wait"] and not u["overlap3"]["wait"], u
    assert u["overlap3"]["HMMA"] == 0, u["overlap3"]  # merge only: no key loop
    for name in ("overlap1", "overlap2", "overlap3"):
        k = u[name]
        assert k["HGMMA"] == 0, (name, k)
        assert 2 * k["registers"] * 128 <= 65536 and 2 * k["shared_bytes"] <= 227 * 1024, (name, k)
        assert k["LDL"] <= 1 and k["STL"] <= 1 and k["stack"] <= 8, (name, k)
    assert u["overlap1"]["HMMA"] > 0 and u["overlap2"]["HMMA"] > 0


@pytest.mark.triton_serving
def test_overlap_split_and_program_rules():
    """Half the SMs for the prefix (132 SMs, 8 kv heads, 32k prefix): 8 splits (64 CTAs) at B = 8..32, 4 splits x 2
    tiles at B = 64; the suffix programs: two on each SM left free, at most one per (request, kv head) item."""
    from reference.triton.cascade import overlap_programs
    from reference.triton.hopper.cascade_prefix_gluon import gluon_num_splits, tiles
    assert [gluon_num_splits(B, 4, 8, 32768, 132, 512, 0.5) for B in (8, 16, 32, 64)] == [8, 8, 8, 4]
    assert [8 * gluon_num_splits(B, 4, 8, 32768, 132, 512, 0.75) * tiles(B, 4)[1] for B in (16, 64)] == [96, 96]
    cfg = CascadeConfig()
    assert overlap_programs(8, 8, 64, cfg, sms=132) == 64
    assert overlap_programs(16, 8, 64, cfg, sms=132) == 128
    assert overlap_programs(32, 8, 64, cfg, sms=132) == 136
    assert overlap_programs(32, 8, 64, dataclasses.replace(cfg, overlap_suffix_per_sm=3), sms=132) == 204
    assert overlap_programs(64, 8, 200, cfg, sms=132) == 264  # the prefix fills every SM: all of them
    assert overlap_programs(1, 1, 1, cfg, sms=1) == 1


@pytest.mark.triton_serving
def test_overlap_default_rule():
    """overlap=None: configs.CASCADE_OVERLAP ("pdl", the H100 pin) up to overlap_max_rows = 128 packed rows a kv
    head (B <= 32 at G = 4), the sequential two launches above (B = 64: the prefix on half the SMs is the tail); an
    explicit mode always wins."""
    from reference.triton import configs
    from reference.triton.cascade import overlap_mode
    cfg = CascadeConfig()
    assert configs.CASCADE_OVERLAP == "pdl"
    assert [overlap_mode(cfg, 4 * B) for B in (1, 8, 16, 32, 33, 64)] == ["pdl"] * 4 + ["off"] * 2
    assert overlap_mode(dataclasses.replace(cfg, overlap="streams"), 256) == "streams"
    assert overlap_mode(dataclasses.replace(cfg, overlap="off"), 8) == "off"
    assert overlap_mode(dataclasses.replace(cfg, overlap_max_rows=0), 8) == "off"


@pytest.mark.triton_serving
@pytest.mark.parametrize("kw, match", [
    (dict(overlap="yes"), "CascadeConfig.overlap must be None, 'off', 'pdl' or 'streams'"),
    (dict(overlap=True), "CascadeConfig.overlap must be None"),
    (dict(overlap_prefix_share=0), "overlap_prefix_share must be a number in"),
    (dict(overlap_prefix_share="0.5"), "overlap_prefix_share must be a number in"),
    (dict(overlap_max_rows=-1), "overlap_max_rows must be an int >= 0"),
    (dict(overlap_suffix_per_sm=0), "overlap_suffix_per_sm must be a positive int"),
    (dict(overlap_suffix_per_sm=2.0), "overlap_suffix_per_sm must be a positive int")])
def test_overlap_config_rejects_bad_fields(kw, match):
    with pytest.raises(ValueError, match=match):
        CascadeConfig(**kw)


@pytest.mark.triton_serving
def test_cached_descriptors_rebuild_on_a_new_address_and_hold_no_tensor():
    """``cached_descriptors``: the same prefix tensor gets the same descriptor objects (no per-call construction);
    another tensor of the same shape (another address) gets new ones encoding ITS address; a different box too;
    the cache does not keep a prefix tensor alive."""
    from reference.triton.hopper import cascade_prefix_gluon as cpg
    cpg.clear_descriptor_cache()
    dev = "cpu"  # the descriptor objects are host data: address, shape, strides, box
    a_k, a_v = (torch.zeros(300, 2, 64, dtype=torch.bfloat16, device=dev) for _ in range(2))
    d1 = cpg.cached_descriptors(a_k, a_v, 128)
    d2 = cpg.cached_descriptors(a_k, a_v, 128)
    assert d1[0] is d2[0] and d1[1] is d2[1]
    assert d1[0].base.data_ptr() == a_k.data_ptr() and d1[1].base.data_ptr() == a_v.data_ptr()
    fresh = cpg.descriptors(a_k, a_v, 128)[0]
    assert (list(d1[0].shape), list(d1[0].strides), list(d1[0].block_shape)) == \
        (list(fresh.shape), list(fresh.strides), list(fresh.block_shape)) == ([300, 128], [128, 1], [128, 64])
    assert d1[0].layout == fresh.layout
    b_k = torch.zeros_like(a_k)  # same shape, another address: rebuilt
    e = cpg.cached_descriptors(b_k, a_v, 128)
    assert e[0] is not d1[0] and e[0].base.data_ptr() == b_k.data_ptr() and e[1] is d1[1]
    assert cpg.cached_descriptors(a_k, a_v, 64)[0] is not d1[0]  # another box
    ref = weakref.ref(b_k)
    del b_k, e
    gc.collect()
    assert ref() is None  # the cache holds the address, not the tensor


@pytest.mark.triton_serving
def test_overlap_modes_off_hopper_run_the_triton_kernel(rng):
    """Where the Gluon path does not apply (CPU interpreter, other GPUs) an overlap setting changes nothing: the
    portable one-launch kernel runs and matches the float64 oracle."""
    if HOPPER:
        pytest.skip("checks the portable path")
    suffix = [5, 0, 17]
    dtype = torch.float32 if INTERPRET else torch.float16
    args, ref = _case(rng, 3, 8, 2, 16, 37, suffix, 8, dtype)
    ro, rl = _oracle(ref, suffix, 8)
    from reference.triton import cascade, configs
    base = configs.CASCADE_DEFAULT
    outs = [cascade_decode(*args, config=dataclasses.replace(base, overlap=m), fast_launch=False)
            for m in ("off", "pdl", "streams")]
    for o, lse in outs:
        assert rel_err(o, ro) < (1e-4 if INTERPRET else 5e-3) and lse_err(lse, rl) < 1e-3
        assert torch.equal(o, outs[0][0])


GPU_CASES = [
    (37, 32, 8, 128, 3001, torch.bfloat16, None, 2),  # 148 packed rows: 3 64-row tiles (second CTA half idle)
    (64, 32, 8, 128, 4096, torch.bfloat16, None, 3),
    (5, 16, 2, 64, 777, torch.float16, 3, 2),  # d = 64, 40 packed rows of one tile
    (9, 16, 2, 128, 129, torch.bfloat16, None, 2),  # G = 8; a prefix one key past a block
    (16, 8, 8, 128, 1000, torch.bfloat16, 2, 2)]  # G = 1 (MHA)


@pytest.mark.triton_serving
@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the overlapped Gluon path needs an H100/H200 (sm_90)")
@pytest.mark.parametrize("mode", ["pdl", "streams"])
@pytest.mark.parametrize("B,hq,hkv,d,P,dtype,splits,stages", GPU_CASES)
def test_overlap_matches_float64(rng, mode, B, hq, hkv, d, P, dtype, splits, stages):
    """Random inputs (the oracle in float64 from the rounded values): ragged suffixes of 0 .. 70 tokens on 16-token
    pages, prefixes not a whole number of key blocks, G = 1 / 4 / 8, d = 64 / 128, bf16 / fp16; both overlap modes
    equal the oracle within the sequential Gluon path's error; the recorded eager launches repeat the full path bit
    for bit on new inputs (new prefix addresses: the cached descriptors are rebuilt) and on the recorded ones again."""
    from reference.triton import cascade, configs
    suffix = [int(x) for x in rng.integers(0, 70, B)]
    suffix[0] = 0
    args, ref = _case(rng, B, hq, hkv, d, P, suffix, 16, dtype)
    cfg = dataclasses.replace(configs.CASCADE_DEFAULT, prefix_gluon=True, gluon_stages=stages, overlap=mode)
    o, lse = cascade_decode(*args, num_splits=splits, config=cfg, fast_launch=False)
    torch.cuda.synchronize()
    ro, rl = _oracle(ref, suffix, 16)
    tol = 8e-3 if dtype == torch.bfloat16 else 2e-3
    e_o, e_l = rel_err(o, ro), lse_err(lse, rl)
    o_s, _ = cascade_decode(*args, num_splits=splits, config=dataclasses.replace(cfg, overlap="off"),
                            fast_launch=False)
    assert e_o < tol and e_l < 1e-3, (e_o, e_l)
    assert e_o < 1.5 * rel_err(o_s, ro) + 1e-4, (e_o, rel_err(o_s, ro))
    cascade.clear_launch_cache()
    first = cascade_decode(*args, num_splits=splits, config=cfg, validate=False)
    rec = cascade.LAUNCH_CACHE[next(iter(cascade.LAUNCH_CACHE))]
    assert isinstance(rec, cascade.GluonLaunches) and rec.mode == mode and (rec.merge is not None) == (mode == "streams")
    args2, _ = _case(rng, B, hq, hkv, d, P, suffix, 16, dtype)
    again = cascade_decode(*args2, num_splits=splits, config=cfg, validate=False)  # recorded, new prefix address
    back = cascade_decode(*args, num_splits=splits, config=cfg, validate=False)  # recorded, the first prefix again
    full = cascade_decode(*args2, num_splits=splits, config=cfg, validate=False, fast_launch=False)
    assert len(cascade.LAUNCH_CACHE) == 1
    assert torch.equal(first[0], o) and torch.equal(back[0], o) and torch.equal(back[1], lse)
    assert torch.equal(again[0], full[0]) and torch.equal(again[1], full[1])


@pytest.mark.triton_serving
@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the overlapped Gluon path needs an H100/H200 (sm_90)")
@pytest.mark.parametrize("mode", ["pdl", "streams"])
def test_overlap_in_a_cuda_graph_equals_eager(rng, mode):
    """Captured in a CUDA graph (the serving engine's decode step; "streams" captures a fork/join), replays equal
    the eager call bit for bit, also after the inputs were overwritten in place with new values."""
    from reference.triton import cascade, configs
    B, hq, hkv, d, P = 16, 32, 8, 128, 2500
    suffix = [int(x) for x in rng.integers(0, 70, B)]
    args, _ = _case(rng, B, hq, hkv, d, P, suffix, 16, torch.bfloat16)
    cfg = dataclasses.replace(configs.CASCADE_DEFAULT, prefix_gluon=True, overlap=mode)
    new, _ = _case(rng, B, hq, hkv, d, P, suffix, 16, torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cascade_decode(*args, config=cfg, validate=False)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_g, lse_g = cascade_decode(*args, config=cfg, validate=False)
    for inputs in (args, new):
        for dst, src in zip(args[:5], inputs[:5]):
            dst.copy_(src)
        g.replay()
        torch.cuda.synchronize()
        o_e, lse_e = cascade_decode(*args, config=cfg, validate=False, fast_launch=False)
        assert torch.equal(o_g, o_e) and torch.equal(lse_g, lse_e)


@pytest.mark.triton_serving
@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER, reason="the eager / captured path split exists on an H100/H200 (sm_90) only")
@pytest.mark.parametrize("B", [8, 16])
def test_default_config_eager_warmup_then_capture(rng, B):
    """The serving pattern with the default config at B G = 32 and 64 packed rows: warm up eagerly (the Triton
    kernel, ``eager_gluon_min_rows``), then capture (the Gluon "pdl" path, first launched inside the capture),
    replay with new inputs; both paths against float64 attention of the same rounded inputs."""
    hq, hkv, d, P, bs = 32, 8, 128, 1500, 16
    suffix = [int(x) for x in rng.integers(0, 70, B)]
    args, ref = _case(rng, B, hq, hkv, d, P, suffix, bs, torch.bfloat16)
    new, ref_new = _case(rng, B, hq, hkv, d, P, suffix, bs, torch.bfloat16)
    from reference.triton.cascade import use_gluon_prefix
    assert not use_gluon_prefix(CascadeConfig(), args[0], args[1], args[2], capturing=False)
    assert use_gluon_prefix(CascadeConfig(), args[0], args[1], args[2], capturing=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o_e, lse_e = cascade_decode(*args, validate=False)
    torch.cuda.current_stream().wait_stream(side)
    ro, rl = _oracle(ref, suffix, bs)
    assert rel_err(o_e, ro) < 8e-3 and lse_err(lse_e, rl) < 1e-3
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_g, lse_g = cascade_decode(*args, validate=False)
    for inputs, oracle in ((args, ref), (new, ref_new)):
        for dst, src in zip(args, inputs):  # q, prefix, caches, and the tables (the new case permutes its pages)
            dst.copy_(src)
        g.replay()
        torch.cuda.synchronize()
        ro, rl = _oracle(oracle, suffix, bs)
        assert rel_err(o_g, ro) < 8e-3 and lse_err(lse_g, rl) < 1e-3
