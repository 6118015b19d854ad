"""reference.triton paged_prefill and cascade_decode vs the float64 oracle (in the interpreter without a GPU).

Caches come from ``reference.numpy.paged.PagedKVCache`` with sequences appended in interleaved pieces, so
their blocks are scattered; block sizes smaller than, equal to and not dividing the kernel's key tile.
"""
import dataclasses

import numpy as np
import pytest
import torch

from reference.numpy.paged import PagedKVCache
from reference.triton import DEVICE, INTERPRET, cascade_decode, paged_prefill
from experiments.serving_baselines import cascade_decode_separate
from tests.common import pinned_flash_configs  # noqa: F401  (autouse fixture)
from tests.oracle import attention_ref, lse_err, rel_err

DT = torch.float32 if INTERPRET else torch.float16
TOL = 1e-5 if INTERPRET else 3e-3


def t(x):
    return torch.tensor(np.asarray(x), device=DEVICE)


def build_cache(rng, lens, hkv, d, block_size, num_blocks):
    cache = PagedKVCache(num_blocks, block_size, hkv, d, dtype=np.float32)
    kv = []
    for s, n in enumerate(lens):
        cache.add_sequence(s)
        kv.append((rng.standard_normal((n, hkv, d)).astype(np.float32),
                   rng.standard_normal((n, hkv, d)).astype(np.float32)))
    for lo in range(0, max(lens), 5):
        for s, (k, v) in enumerate(kv):
            cache.append(s, k[lo:lo + 5], v[lo:lo + 5])
    return cache, kv


def cu(lens):
    return t(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))


@pytest.mark.triton_serving
@pytest.mark.parametrize("block_size", [3, 16, 32])
def test_paged_prefill_matches_gathered_attention(rng, block_size):
    lens, chunks, hq, hkv, d = [21, 40, 6, 9], [21, 7, 1, 0], 4, 2, 16
    cache, kv = build_cache(rng, lens, hkv, d, block_size, 80)
    tables, seq_lens = cache.block_tables(range(len(lens)))
    q = rng.standard_normal((sum(chunks), hq, d)).astype(np.float32)
    o, lse = paged_prefill(t(q).to(DT), t(cache.k_cache).to(DT), t(cache.v_cache).to(DT), t(tables), cu(chunks),
                           t(seq_lens))
    assert o.shape == q.shape and lse.shape == (hq, sum(chunks))
    c = np.concatenate([[0], np.cumsum(chunks)])
    for b in range(len(lens)):
        if chunks[b] == 0:
            continue
        sl = slice(c[b], c[b + 1])
        k, v = (torch.tensor(x).to(DT).transpose(0, 1) for x in kv[b])
        ro, rl, _ = attention_ref(torch.tensor(q[sl]).to(DT).transpose(0, 1), k, v, causal=True)
        assert rel_err(o[sl].transpose(0, 1), ro) < TOL and lse_err(lse[:, sl], rl) < TOL


@pytest.mark.triton_serving
def test_paged_prefill_bad_input_raises(rng):
    cache, _ = build_cache(rng, [20], 2, 16, 4, 8)
    tables, seq_lens = cache.block_tables([0])
    q = t(rng.standard_normal((3, 2, 16)).astype(np.float32))
    kc, vc = t(cache.k_cache), t(cache.v_cache)
    short = tables.copy()
    short[0, 4] = -1
    with pytest.raises(ValueError, match=r"block_tables\[0, 4\] = -1 is not a block index"):
        paged_prefill(q, kc, vc, t(short), cu([3]), t(seq_lens))
    with pytest.raises(TypeError, match="q, k_cache, v_cache must have the same dtype"):
        paged_prefill(q, kc.half(), vc, t(tables), cu([3]), t(seq_lens))
    with pytest.raises(ValueError, match="cu_seqlens_q\\[-1\\] must equal the number of packed tokens 3"):
        paged_prefill(q, kc, vc, t(tables), cu([2]), t(seq_lens))


