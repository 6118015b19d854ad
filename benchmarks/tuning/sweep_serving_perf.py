"""Sweep the launch configurations behind three missed serving bars in one GPU call (notes/serving_perf.md).

    python3 -m benchmarks.tuning.sweep_serving_perf --out DIR            # DIR/<gpu>-serving-sweep.json
    python3 -m benchmarks.tuning.sweep_serving_perf --ncu-cases          # each default kernel once (under ncu)

bf16, Hq=32, Hkv=8, d=128, the shapes of ``bench_mixed_batch`` / ``bench_decode``:

* cascade: 32k shared prefix + 1k suffixes, B = 8..64: ``CascadeConfig`` variants (prefix tile rows, warps,
  stages, key block, prefix programs per SM), the whole call and the prefix pass alone (empty suffixes),
  CUDA-graph time, as fractions of the copy bandwidth measured in the same run;
* prefill: 8 chunks of 512 after 4k cached keys, 16- and 64-token pages: ``MixedConfig`` variants (large tile
  rows, warps, stages, key block, TMA) vs ``flash_attention_varlen_forward`` on the same keys stored contiguously
  (autotuned), and the same variants on ``bench_mixed_batch``'s mixed step;
* decode: B=1, 32k keys, contiguous: stage-1 tile configurations x split counts (``flash_decode``).

Every variant is checked against a reference on fresh random inputs before it is timed; a failing variant is
recorded, not fatal.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time

import numpy as np
import torch

from benchmarks import _serving_cases as cases
from benchmarks._common import rel_err
from benchmarks import _common
from experiments.serving_baselines import paged_prefill_row_gather
from reference.triton import (DEVICE, cascade_decode, configs, flash_attention_varlen_forward, flash_decode,
                              paged_decode, paged_prefill)
from reference.triton.cascade import CascadeConfig, cascade_num_splits
from reference.triton.configs import DecodeConfig
from reference.triton.mixed import MixedConfig, make_mixed_plan, mixed_attention

HQ, HKV, D = 32, 8, 128

#: CascadeConfig variants (rows, num_warps, num_stages, block_n, programs_per_sm, max_split_keys); the first two sweeps
#: of notes/serving_perf.md ("The bars missed at first") swept tile shapes and two merge designs (their JSON: h100-serving-sweep.json,
#: h100-cascade-sweep.json)
CASCADE = [(64, 4, 3, 64, 1, 2048), (64, 4, 3, 64, 2, 1 << 30), (64, 4, 3, 64, 1, 4096), (64, 4, 3, 64, 1, 1024),
           (32, 4, 3, 64, 1, 2048), (32, 4, 3, 64, 2, 2048), (64, 4, 4, 64, 1, 2048)]
#: (large_rows, num_warps, num_stages, block_n)
PREFILL = [(64, 4, 3, 64), (128, 8, 3, 64), (128, 8, 4, 64), (128, 8, 2, 128), (64, 4, 3, 128)]
#: decode (block_n, num_warps, num_stages) and split counts at B=1, 32k
DECODE = [(64, 4, 4), (64, 4, 3), (128, 4, 2), (128, 8, 2), (64, 8, 3), (32, 4, 4)]
SPLITS = [16, 24, 32, 40, 48, 64, 66, 132]


def cascade_sweep(log, copy_bw):
    P, S, bs = 32768, 1024, 16
    out = []
    for B in (8, 16, 32, 64):
        c = cases.shared_prefix_case(B, P, S, bs)
        q, kc, vc, pk, pv, suf_tab, suf_len = (c[k] for k in ("q", "kc", "vc", "prefix_k", "prefix_v", "suf_tab",
                                                              "suf_len"))
        zero_len = torch.zeros(B, dtype=torch.int32, device=DEVICE)
        ref = paged_decode(q, kc, vc, c["full_tab"], c["full_len"])
        del c
        nbytes = cases.shared_prefix_bytes(B, P, S)
        for rows, w, st, bn, pps, cap in CASCADE:
            cfg = CascadeConfig(rows=rows, num_warps=w, num_stages=st, block_n=bn, programs_per_sm=pps,
                                max_split_keys=cap)
            row = dict(batch=B, rows=rows, num_warps=w, num_stages=st, block_n=bn, programs_per_sm=pps,
                       max_split_keys=cap, num_splits=cascade_num_splits(B, HQ // HKV, HKV, P, cfg))

            def measure():
                o, _ = cascade_decode(q, pk, pv, kc, vc, suf_tab, suf_len, config=cfg)
                o2, _ = cascade_decode(q, pk, pv, kc, vc, suf_tab, suf_len, config=cfg)
                row["rel_err"] = rel_err(o, ref)
                assert row["rel_err"] < 2e-2 and torch.equal(o, o2), row
                full = _common.graph_ms([lambda: cascade_decode(q, pk, pv, kc, vc, suf_tab, suf_len, config=cfg,
                                                           validate=False)])
                pre = _common.graph_ms([lambda: cascade_decode(q, pk, pv, kc, vc, suf_tab, zero_len, config=cfg,
                                                          validate=False)])
                o3, _ = cascade_decode(q, pk, pv, kc, vc, suf_tab, suf_len, config=cfg, validate=False)
                assert rel_err(o3, ref) < 2e-2  # after the graph replays (a racy merge shows here)
                row.update(us=full * 1e3, us_prefix=pre * 1e3, frac=nbytes["cascade"] / (full * 1e-3) / copy_bw,
                           frac_prefix=nbytes["prefix_pass"] / (pre * 1e-3) / copy_bw)
                log(f"  cascade B={B:2d} st={st} pps={pps} cap={cap:10d} splits={row['num_splits']:2d}: {row['us']:6.1f} us "
                    f"({row['frac']:.2f} of copy), prefix {row['us_prefix']:6.1f} us ({row['frac_prefix']:.2f})")
            _record_variant(out, row, log, f"cascade B={B}", measure)
        del kc, vc, pk, pv
        cases.empty_cache()
    return out


def _record_variant(out, row, log, label, measure):
    """``measure()`` checks, times and logs one variant into ``row``, which goes into ``out``; a failing variant is
    a result (its error in ``row["failed"]``), not the end of the sweep."""
    try:
        measure()
    except Exception as exc:  # noqa: BLE001 - a failing variant is a result
        row["failed"] = repr(exc)[:300]
        log(f"  {label} {row} FAILED {exc!r}"[:400])
    out.append(row)


def _checked_mixed_call(row, cfg, q_lens, seq_lens, bs, inputs, ref):
    """``mixed_attention`` on ``inputs`` (q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens) with
    ``cfg``'s plan, as a call to time (no validation), once its output matched ``ref`` (``row["rel_err"]``)."""
    plan = make_mixed_plan(q_lens, seq_lens, HQ, HKV, bs, config=cfg)
    o, _ = mixed_attention(*inputs, plan=plan)
    row["rel_err"] = rel_err(o, ref)
    assert row["rel_err"] < 2e-2, row
    return functools.partial(mixed_attention, *inputs, plan=plan, validate=False)


