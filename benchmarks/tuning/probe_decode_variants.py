"""What limits batch-1 decode at 32k and the cascade (one GPU call).

    python3 -m benchmarks.tuning.probe_decode_variants --out DIR        # DIR/<gpu>-decode-probe.json

bf16, Hq=32, Hkv=8, d=128, the shapes of ``bench_decode`` / ``bench_mixed_batch`` and their timing
(``_common.graph_ms``: CUDA-graph replays over input sets >= 3x L2; the cascade's one set per graph as in
``bench_mixed_batch``), copy bandwidth measured in the same run:

* read ceiling: a kernel that only streams the 134 MB of K/V of a B=1 32k decode (256 programs, the same split
  as ``flash_decode``; pointer loads or TMA boxes; with and without programmatic dependent launch) and a torch
  copy of the same bytes: the fastest one launch of these bytes can be in this measurement;
* decode B=1 32k: ``DecodeConfig`` variants (pointer / TMA loads, key block, stages, PDL), graph time and the
  kernel time from the profiler;
* cascade, 32k prefix + 1k suffixes, B = 8..64: ``CascadeConfig`` variants (launch order, TMA prefix loads).

Every variant is checked before timing (decode: a float64 torch oracle; cascade: ``paged_decode`` over the
whole sequences and, at B=8, a float64 oracle); a failing variant is recorded, not fatal.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from benchmarks import _serving_cases as cases
from benchmarks import _common, write_json
from benchmarks.course.read_ceiling import read_ceiling_ms
from experiments.decode_variants import DecodeVariant, flash_decode_variant
from reference.triton import DEVICE, cascade_decode, flash_decode, paged_decode
from reference.triton.cascade import CascadeConfig
from reference.triton.configs import DecodeConfig


HQ, HKV, D = 32, 8, 128


def read_probe(sets, splits, block_n, stages, use_tma, pdl):
    """The stream kernel of ``benchmarks.course.read_ceiling`` (PDL: the copy of this probe's first run had a
    ``launch_pdl`` variant, measured no different: 56.0 vs 55.8 us pointer, 51.1 vs 51.3 us TMA)."""
    if pdl:
        raise ValueError("the PDL variant of the stream kernel is not kept (measured no different)")
    return read_ceiling_ms([(s[1], s[2]) for s in sets], splits, use_tma, block_n, stages)


def oracle_decode(q, k, v):
    """float64 softmax(q k^T / sqrt(d)) v with GQA, q (B, Hq, d), k/v (B, Hkv, N, d)."""
    B, hq, d = q.shape
    g = hq // k.shape[1]
    qg = q.double().view(B, k.shape[1], g, d)
    s = torch.einsum("bhgd,bhnd->bhgn", qg, k.double()) / math.sqrt(d)
    return torch.einsum("bhgn,bhnd->bhgd", torch.softmax(s, -1), v.double()).reshape(B, hq, d)


DECODE_VARIANTS = {
    "ptr_64_4_4": DecodeConfig(64, 4, 4),
    "tma_64_4_4": DecodeConfig(64, 4, 4, use_tma=True),
    "tma_64_4_3": DecodeConfig(64, 4, 3, use_tma=True),
    "tma_64_4_5": DecodeConfig(64, 4, 5, use_tma=True),
    "tma_128_8_3": DecodeConfig(128, 8, 3, use_tma=True),
    "tma_32_4_6": DecodeConfig(32, 4, 6, use_tma=True),
    "ptr_64_4_4_pdl": DecodeVariant(64, 4, 4, pdl=True),
    "tma_64_4_4_pdl": DecodeVariant(64, 4, 4, use_tma=True, pdl=True),
    "ptr_64_4_4_unfused_pdl": DecodeVariant(64, 4, 4, fuse_merge=False, pdl=True),
}


def decode_section(log, copy_bw, res):
    B, N = 1, 32768
    kv_bytes = 2 * B * HKV * N * D * 2
    sets = [cases.inputs(B, N) for _ in range(cases.n_sets(kv_bytes))]
    res["decode_input_sets"] = len(sets)
    ref = oracle_decode(*sets[0])
    # the read ceiling first
    res["read_ceiling"] = {}
    for name, (splits, bn, st, tma, pdl) in {"ptr_256prog": (32, 64, 4, False, False),
                                              "tma_256prog": (32, 64, 4, True, False),
                                              "ptr_128prog": (16, 64, 4, False, False),
                                              "tma_512prog": (64, 64, 4, True, False),
                                              }.items():
        try:
            ms = read_probe(sets, splits, bn, st, tma, pdl)
            res["read_ceiling"][name] = dict(us=ms * 1e3, frac_copy=kv_bytes / (ms * 1e-3) / copy_bw)
            log(f"  read ceiling {name}: {ms * 1e3:.1f} us = {kv_bytes / (ms * 1e-3) / copy_bw:.3f} of copy")
        except Exception as exc:  # noqa: BLE001
            res["read_ceiling"][name] = dict(error=repr(exc)[:300])
            log(f"  read ceiling {name} failed: {exc!r}"[:300])
    half = [(torch.empty(kv_bytes // 4, device=DEVICE, dtype=torch.bfloat16),
             torch.empty(kv_bytes // 4, device=DEVICE, dtype=torch.bfloat16)) for _ in range(len(sets))]
    ms = _common.graph_ms([(lambda a, b: (lambda: b.copy_(a)))(*x) for x in half])
    res["read_ceiling"]["torch_copy_same_bytes"] = dict(us=ms * 1e3, frac_copy=kv_bytes / (ms * 1e-3) / copy_bw)
    log(f"  torch copy of {kv_bytes / 2e6:.0f} MB -> {kv_bytes / 2e6:.0f} MB: {ms * 1e3:.1f} us")
    del half
    res["decode"] = {}
    for name, cfg in DECODE_VARIANTS.items():
        row = {}
        # the options not pinned run on the experiment's kernel (Triton's launch path each call: no recorded launch)
        variant = isinstance(cfg, DecodeVariant)
        run = flash_decode_variant if variant else flash_decode
        try:
            out = run(*sets[0], validate=False, config=cfg, **({} if variant else dict(fast_launch=False)))
            row["rel_err_vs_fp64"] = float((out.double() - ref).norm() / ref.norm())
            assert row["rel_err_vs_fp64"] < 1e-2, row
            fns = [(lambda x: (lambda: run(*x, validate=False, config=cfg)))(x) for x in sets]
            for _ in range(3):
                ms = _common.graph_ms(fns)
                row.setdefault("us_graph", []).append(ms * 1e3)
            out2 = run(*sets[0], validate=False, config=cfg)  # after replays (a recorded launch where there is one)
            row["rel_err_after"] = float((out2.double() - ref).norm() / ref.norm())
            assert row["rel_err_after"] < 1e-2, row
            row["frac_copy_graph"] = kv_bytes / (min(row["us_graph"]) * 1e-6) / copy_bw
            row["kernels_us"] = _common.kernel_us(fns[0])
            log(f"  decode {name}: graph {' '.join(f'{t:.1f}' for t in row['us_graph'])} us "
                f"({row['frac_copy_graph']:.3f} of copy), kernels {row['kernels_us']}, err {row['rel_err_vs_fp64']:.1e}")
        except Exception as exc:  # noqa: BLE001
            row["error"] = repr(exc)[:400]
            log(f"  decode {name} failed: {exc!r}"[:400])
        res["decode"][name] = row
    del sets


CASCADE_VARIANTS = {
    "base": CascadeConfig(prefix_first=False),  # the (item, kv head) grid: the default before prefix_first
    "prefix_first": CascadeConfig(prefix_first=True),
    "tma": CascadeConfig(prefix_first=False, use_tma=True),
    "prefix_first_tma": CascadeConfig(prefix_first=True, use_tma=True),
    "prefix_first_tma_2st": CascadeConfig(prefix_first=True, use_tma=True, num_stages=2),
    "prefix_first_tma_4st": CascadeConfig(prefix_first=True, use_tma=True, num_stages=4),
}


def cascade_oracle(c, B, P, S):
    q = c["q"].double()
    out = torch.empty_like(q)
    for b in range(B):
        tab = c["full_tab"][b].long()
        k = c["kc"][tab].reshape(-1, HKV, D).double()[:P + S]
        v = c["vc"][tab].reshape(-1, HKV, D).double()[:P + S]
        out[b:b + 1] = oracle_decode(q[b:b + 1], k.permute(1, 0, 2)[None], v.permute(1, 0, 2)[None])
    return out


def cascade_section(log, copy_bw, res):
    P, S, bs = 32768, 1024, 16
    res["cascade"] = {}
    for B in (8, 16, 32, 64):
        c = cases.shared_prefix_case(B, P, S, bs)
        args = (c["q"], c["prefix_k"], c["prefix_v"], c["kc"], c["vc"], c["suf_tab"], c["suf_len"])
        zero = torch.zeros(B, dtype=torch.int32, device=DEVICE)
        ref = paged_decode(c["q"], c["kc"], c["vc"], c["full_tab"], c["full_len"])
        exact = cascade_oracle(c, B, P, S) if B == 8 else None
        nbytes = cases.shared_prefix_bytes(B, P, S)
        rows = {}
        for name, cfg in CASCADE_VARIANTS.items():
            row = {}
            try:
                o, _ = cascade_decode(*args, config=cfg, fast_launch=False)
                row["rel_err_vs_paged"] = _common.rel_err(o, ref)
                if exact is not None:
                    row["rel_err_vs_fp64"] = float((o.double() - exact).norm() / exact.norm())
                    assert row["rel_err_vs_fp64"] < 1e-2, row
                assert row["rel_err_vs_paged"] < 2e-2, row
                f = lambda cfg=cfg: cascade_decode(*args, config=cfg, validate=False)  # noqa: E731
                row["us_graph"] = [_common.graph_ms([f]) * 1e3 for _ in range(3)]
                o2, _ = f()
                row["recorded_equal"] = bool(torch.equal(o, o2))
                pre = lambda cfg=cfg: cascade_decode(*args[:6], zero, config=cfg, validate=False)  # noqa: E731
                row["prefix_us_graph"] = _common.graph_ms([pre]) * 1e3
                row["frac_copy"] = nbytes["cascade"] / (min(row["us_graph"]) * 1e-6) / copy_bw
                row["prefix_frac_copy"] = nbytes["prefix_pass"] / (row["prefix_us_graph"] * 1e-6) / copy_bw
                log(f"  cascade B={B} {name}: {' '.join(f'{t:.1f}' for t in row['us_graph'])} us "
                    f"({row['frac_copy']:.3f} of copy); prefix alone {row['prefix_us_graph']:.1f} us "
                    f"({row['prefix_frac_copy']:.2f}); err {row['rel_err_vs_paged']:.1e}")
            except Exception as exc:  # noqa: BLE001
                row["error"] = repr(exc)[:400]
                log(f"  cascade B={B} {name} failed: {exc!r}"[:400])
            rows[name] = row
        res["cascade"][str(B)] = rows
        del c, args, ref
        torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(_common.RESULTS))
    ap.add_argument("--sections", default="cascade,decode")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    t0 = time.time()
    copy_bw = _common.copy_bandwidth(1 << 30, device=DEVICE)
    log = lambda m: print(f"[{time.time() - t0:6.1f}s] {m}", flush=True)  # noqa: E731
    log(f"{_common.device_name(False)}: copy {copy_bw / 1e12:.3f} TB/s")
    res = dict(meta=_common.run_meta(copy_bw_bytes_per_s=copy_bw))
    for sec in args.sections.split(","):
        {"decode": decode_section, "cascade": cascade_section}[sec](log, copy_bw, res)
        path = write_json(args.out, f"{_common.result_tag(False)}-decode-probe.json", res)  # after each section
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