def cascade_case(rng, suffix, P, hq, hkv, d, bs):
    """A shared prefix of ``P`` keys and per-request suffixes of ``suffix[b]`` tokens (0: none) in a paged cache of
    ``bs``-token blocks: ``(q, pk, pv, kv, args)`` with ``args`` the positional arguments of ``cascade_decode``."""
    B = len(suffix)
    cache, kv = build_cache(rng, [max(n, 1) for n in suffix], hkv, d, bs, 64)
    tables, _ = cache.block_tables(range(B))
    pk = rng.standard_normal((P, hkv, d)).astype(np.float32)
    pv = rng.standard_normal((P, hkv, d)).astype(np.float32)
    q = rng.standard_normal((B, hq, d)).astype(np.float32)
    args = (t(q).to(DT), t(pk).to(DT), t(pv).to(DT), t(cache.k_cache).to(DT), t(cache.v_cache).to(DT), t(tables),
            t(np.array(suffix, dtype=np.int32)))
    return q, pk, pv, kv, args


def check_against_full(o, lse, q, pk, pv, kv, suffix, tag=None):
    """Request ``b``'s ``(o, lse)`` equal the float64 oracle's attention over its prefix + suffix keys."""
    for b in range(len(suffix)):
        k = np.concatenate([pk, kv[b][0][:suffix[b]]]).transpose(1, 0, 2)
        v = np.concatenate([pv, kv[b][1][:suffix[b]]]).transpose(1, 0, 2)
        ro, rl, _ = attention_ref(torch.tensor(q[b][:, None]).to(DT), torch.tensor(k).to(DT),
                                  torch.tensor(v).to(DT))
        assert rel_err(o[b], ro[:, 0]) < TOL and lse_err(lse[b], rl[:, 0]) < TOL, (b, tag)


@pytest.mark.triton_serving
@pytest.mark.parametrize("B,P,num_splits", [(3, 50, None), (2, 33, 4), (1, 7, 1), (11, 40, 3)])
def test_cascade_decode_matches_full_attention(rng, B, P, num_splits):
    hq, hkv, d, bs = 4, 2, 16, 8
    suffix = [int(x) for x in rng.integers(1, 30, B)]
    suffix[-1] = 0 if B > 1 else suffix[-1]  # a request with nothing after the prefix
    q, pk, pv, kv, args = cascade_case(rng, suffix, P, hq, hkv, d, bs)
    o, lse = cascade_decode(*args, num_splits=num_splits)
    o_sep, lse_sep = cascade_decode_separate(*args, num_splits=num_splits)  # the three-launch version
    assert rel_err(o, o_sep) < TOL and lse_err(lse, lse_sep) < TOL
    assert o.shape == (B, hq, d) and o.dtype == DT and lse.shape == (B, hq)
    check_against_full(o, lse, q, pk, pv, kv, suffix)


@pytest.mark.triton_serving
def test_cascade_backend_argument_names_the_kernel(rng):
    """``backend="triton"`` is the one-launch Triton kernel everywhere (the float64 oracle, and the same bits as
    "auto" where "auto" picks it); ``"gluon"`` off a Hopper GPU, an unknown name, or a backend that contradicts
    ``CascadeConfig.prefix_gluon`` raise ``ValueError`` naming the reason instead of falling back."""
    from reference.triton import cascade
    from reference.triton.configs import CASCADE_DEFAULT
    suffix = [5, 0, 17]
    q, pk, pv, kv, args = cascade_case(rng, suffix, 40, 4, 2, 16, 8)
    o, lse = cascade_decode(*args, backend="triton")
    check_against_full(o, lse, q, pk, pv, kv, suffix)
    hopper = cascade.gluon_prefix_reason(args[0], args[1], args[2]) is None
    if not hopper:
        o_auto, lse_auto = cascade_decode(*args)
        assert torch.equal(o, o_auto) and torch.equal(lse, lse_auto)
        with pytest.raises(ValueError, match="backend='gluon' .*needs"):
            cascade_decode(*args, backend="gluon")
    with pytest.raises(ValueError, match="backend must be one of"):
        cascade_decode(*args, backend="cuda")
    with pytest.raises(ValueError, match="contradicts CascadeConfig.prefix_gluon"):
        cascade_decode(*args, backend="triton", config=dataclasses.replace(CASCADE_DEFAULT, prefix_gluon=True))