def prefill_sweep(log):
    B, cached, chunk = 8, 4096, 512
    n = cached + chunk
    out = []
    for bs in (16, 64):
        kc, vc, table = cases.paged_batch([n] * B, bs)
        q = cases.randn(B * chunk, HQ, D)
        cu_q, cu_k = cases.cu_of([chunk] * B), cases.cu_of([n] * B)
        lens = torch.full((B,), n, dtype=torch.int32, device=DEVICE)
        k, v = cases.contiguous(kc, table, [n] * B), cases.contiguous(vc, table, [n] * B)
        ref, _ = flash_attention_varlen_forward(q, k, v, cu_q, cu_k, chunk, n, causal=True)
        base = _common.bench(lambda: flash_attention_varlen_forward(q, k, v, cu_q, cu_k, chunk, n, causal=True,
                                                               validate=False))
        gather = _common.bench(lambda: paged_prefill_row_gather(q, kc, vc, table, cu_q, lens, chunk, validate=False))
        out.append(dict(block_size=bs, impl="contiguous_varlen", us=base * 1e3))
        out.append(dict(block_size=bs, impl="paged_prefill_row_gather", us=gather * 1e3, vs_contiguous=base / gather))
        log(f"  prefill page {bs}: contiguous {base * 1e3:.1f} us, row gather {gather * 1e3:.1f} us "
            f"({base / gather:.2f}x)")
        for rows, w, st, bn in PREFILL:
            for tma in ((False, True) if bs % bn == 0 else (False,)):
                row = dict(block_size=bs, impl="mixed", large_rows=rows, num_warps=w, num_stages=st, block_n=bn,
                           use_tma=tma)

                def measure():
                    cfg = MixedConfig(large_rows=rows, num_warps=w, num_stages=st, block_n=bn, use_tma=tma)
                    ms = _common.bench(_checked_mixed_call(row, cfg, [chunk] * B, [n] * B, bs,
                                                      (q, kc, vc, table, cu_q, lens), ref))
                    row.update(us=ms * 1e3, vs_contiguous=base / ms)
                    log(f"  prefill page {bs} rows={rows} w={w} st={st} bn={bn} tma={int(tma)}: {ms * 1e3:7.1f} us "
                        f"({base / ms:.2f}x contiguous)")
                _record_variant(out, row, log, "prefill", measure)
        del kc, vc, k, v
        cases.empty_cache()
    return out


