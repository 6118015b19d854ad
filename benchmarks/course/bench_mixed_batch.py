"""Mixed prefill + decode launch, paged prefill and cascade decode against their baselines, in one run (GPU).

    python -m benchmarks.course.bench_mixed_batch [--out DIR] [--sections mixed,prefill,cascade] [--smoke]
        [--prefill-cases all|core]

bf16, Hq=32, Hkv=8, d=128. Every section checks correctness on the GPU first, then times (``do_bench``
medians with L2 flushed; ``graph``: CUDA-graph replay GPU time; ``loop``: wall time per call of back-to-back
eager calls); the copy bandwidth every fraction is taken against is measured first in every run. Sections:

* mixed: a serving step of 4 prefill chunks of 512 tokens (after 2k cached tokens each) and 60 decode rows at
  1k-32k keys (log-uniform, fixed seed), 16-token pages: ``mixed_attention`` (one launch; also its first
  version: table entries looked up in place, one per key row) vs the separate launches (``paged_prefill`` for the chunks,
  page-aligned or row gather, + ``paged_decode`` for the decodes) and vs ``paged_prefill`` over the whole batch
  (one varlen launch with 128-row query tiles per query head);
* prefill: 8 chunks of 512 tokens after 4k cached tokens, pages of 16 and 64 tokens: ``paged_prefill`` (the
  page-aligned kernel ``reference.triton.paged_tiles``, and ``paged_prefill_row_gather``, the simpler row gather
  of ``experiments/serving_baselines.py``),
  ``mixed_attention`` (page-aligned key blocks; TMA boxes for 64-token pages on Hopper; table entries one block
  ahead and whole-page tiles, or ``*_first_version`` / ``*_table_in_place``: looked up in the iteration that
  uses them, one per key row) vs ``flash_attention_varlen_forward`` on
  the same keys stored contiguously, all autotuned; on Hopper also ``paged_prefill(gather="tma")`` (the Gluon
  kernel, one TMA box per page: ``paged_prefill_gluon_tma``) and the contiguous Gluon forward on the same keys
  (``contiguous_gluon``; ratios to it in ``vs_contiguous_gluon``); then the same three tiles pinned on both sides
  (``pinned_ms``) and the autotuners' picks (``autotuned``);
* cascade: a 32k shared prefix + 1k suffix per request, B = 8..64: the one-launch ``cascade_decode`` vs the
  three-launch ``cascade_decode_separate`` vs ``paged_decode`` of the full sequences; graph and eager times, and
  the effective bandwidth of the whole call and of each pass (prefix alone: suffixes of length 0; suffixes alone:
  ``paged_decode`` of the suffixes) against the copy bandwidth measured in the same run. On Hopper also both
  prefix paths in the same process (``cascade_triton``: the one-launch Triton kernel; ``cascade_gluon``: the Gluon
  prefix launch + the suffix/merge launch, ``reference.triton.hopper.cascade_prefix_gluon``; ``_s3``: 3 ring
  stages; ``_n64``: 64-key blocks, 4 stages; ``_pps2``: twice the key splits; ``kernel_us``: each launch's GPU time
  from the profiler), each with its prefix pass alone (``prefix_pass_*``); ``cascade`` is
  the default configuration (``row["default_prefix"]`` says which path its graph took, ``default_prefix_eager``
  which path its eager calls took). The Gluon path with
  both passes at once (``CascadeConfig.overlap``): ``cascade_gluon_pdl`` (the suffix launch programmatically
  dependent on the prefix kernel, prefix CTAs on half the SMs; ``_p35`` / ``_p75``: on 0.35 / 0.75 of them) and
  ``cascade_gluon_streams`` (fork/join of two streams, merge launch); eager loop / graph and the host time of an
  eager call (``host_us_per_call``: calls issued while the GPU sleeps) for each path.

``--results-name cascade`` writes ``<gpu>-cascade.json`` instead (a run of one section beside the full file).

Writes ``<gpu>-mixed-batch.json`` after every section.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch

from benchmarks import _common
from benchmarks._common import RESULTS
from benchmarks._common import rel_err
from benchmarks._serving_cases import (D, HKV, HQ, PER_TOKEN, contiguous, cu_of, empty_cache,  # noqa: F401
                                       paged_batch, randn, shared_prefix_bytes, shared_prefix_case)
from experiments.serving_baselines import (MixedVariant, cascade_decode_separate, mixed_attention_variant,
                                          paged_prefill_row_gather)
from reference.triton import (DEVICE, cascade_decode, flash_attention_varlen_forward, paged_decode,
                              paged_prefill)
from reference.triton import configs
from reference.triton.mixed import MixedConfig, make_mixed_plan, mixed_attention
from reference.triton.configs import CASCADE_DEFAULT
from reference.triton.cascade import overlap_mode, use_gluon_prefix

DTYPE = torch.bfloat16
SMOKE = False
#: ``--prefill-cases core``: the prefill section times only the contiguous varlen baseline, the Triton page tiles
#: and, on Hopper, the Gluon kernels (no mixed variants, no pinned rows): a short run of one helper's part
PREFILL_CORE = False


# ------------------------------------------------------------------------------------------------------------
def mixed_section(log):
    bs = 16
    rng = np.random.default_rng(0)
    n_chunks, chunk, cached = (2, 32, 64) if SMOKE else (4, 512, 2048)
    n_dec = 5 if SMOKE else 60
    lo, hi = (16, 200) if SMOKE else (1024, 32768)
    dec_lens = [int(x) for x in np.exp(rng.uniform(math.log(lo), math.log(hi), n_dec))]
    q_lens = [chunk] * n_chunks + [1] * n_dec
    seq_lens = [cached + chunk] * n_chunks + dec_lens
    kc, vc, table = paged_batch(seq_lens, bs)
    q = randn(sum(q_lens), HQ, D)
    cu = cu_of(q_lens)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    plan = make_mixed_plan(q_lens, seq_lens, HQ, HKV, bs)
    n_pre = n_chunks * chunk
    cu_pre, sl_pre, tab_pre = cu_of([chunk] * n_chunks), sl[:n_chunks], table[:n_chunks].contiguous()
    sl_dec, tab_dec = sl[n_chunks:], table[n_chunks:].contiguous()
    o, _ = mixed_attention(q, kc, vc, table, cu, sl, plan=plan)
    o_pre, _ = paged_prefill(q[:n_pre], kc, vc, tab_pre, cu_pre, sl_pre, chunk)
    o_dec = paged_decode(q[n_pre:], kc, vc, tab_dec, sl_dec)
    res = dict(block_size=bs, chunks=n_chunks, chunk=chunk, cached=cached, decode_lens=dec_lens,
               work_items=int(plan.items.shape[0]), split_slots=int(plan.plan.n_slots),
               rel_err_prefill_rows=rel_err(o[:n_pre], o_pre), rel_err_decode_rows=rel_err(o[n_pre:], o_dec))
    log(f"  mixed vs separate calls: rel err prefill rows {res['rel_err_prefill_rows']:.1e}, decode rows "
        f"{res['rel_err_decode_rows']:.1e} ({res['work_items']} work items)")
    assert res["rel_err_prefill_rows"] < 2e-2 and res["rel_err_decode_rows"] < 2e-2

    def separate():
        paged_prefill(q[:n_pre], kc, vc, tab_pre, cu_pre, sl_pre, chunk, validate=False)
        paged_decode(q[n_pre:], kc, vc, tab_dec, sl_dec, validate=False)

    def separate_row():  # the first paged_prefill (row gather) + paged_decode
        paged_prefill_row_gather(q[:n_pre], kc, vc, tab_pre, cu_pre, sl_pre, chunk, validate=False)
        paged_decode(q[n_pre:], kc, vc, tab_dec, sl_dec, validate=False)
    plan16 = make_mixed_plan(q_lens, seq_lens, HQ, HKV, bs, config=MixedConfig(block_n=16))
    plan_first = make_mixed_plan(q_lens, seq_lens, HQ, HKV, bs,
                                 config=MixedVariant(table_ahead=False, whole_pages=False))
    o2, _ = mixed_attention_variant(q, kc, vc, table, cu, sl, plan=plan_first)
    res["rel_err_first_version_vs_default"] = rel_err(o2, o)
    assert res["rel_err_first_version_vs_default"] < 2e-2
    cases = {
        "mixed_one_launch": lambda: mixed_attention(q, kc, vc, table, cu, sl, plan=plan, validate=False),
        "mixed_one_launch_first_version": lambda: mixed_attention_variant(q, kc, vc, table, cu, sl, plan=plan_first,
                                                                          validate=False),
        "mixed_one_launch_block16": lambda: mixed_attention(q, kc, vc, table, cu, sl, plan=plan16, validate=False),
        "separate_prefill_plus_decode": separate,
        "separate_row_gather_prefill_plus_decode": separate_row,
        "paged_prefill_whole_batch": lambda: paged_prefill(q, kc, vc, table, cu, sl, chunk, validate=False),
    }
    res["ms"] = {k: _common.bench(f, wall=SMOKE) for k, f in cases.items()}
    res["ms_graph"] = {k: _common.graph_ms([f], smoke=SMOKE) for k, f in cases.items()}
    kv_bytes = sum(seq_lens) * PER_TOKEN
    res["kv_bytes"] = kv_bytes
    flops = sum(4.0 * HQ * D * (n_q * (n - n_q) + n_q * (n_q + 1) / 2) for n_q, n in zip(q_lens, seq_lens))
    res["flops"] = flops
    for k in cases:
        log(f"  mixed {k:30s} {res['ms'][k] * 1e3:8.1f} us (graph {res['ms_graph'][k] * 1e3:8.1f} us) "
            f"{kv_bytes / (res['ms_graph'][k] * 1e-3) / 1e12:5.2f} TB/s of K/V, "
            f"{flops / (res['ms_graph'][k] * 1e-3) / 1e12:6.1f} TFLOP/s")
    res["speedup_vs_separate_graph"] = res["ms_graph"]["separate_prefill_plus_decode"] / res["ms_graph"]["mixed_one_launch"]
    res["speedup_vs_paged_prefill_graph"] = (res["ms_graph"]["paged_prefill_whole_batch"]
                                             / res["ms_graph"]["mixed_one_launch"])
    return res


# ------------------------------------------------------------------------------------------------------------
def _tuned_picks():
    """The configs the autotuners chose so far (contiguous forward, page-aligned paged prefill), by key."""
    from reference.triton import flash_fwd, paged_tiles
    return {name: {str(k): str(v) for k, v in getattr(t, "cache", {}).items()}
            for name, t in (("contiguous_varlen", flash_fwd._attn_fwd_tuned),
                            ("paged_prefill_page_tiles", paged_tiles.paged_prefill_tuned))}


#: pinned tiles (BLOCK_M, BLOCK_N, warps, stages) on which contiguous and paged run side by side
PREFILL_PINS = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3)]


def prefill_section(log):
    B, cached, chunk = (2, 64, 16) if SMOKE else (8, 4096, 512)
    n = cached + chunk
    out = dict(batch=B, cached=cached, chunk=chunk, pages={})
    for bs in ((16,) if SMOKE else (16, 64)):
        kc, vc, table = paged_batch([n] * B, bs)
        q = randn(B * chunk, HQ, D)
        cu_q, cu_k = cu_of([chunk] * B), cu_of([n] * B)
        lens = torch.full((B,), n, dtype=torch.int32, device=DEVICE)
        k, v = contiguous(kc, table, [n] * B), contiguous(vc, table, [n] * B)
        ref, _ = flash_attention_varlen_forward(q, k, v, cu_q, cu_k, chunk, n, causal=True)
        res = dict(block_size=bs, ms={}, rel_err={})
        cases = {"contiguous_varlen": lambda: flash_attention_varlen_forward(q, k, v, cu_q, cu_k, chunk, n,
                                                                             causal=True, validate=False),
                 "paged_prefill_page_tiles": lambda: paged_prefill(q, kc, vc, table, cu_q, lens, chunk,
                                                                   validate=False, gather="page"),
                 "paged_prefill_row_gather": lambda: paged_prefill_row_gather(q, kc, vc, table, cu_q, lens, chunk,
                                                                              validate=False)}
        for name, cfg in (("mixed_block64", MixedConfig(use_tma=False)),
                          ("mixed_block64_first_version", MixedVariant(use_tma=False, table_ahead=False,
                                                                       whole_pages=False)),
                          ("mixed_block_per_page", MixedConfig(block_n=bs, use_tma=False)),
                          ("mixed_tma", MixedConfig(use_tma=True)),
                          ("mixed_tma_table_in_place", MixedVariant(use_tma=True, table_ahead=False))):
            if SMOKE or PREFILL_CORE or ("tma" in name and bs % cfg.block_n):
                continue
            try:
                plan = make_mixed_plan([chunk] * B, [n] * B, HQ, HKV, bs, config=cfg)
                run = mixed_attention_variant if isinstance(cfg, MixedVariant) else mixed_attention
                o, _ = run(q, kc, vc, table, cu_q, lens, plan=plan)
                res["rel_err"][name] = rel_err(o, ref)
                assert res["rel_err"][name] < 2e-2, (name, res["rel_err"][name])
                cases[name] = lambda plan=plan, run=run: run(q, kc, vc, table, cu_q, lens, plan=plan, validate=False)
            except Exception as exc:  # noqa: BLE001 - a failing variant is a result
                res.setdefault("failed", {})[name] = repr(exc)[:300]
                log(f"  prefill {name} failed: {exc!r}"[:300])
        for name, f in (("page_tiles", lambda: paged_prefill(q, kc, vc, table, cu_q, lens, chunk, gather="page")),
                        ("row_gather", lambda: paged_prefill_row_gather(q, kc, vc, table, cu_q, lens, chunk))):
            res["rel_err"][f"paged_prefill_{name}"] = rel_err(f()[0], ref)
        if not SMOKE:
            _gluon_section(res, cases, q, k, v, kc, vc, table, cu_q, lens, B, chunk, n, ref, log)
        assert max(res["rel_err"].values()) < 2e-2, res["rel_err"]
        for name, f in cases.items():
            res["ms"][name] = _common.bench(f, wall=SMOKE)
        base = res["ms"]["contiguous_varlen"]
        res["vs_contiguous"] = {k: base / v for k, v in res["ms"].items()}
        if "contiguous_gluon" in res["ms"]:  # added measurement: against the contiguous Gluon forward too
            res["vs_contiguous_gluon"] = {k: res["ms"]["contiguous_gluon"] / v for k, v in res["ms"].items()}
        log(f"  prefill page {bs}: " + ", ".join(f"{k} {v * 1e3:.1f} us ({res['vs_contiguous'][k]:.2f}x)"
                                                    for k, v in res["ms"].items()))
        # the same tiles pinned on both sides: the kernel, not the autotuner's pick (added measurement)
        res["pinned_ms"] = {}
        for bm, bn, w, st in ([] if SMOKE or PREFILL_CORE else PREFILL_PINS):
            pin = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st}
            row = {}
            with configs.pinned(fwd=pin):
                for name in ("contiguous_varlen", "paged_prefill_page_tiles", "paged_prefill_row_gather"):
                    row[name] = _common.bench(cases[name])
            res["pinned_ms"][f"{bm}x{bn}x{w}w{st}s"] = row
            log(f"  prefill page {bs} pinned {bm}x{bn} {w} warps {st} stages: " + ", ".join(
                f"{k} {v * 1e3:.1f} us ({row['contiguous_varlen'] / v:.2f}x)" for k, v in row.items()))
        res["autotuned"] = _tuned_picks()
        out["pages"][str(bs)] = res
        del kc, vc, k, v
        empty_cache()
    return out


def _gluon_section(res, cases, q, k, v, kc, vc, table, cu_q, lens, B, chunk, n, ref, log) -> bool:
    """On Hopper, add the Gluon paged prefill (``gather="tma"``: one TMA box per page, producer warp reads the
    table) and the contiguous Gluon forward on the same keys (``(B, H, N, d)`` copies made once, outside the
    timing) to ``cases``, each checked against the contiguous varlen output first. False elsewhere."""
    from reference.triton._checks import gluon_supported
    from reference.triton._device import device_limits
    from reference.triton.hopper.paged_prefill_gluon import gluon_paged_ok
    if not gluon_supported(device_limits(q.device)):
        return False
    from reference.triton.hopper.flash_gluon import flash_attention_forward_gluon
    res["gluon_paged_runs"] = gluon_paged_ok(q, kc) is None  # else gather="tma" fell back to the Triton kernel
    qb = q.view(B, chunk, HQ, D).transpose(1, 2).contiguous()
    kb, vb = (x.view(B, n, HKV, D).transpose(1, 2).contiguous() for x in (k, v))
    o, _ = paged_prefill(q, kc, vc, table, cu_q, lens, chunk, gather="tma")
    res["rel_err"]["paged_prefill_gluon_tma"] = rel_err(o, ref)
    o, _ = flash_attention_forward_gluon(qb, kb, vb, causal=True)
    res["rel_err"]["contiguous_gluon"] = rel_err(o.transpose(1, 2).reshape(B * chunk, HQ, D), ref)
    cases["paged_prefill_gluon_tma"] = lambda: paged_prefill(q, kc, vc, table, cu_q, lens, chunk, validate=False,
                                                             gather="tma")
    cases["contiguous_gluon"] = lambda: flash_attention_forward_gluon(qb, kb, vb, causal=True)
    log(f"  prefill gluon: rel err paged {res['rel_err']['paged_prefill_gluon_tma']:.1e}, contiguous "
        f"{res['rel_err']['contiguous_gluon']:.1e} (Gluon paged kernel ran: {res['gluon_paged_runs']})")
    return True


# ------------------------------------------------------------------------------------------------------------
def cascade_section(log, copy_bw):
    # the separate version's prefix pass autotunes, as before (smoke runs keep the interpreter pin)
    with configs.pinned(fwd=None if SMOKE else configs.AUTOTUNE):
        return _cascade(log, copy_bw)


def _cascade(log, copy_bw):
    P, S, bs = (64, 16, 16) if SMOKE else (32768, 1024, 16)
    rows = []
    for B in ([2] if SMOKE else [8, 16, 32, 64]):
        c = shared_prefix_case(B, P, S, bs)
        q, kc, vc, prefix_k, prefix_v, suf_tab, suf_len, full_tab, full_len = (c[k] for k in (
            "q", "kc", "vc", "prefix_k", "prefix_v", "suf_tab", "suf_len", "full_tab", "full_len"))
        zero_len = torch.zeros(B, dtype=torch.int32, device=DEVICE)
        oc, lc = cascade_decode(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len)
        os_, ls_ = cascade_decode_separate(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len)
        op = paged_decode(q, kc, vc, full_tab, full_len)
        oc2, _ = cascade_decode(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len)  # the recorded launch
        row = dict(batch=B, prefix=P, suffix=S, block_size=bs, rel_err_vs_paged=rel_err(oc, op),
                   rel_err_vs_separate=rel_err(oc, os_), recorded_equal=bool(torch.equal(oc, oc2)))
        assert row["rel_err_vs_paged"] < 2e-2 and row["recorded_equal"], row
        variants = _cascade_variants(q, prefix_k, prefix_v)
        # the graph time's path (captured) and the eager loop's (eager calls keep the Triton kernel
        # below CascadeConfig.eager_gluon_min_rows)
        row["default_prefix"] = "gluon" if use_gluon_prefix(CASCADE_DEFAULT, q, prefix_k, prefix_v,
                                                            capturing=True) else "triton"
        row["default_prefix_eager"] = "gluon" if use_gluon_prefix(CASCADE_DEFAULT, q, prefix_k, prefix_v,
                                                                  capturing=False) else "triton"
        row["default_overlap"] = (overlap_mode(CASCADE_DEFAULT, B * (HQ // HKV)) if row["default_prefix"] == "gluon"
                                  else "off")
        for name, cfg in variants.items():  # each path vs the float64-checked paged decode, before timing
            ov, _ = cascade_decode(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len, config=cfg)
            row.setdefault("rel_err_vs_paged_variants", {})[name] = err = rel_err(ov, op)
            assert err < 2e-2, (name, err)
            ov2, _ = cascade_decode(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len, config=cfg)  # recorded
            row.setdefault("recorded_equal_variants", {})[name] = same = bool(torch.equal(ov, ov2))
            assert same, name
        fns = {
            "cascade": lambda: cascade_decode(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len, validate=False),
            "cascade_separate": lambda: cascade_decode_separate(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len,
                                                                validate=False),
            "paged": lambda: paged_decode(q, kc, vc, full_tab, full_len, validate=False),
            "prefix_pass": lambda: cascade_decode(q, prefix_k, prefix_v, kc, vc, suf_tab, zero_len, validate=False),
            "suffix_pass": lambda: paged_decode(q, kc, vc, suf_tab, suf_len, validate=False),
        }
        for name, cfg in variants.items():
            fns[f"cascade_{name}"] = (lambda c: lambda: cascade_decode(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len,
                                                                       validate=False, config=c))(cfg)
            if name in ("triton", "gluon"):
                fns[f"prefix_pass_{name}"] = (lambda c: lambda: cascade_decode(
                    q, prefix_k, prefix_v, kc, vc, suf_tab, zero_len, validate=False, config=c))(cfg)
        row["ms_graph"] = {k: _common.graph_ms([f], smoke=SMOKE) for k, f in fns.items()}
        row["ms_loop"] = {k: _common.loop_ms(fns[k], 100, warmup=10, smoke=SMOKE)
                          for k in ("cascade", "cascade_separate", "paged")}
        row["bytes"] = shared_prefix_bytes(B, P, S)
        row["bytes"]["cascade_separate"] = row["bytes"]["cascade"]
        for k in fns:
            if k.startswith("cascade_") and k != "cascade_separate":
                row["bytes"][k] = row["bytes"]["cascade"]
            elif k.startswith("prefix_pass_"):
                row["bytes"][k] = row["bytes"]["prefix_pass"]
        row["tb_per_s_graph"] = {k: row["bytes"][k] / (row["ms_graph"][k] * 1e-3) / 1e12 for k in row["bytes"]}
        row["fraction_of_copy_bw"] = {k: v * 1e12 / copy_bw for k, v in row["tb_per_s_graph"].items()}
        g, lp = row["ms_graph"], row["ms_loop"]
        row["speedup_graph_vs_paged"] = g["paged"] / g["cascade"]
        row["speedup_graph_vs_separate"] = g["cascade_separate"] / g["cascade"]
        row["eager_loop_over_graph"] = lp["cascade"] / g["cascade"]
        row["eager_speedup_vs_paged"] = lp["paged"] / lp["cascade"]
        rows.append(row)
        log(f"  cascade B={B:3d}: graph {g['cascade'] * 1e3:7.1f} us (separate {g['cascade_separate'] * 1e3:7.1f}, "
            f"paged {g['paged'] * 1e3:7.1f}) = {row['speedup_graph_vs_paged']:.2f}x paged; eager loop "
            f"{lp['cascade'] * 1e3:7.1f} us = {row['eager_loop_over_graph']:.2f}x graph, "
            f"{row['eager_speedup_vs_paged']:.2f}x paged eager; err {row['rel_err_vs_paged']:.1e}")
        log("    effective bandwidth (fraction of copy): " + ", ".join(
            f"{k} {row['tb_per_s_graph'][k]:.2f} TB/s ({row['fraction_of_copy_bw'][k]:.2f})"
            for k in ("cascade", "cascade_separate", "prefix_pass", "suffix_pass", "paged")))
        if variants:
            row["kernel_us"] = _kernel_us({k: fns[k] for k in ("cascade_triton", "cascade_gluon",
                                                                "prefix_pass_triton", "prefix_pass_gluon",
                                                                "cascade_gluon_pdl", "cascade_gluon_streams")}, log)
            eager = ("cascade",) + EAGER_PATHS
            row["ms_loop_paths"] = {k: _common.loop_ms(fns[k], 100, warmup=10) for k in eager}
            row["eager_loop_over_graph_paths"] = {k: row["ms_loop_paths"][k] / g[k] for k in eager}
            row["host_us_per_call"] = {k: _common.host_us(fns[k]) for k in eager}
            log("    eager loop / graph: " + ", ".join(f"{k} {row['eager_loop_over_graph_paths'][k]:.2f}"
                                                        for k in eager)
                + "; host us a call: " + ", ".join(f"{k} {v:.0f}" for k, v in row["host_us_per_call"].items()))
            log("    prefix paths (graph us, fraction of copy): " + ", ".join(
                f"{k} {g[k] * 1e3:.1f} ({row['fraction_of_copy_bw'][k]:.2f})" for k in fns
                if k.startswith(("cascade_", "prefix_pass_")) and k != "cascade_separate"))
        del kc, vc, prefix_k, prefix_v
        empty_cache()
    return rows


def _kernel_us(fns: dict, log) -> dict:
    """Per-kernel GPU time (``_common.kernel_us``: torch.profiler, mean of 10 eager calls) of each of ``fns``: an
    added measurement beside the graph times, saying which launch of a path the microseconds go to."""
    from benchmarks._common import kernel_us
    out = {}
    for name, f in fns.items():
        try:
            out[name] = kernel_us(f, reps=10)
        except Exception as exc:  # noqa: BLE001 - an added measurement never costs the benchmark
            out[name] = {"error": repr(exc)[:200]}
        log(f"    kernels {name}: " + ", ".join(f"{k[:36]} {t}" for k, t in out[name].items()))
    return out


def _cascade_variants(q, prefix_k, prefix_v) -> dict:
    """The prefix paths timed side by side where the Gluon one applies (Hopper): name -> CascadeConfig."""
    import dataclasses
    gl = dataclasses.replace(CASCADE_DEFAULT, prefix_gluon=True)
    # whether the Gluon kernel applies at all (any batch size: both thresholds 1, and as if captured)
    if SMOKE or not use_gluon_prefix(dataclasses.replace(gl, prefix_gluon=None, gluon_min_rows=1,
                                                         eager_gluon_min_rows=1), q, prefix_k, prefix_v,
                                     capturing=True):
        return {}
    seq = dataclasses.replace(gl, overlap="off")
    pdl = dataclasses.replace(gl, overlap="pdl")
    return {"triton": dataclasses.replace(CASCADE_DEFAULT, prefix_gluon=False), "gluon": seq,
            "gluon_s3": dataclasses.replace(seq, gluon_stages=3),
            "gluon_n64": dataclasses.replace(seq, gluon_block_n=64, gluon_stages=4),
            "gluon_pps2": dataclasses.replace(seq, programs_per_sm=2 * seq.programs_per_sm),
            # the passes at once (CascadeConfig.overlap), prefix CTAs on a share of the SMs
            "gluon_pdl": pdl,
            "gluon_pdl_p35": dataclasses.replace(pdl, overlap_prefix_share=0.35),
            "gluon_pdl_p75": dataclasses.replace(pdl, overlap_prefix_share=0.75),
            "gluon_streams": dataclasses.replace(gl, overlap="streams")}


#: the paths whose eager calls are timed beside their graph time (loop and host time per call)
EAGER_PATHS = ("cascade_triton", "cascade_gluon", "cascade_gluon_pdl", "cascade_gluon_streams")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes: tests the script only")
    ap.add_argument("--sections", default="mixed,prefill,cascade")
    ap.add_argument("--results-name", default="mixed-batch",
                    help="results file <gpu>-<name>.json (e.g. 'cascade' for a run of that section alone)")
    ap.add_argument("--prefill-cases", choices=("all", "core"), default="all",
                    help="core: the prefill section without the mixed-kernel variants and pinned rows")
    args = ap.parse_args(argv)
    global SMOKE, PREFILL_CORE
    SMOKE = args.smoke
    PREFILL_CORE = args.prefill_cases == "core"
    return _common.start_run("bench_mixed_batch.py", SMOKE, args.out, lambda t0, log: _run(args, t0, log))


def _run(args, t0, log):
    torch.manual_seed(0)
    copy_bw = _common.copy_bandwidth(1 << (21 if SMOKE else 30), device=DEVICE, wall=SMOKE)
    log(f"{_common.device_name(SMOKE)}: copy bandwidth {copy_bw / 1e12:.2f} TB/s (bytes read + written of a 1 GiB copy)")
    out = dict(meta=dict(gpu=_common.device_name(SMOKE), torch=torch.__version__, triton=__import__("triton").__version__,
                         dtype="bfloat16", hq=HQ, hkv=HKV, d=D, copy_bw_bytes_per_s=copy_bw,
                         date=time.strftime("%Y-%m-%d %H:%M:%S"),
                         timing="ms: do_bench median (L2 flushed); ms_graph: CUDA-graph replay GPU time; "
                                "ms_loop: wall time per call of back-to-back eager calls"))
    path = os.path.join(args.out, f"{_common.result_tag(SMOKE)}-{args.results_name}.json")
    sections = dict(mixed=lambda: mixed_section(log), prefill=lambda: prefill_section(log),
                    cascade=lambda: cascade_section(log, copy_bw))
    _common.run_sections(sections, args.sections, out, path, log, t0)
    log(f"wrote {path}")
    return 1 if out.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