@pytest.mark.triton_serving
def test_cascade_bad_input_raises(rng):
    cache, _ = build_cache(rng, [5], 2, 16, 4, 8)
    tables, lens = cache.block_tables([0])
    q = t(rng.standard_normal((1, 2, 16)).astype(np.float32))
    kc, vc = t(cache.k_cache), t(cache.v_cache)
    z = torch.zeros((4, 2, 16), device=DEVICE)
    with pytest.raises(ValueError, match="prefix_k must have shape \\(P, Hkv, d\\)"):
        cascade_decode(q, z[:0], z[:0], kc, vc, t(tables), t(lens))
    with pytest.raises(TypeError, match="prefix_k must have dtype|q, prefix_k, prefix_v must have the same dtype"):
        cascade_decode(q, z.half(), z, kc, vc, t(tables), t(lens))
    with pytest.raises(ValueError, match="seq_lens must lie in"):
        cascade_decode(q, z, z, kc, vc, t(tables), t(np.array([99], dtype=np.int32)))


@pytest.mark.triton_serving
@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="recorded launches exist on a GPU only (the interpreter has no compiled kernel)")
def test_recorded_launch_matches_full_path(rng):
    """A second call with the same shapes goes through the recorded launch and still computes on ITS inputs."""
    from reference.triton import decode_serving, flash_decode, paged_decode
    decode_serving.clear_launch_cache()
    B, hq, hkv, n, d, bs = 2, 8, 2, 300, 64, 16

    def inputs():
        q = torch.randn(B, hq, d, device=DEVICE, dtype=torch.float16)
        k = torch.randn(B, hkv, n, d, device=DEVICE, dtype=torch.float16)
        return q, k, torch.randn_like(k)
    sets = [inputs() for _ in range(3)]
    lens = torch.tensor([n, 77], dtype=torch.int32, device=DEVICE)
    fast = [flash_decode(q, k, v, seq_lens=lens, validate=False) for q, k, v in sets]
    assert len(decode_serving.LAUNCH_CACHE) == 1
    slow = [flash_decode(q, k, v, seq_lens=lens, validate=False, fast_launch=False) for q, k, v in sets]
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
    assert len(decode_serving.LAUNCH_CACHE) == 1  # fast_launch=False records nothing
    from reference.triton.configs import DecodeConfig
    other = DecodeConfig(block_n=32, num_warps=4, num_stages=2, fuse_merge=False)
    for q, k, v in sets:  # another config is another recorded launch, never the first one's
        assert torch.equal(flash_decode(q, k, v, seq_lens=lens, validate=False, config=other, num_splits=3),
                           flash_decode(q, k, v, seq_lens=lens, validate=False, config=other, num_splits=3,
                                        fast_launch=False))
    table = torch.arange(B * 19, device=DEVICE, dtype=torch.int32).view(B, 19)
    kc = torch.randn(B * 19, bs, hkv, d, device=DEVICE, dtype=torch.float16)
    vc = torch.randn_like(kc)
    outs = [paged_decode(q, kc * i, vc, table, lens, validate=False) for i, (q, _, _) in enumerate(sets, 1)]
    for i, (q, _, _) in enumerate(sets, 1):
        assert torch.equal(outs[i - 1], paged_decode(q, kc * i, vc, table, lens, validate=False, fast_launch=False))
    with pytest.raises(ValueError, match="seq_lens must lie in"):  # value checks still run on the fast path
        flash_decode(*sets[0], seq_lens=lens + 1000)