def mixed_step_sweep(log):
    """bench_mixed_batch's serving step (4 x 512 after 2k + 60 decodes at 1k-32k, 16-token pages) per config."""
    bs = 16
    rng = np.random.default_rng(0)
    dec_lens = [int(x) for x in np.exp(rng.uniform(math.log(1024), math.log(32768), 60))]
    q_lens = [512] * 4 + [1] * 60
    seq_lens = [2048 + 512] * 4 + dec_lens
    kc, vc, table = cases.paged_batch(seq_lens, bs)
    q = cases.randn(sum(q_lens), HQ, D)
    cu = cases.cu_of(q_lens)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    ref, _ = mixed_attention(q, kc, vc, table, cu, sl, plan=make_mixed_plan(q_lens, seq_lens, HQ, HKV, bs))
    out = []
    for rows, w, st, bn in PREFILL:
        row = dict(large_rows=rows, num_warps=w, num_stages=st, block_n=bn)

        def measure():
            cfg = MixedConfig(large_rows=rows, num_warps=w, num_stages=st, block_n=bn)
            call = _checked_mixed_call(row, cfg, q_lens, seq_lens, bs, (q, kc, vc, table, cu, sl), ref)
            row["us_graph"] = _common.graph_ms([call]) * 1e3
            log(f"  mixed step rows={rows} w={w} st={st} bn={bn}: {row['us_graph']:.1f} us graph")
        _record_variant(out, row, log, "mixed step", measure)
    del kc, vc
    cases.empty_cache()
    return out


def decode_sweep(log, copy_bw):
    B, N = 1, 32768
    kv_bytes = 2 * B * HKV * N * D * 2
    sets = [cases.inputs(B, N) for _ in range(cases.n_sets(kv_bytes))]
    ref = flash_decode(*sets[0], num_splits=1)
    out = []
    for bn, w, st in DECODE:
        cfg = DecodeConfig(block_n=bn, num_warps=w, num_stages=st)
        for s in SPLITS + [None]:
            row = dict(block_n=bn, num_warps=w, num_stages=st, num_splits=s)
            try:
                err = rel_err(flash_decode(*sets[0], num_splits=s, validate=False, config=cfg), ref)
                assert err < 1e-2, err
                ms = _common.graph_ms([(lambda q, k, v: (lambda: flash_decode(q, k, v, num_splits=s, validate=False,
                                                                         config=cfg)))(*x) for x in sets])
                row.update(us=ms * 1e3, frac=kv_bytes / (ms * 1e-3) / copy_bw)
            except Exception as exc:  # noqa: BLE001
                row["failed"] = repr(exc)[:300]
            out.append(row)
        log(f"  decode B=1 32k bn={bn} w={w} st={st}: " + " ".join(
            f"{r['num_splits'] or 'auto'}:{r['us']:.1f}({r['frac']:.2f})" if "us" in r else f"{r['num_splits']}:X"
            for r in out if (r["block_n"], r["num_warps"], r["num_stages"]) == (bn, w, st)))
    return out


def ncu_cases():
    """Each default kernel once, for ``ncu -k regex:...``: decode B=1 32k, cascade B=8 and B=64 (whole call and
    prefix only), the mixed kernel on the 64-token-page prefill."""
    q, k, v = cases.inputs(1, 32768)
    flash_decode(q, k, v, validate=False)
    P, S, bs = 32768, 1024, 16
    for B in (8, 64):
        n_blocks = P // bs + B * S // bs
        kc, vc = cases.randn(n_blocks, bs, HKV, D), cases.randn(n_blocks, bs, HKV, D)
        perm = torch.randperm(n_blocks, device=DEVICE).to(torch.int32)
        pre, suf = perm[:P // bs], perm[P // bs:].view(B, S // bs).contiguous()
        pk, pv = kc[pre.long()].reshape(P, HKV, D), vc[pre.long()].reshape(P, HKV, D)
        qc = cases.randn(B, HQ, D)
        cascade_decode(qc, pk, pv, kc, vc, suf, torch.full((B,), S, dtype=torch.int32, device=DEVICE))
        cascade_decode(qc, pk, pv, kc, vc, suf, torch.zeros(B, dtype=torch.int32, device=DEVICE))
    B, n, chunk = 8, 4608, 512
    kc, vc, table = cases.paged_batch([n] * B, 64)
    qp = cases.randn(B * chunk, HQ, D)
    mixed_attention(qp, kc, vc, table, cases.cu_of([chunk] * B), torch.full((B,), n, dtype=torch.int32, device=DEVICE))
    torch.cuda.synchronize()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--sections", default="decode,cascade,prefill,mixed")
    ap.add_argument("--ncu-cases", action="store_true")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    if args.ncu_cases:
        ncu_cases()
        return 0
    t0 = time.time()
    log, _ = _common.timestamped_log(t0)
    copy_bw = _common.copy_bandwidth()
    log(f"{_common.device_name()}: copy {copy_bw / 1e12:.2f} TB/s")
    res = dict(meta=_common.run_meta(copy_bw_bytes_per_s=copy_bw))
    path = os.path.join(args.out, f"{_common.result_tag()}-serving-sweep.json")
    fns = dict(decode=lambda: decode_sweep(log, copy_bw), cascade=lambda: cascade_sweep(log, copy_bw),
               prefill=lambda: prefill_sweep(log), mixed=lambda: mixed_step_sweep(log))
    with configs.pinned(fwd=configs.AUTOTUNE):
        _common.run_sections(fns, args.sections, res, path, log, t0)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