@pytest.mark.triton_serving
@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="recorded launches exist on a GPU only (the interpreter has no compiled kernel)")
def test_cascade_recorded_launch_matches_full_path():
    """cascade_decode's second eager call with the same shapes repeats the recorded launch on ITS inputs."""
    from reference.triton import cascade
    cascade.clear_launch_cache()
    B, hq, hkv, d, bs, P = 5, 8, 2, 64, 16, 300
    table = torch.arange(B * 4, device=DEVICE, dtype=torch.int32).view(B, 4)
    lens = torch.tensor([64, 0, 17, 50, 3], dtype=torch.int32, device=DEVICE)

    def inputs():
        return (torch.randn(B, hq, d, device=DEVICE, dtype=torch.float16),
                torch.randn(P, hkv, d, device=DEVICE, dtype=torch.float16),
                torch.randn(P, hkv, d, device=DEVICE, dtype=torch.float16),
                torch.randn(B * 4, bs, hkv, d, device=DEVICE, dtype=torch.float16),
                torch.randn(B * 4, bs, hkv, d, device=DEVICE, dtype=torch.float16))
    sets = [inputs() for _ in range(3)]
    fast = [cascade_decode(*s, table, lens, validate=False) for s in sets]
    assert len(cascade.LAUNCH_CACHE) == 1
    for s, (o, lse) in zip(sets, fast):
        o2, lse2 = cascade_decode(*s, table, lens, validate=False, fast_launch=False)
        assert torch.equal(o, o2) and torch.equal(lse, lse2)
    assert len(cascade.LAUNCH_CACHE) == 1
    with pytest.raises(ValueError, match="seq_lens must lie in"):  # value checks still run on the fast path
        cascade_decode(*sets[0], table, lens + 1000)


@pytest.mark.triton_serving
def test_cascade_bad_input_after_a_recorded_call_raises(rng):
    """Once a call's launch is recorded (GPU), a bad call with the same shapes still gets the full path's named
    error and writes nothing: a dtype, a shape, a device, a non-bool flag or an unhashable option is not the
    recorded key; bad table values are checked on the recorded path too (interpreter: the same errors)."""
    from reference.triton import cascade
    cascade.clear_launch_cache()
    cache, _ = build_cache(rng, [5, 9], 2, 16, 4, 8)
    tables, lens = cache.block_tables([0, 1])
    table, sl = t(tables), t(lens)
    q = t(rng.standard_normal((2, 4, 16)).astype(np.float32)).to(DT)
    kc, vc = t(cache.k_cache).to(DT), t(cache.v_cache).to(DT)
    pk, pv = (t(rng.standard_normal((6, 2, 16)).astype(np.float32)).to(DT) for _ in range(2))
    o, lse = cascade_decode(q, pk, pv, kc, vc, table, sl)
    o2, lse2 = cascade_decode(q, pk, pv, kc, vc, table, sl)  # the recorded launch on a GPU
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    assert len(cascade.LAUNCH_CACHE) == (0 if INTERPRET else 1)
    with pytest.raises(TypeError, match="q, prefix_k, prefix_v must have the same dtype|prefix_k must have dtype"):
        cascade_decode(q, pk.float() if DT != torch.float32 else pk.half(), pv, kc, vc, table, sl)
    with pytest.raises(ValueError, match="prefix_k and prefix_v must have the same shape"):
        cascade_decode(q, pk, pv[:5], kc, vc, table, sl)
    with pytest.raises(ValueError, match="block_tables must have shape"):
        cascade_decode(q, pk, pv, kc, vc, table[:1], sl)
    with pytest.raises(TypeError, match="block_tables"):
        cascade_decode(q, pk, pv, kc, vc, table.float(), sl)
    with pytest.raises(ValueError, match="seq_lens must lie in"):
        cascade_decode(q, pk, pv, kc, vc, table, sl + 1000)
    with pytest.raises(ValueError, match="is not a block index"):
        cascade_decode(q, pk, pv, kc, vc, table + 1000, sl)
    with pytest.raises(TypeError, match="validate must be a bool"):
        cascade_decode(q, pk, pv, kc, vc, table, sl, validate=1)
    with pytest.raises(TypeError, match="fast_launch must be a bool"):
        cascade_decode(q, pk, pv, kc, vc, table, sl, fast_launch="yes")
    with pytest.raises((TypeError, ValueError), match="num_splits"):
        cascade_decode(q, pk, pv, kc, vc, table, sl, num_splits=[2])
    if not INTERPRET:
        with pytest.raises((TypeError, ValueError), match="q"):
            cascade_decode(q.cpu(), pk, pv, kc, vc, table, sl)
    assert len(cascade.LAUNCH_CACHE) == (0 if INTERPRET else 1)  # no bad call recorded anything


@pytest.mark.triton_serving
def test_cascade_num_splits_one_prefix_program_per_sm_and_key_cap():
    """The split rule of cascade_decode: about one prefix program per SM, at most max_split_keys keys a split."""
    import dataclasses
    from reference.triton.cascade import CascadeConfig, cascade_num_splits
    cfg = CascadeConfig(rows=64, min_split_keys=512, programs_per_sm=1, max_split_keys=4096)
    assert cascade_num_splits(8, 4, 8, 32768, cfg, sms=132) == 16  # one 32-row tile x 8 heads: 132 / 8
    assert cascade_num_splits(64, 4, 8, 32768, cfg, sms=132) == 8  # 4 tiles: 132 / 32 = 4, capped: 32768 / 4096
    assert cascade_num_splits(64, 4, 8, 32768, dataclasses.replace(cfg, max_split_keys=2048), sms=132) == 16
    assert cascade_num_splits(64, 4, 8, 32768, dataclasses.replace(cfg, max_split_keys=1 << 30), sms=132) == 4
    assert cascade_num_splits(8, 4, 8, 1000, cfg, sms=132) == 1  # chunks of at least min_split_keys


@pytest.mark.triton_serving
@pytest.mark.parametrize("prefix_first,use_tma", [(True, False), (False, True), (True, True)])
def test_cascade_launch_order_and_tma_prefix_match_full_attention(rng, prefix_first, use_tma):
    """``CascadeConfig(prefix_first=..., use_tma=...)``: the 1-D grid with every prefix item first and the TMA
    prefix loads (Hopper; the pointer loads elsewhere) compute the same attention: several row tiles (B G > rows),
    several kv heads and prefix chunks, a prefix that ends inside a key block, an empty suffix."""
    import dataclasses
    from reference.triton.configs import CASCADE_DEFAULT, CascadeConfig
    base = CASCADE_DEFAULT if INTERPRET else CascadeConfig(rows=16, block_n=32, num_stages=2, min_split_keys=32)
    cfg = dataclasses.replace(base, prefix_first=prefix_first, use_tma=use_tma)
    B, hq, hkv, d, bs, P = 7, 8, 2, 16 if INTERPRET else 64, 8, 83 if INTERPRET else 1000
    suffix = [int(x) for x in rng.integers(1, 20, B)]
    suffix[2] = 0
    q, pk, pv, kv, args = cascade_case(rng, suffix, P, hq, hkv, d, bs)
    for splits in (None, 3):
        o, lse = cascade_decode(*args, num_splits=splits, config=cfg)
        o2, lse2 = cascade_decode(*args, num_splits=splits, config=cfg)  # the recorded launch on a GPU
        assert torch.equal(o, o2) and torch.equal(lse, lse2)
        check_against_full(o, lse, q, pk, pv, kv, suffix, splits)


@pytest.mark.triton_serving
@pytest.mark.parametrize("field", ["prefix_first", "use_tma"])
def test_cascade_config_rejects_non_bool_flags(field):
    from reference.triton.cascade import CascadeConfig
    with pytest.raises(ValueError, match=f"CascadeConfig.{field} must be a bool"):
        CascadeConfig(**{field: 1})


@pytest.mark.triton_serving
def test_cascade_prefix_first_rule():
    """prefix_first=None: prefix items first exactly when the prefix programs fit one per SM (32k prefix,
    H100: B=8 and B=16 have 1 tile x 16 splits x 8 heads = 128 <= 132; B=32 and B=64 have 256 and 512)."""
    from reference.triton.cascade import CascadeConfig, cascade_num_splits, prefix_first_order
    cfg = CascadeConfig()
    for B, want in ((8, True), (16, True), (32, False), (64, False)):
        tiles = -(-B * 4 // min(64, 1 << (B * 4 - 1).bit_length()))
        n_prefix = tiles * cascade_num_splits(B, 4, 8, 32768, cfg, sms=132) * 8
        assert prefix_first_order(n_prefix, cfg, sms=132) is want, (B, n_prefix)
    assert prefix_first_order(10 ** 6, CascadeConfig(prefix_first=True), sms=132) is True
    assert prefix_first_order(1, CascadeConfig(prefix_first=False), sms=132) is False


_AOT_CHILD = """
import json
from reference.triton.hopper._aot import resource_usage
from experiments.decode_variants import compile_variant
from reference.triton import cascade, serving_aot
out = {}
for name, c in (("cascade", cascade.compile_sm90()),
                ("cascade_tma", cascade.compile_sm90(prefix_first=True, use_tma=True)),
                ("decode", serving_aot.compile_decode()),
                ("decode_tma_pdl", compile_variant(pdl=True, num_stages=3, use_tma=True)),
                ("decode_two_level", compile_variant(merge_group=16, merge_rows=32))):
    out[name] = dict(resource_usage(c), griddep="griddepcontrol" in c.asm["ptx"])
print(json.dumps(out))
"""


@pytest.mark.triton_serving
@pytest.mark.slow
def test_sm90_compiles_wgmma_prefix_tiles_tma_and_pdl():
    """Compiled for sm_90a on the CPU (``cascade.compile_sm90``, ``serving_aot.compile_decode``): the cascade's 64-row prefix tiles run on
    wgmma (HGMMA; the 16-row suffix tiles on mma.sync), the TMA options issue bulk tensor copies (UTMALDG), PDL
    emits griddepcontrol, and nothing spills (notes/serving_perf.md, "Decode at 32k and the one-launch cascade")."""
    import json
    from tests import sm90_compile
    out = sm90_compile.run(["-c", _AOT_CHILD], timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    u = json.loads(out.stdout.strip().splitlines()[-1])
    for name, usage in u.items():
        assert usage["LDL"] == 0 and usage["STL"] == 0 and usage["stack"] == 0, (name, usage)
        assert usage["shared_bytes"] <= 232448, (name, usage)
    assert u["cascade"]["HGMMA"] > 0 and u["cascade"]["HMMA"] > 0 and u["cascade"]["UTMALDG"] == 0, u["cascade"]
    assert u["cascade_tma"]["UTMALDG"] > 0 and u["cascade_tma"]["HGMMA"] > 0, u["cascade_tma"]
    assert u["decode"]["UTMALDG"] == 0 and not u["decode"]["griddep"], u["decode"]
    assert u["decode_tma_pdl"]["UTMALDG"] > 0 and u["decode_tma_pdl"]["griddep"], u["decode_tma_pdl"]
    # the merge tile sets the registers (ncu: 165 with 128 rows, 86 with the merge as its own kernel)
    assert u["decode_two_level"]["registers"] < 110 < u["decode"]["registers"], (u["decode"], u["decode_two_level"])
