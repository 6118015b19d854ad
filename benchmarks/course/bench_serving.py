"""Serving-path benchmark (GPU): varlen prefill vs padding, paged prefill, cascade decode, eager-call overhead.

    python -m benchmarks.course.bench_serving [--out DIR] [--sections eager,cascade,varlen,prefill,flex] [--smoke]

Shapes: bf16, Hq=32, Hkv=8 (GQA 4), d=128. Every section first checks our outputs on the GPU against an
independent implementation (SDPA, or our plain paged decode), then times with baselines measured in the same run:

1. varlen: a realistic prompt-length mix (log-normal, median 600 tokens, clipped to [16, 4096], fixed seed),
   causal prefill. Ours packed (``flash_attention_varlen``) vs ours padded to the longest, SDPA (default
   backend) padded, SDPA on nested (jagged) tensors (non-causal: torch refuses causal nested); forward, and
   forward + backward for ours.
2. paged prefill: chunks of 512 tokens after 4k cached tokens, 16-token blocks, vs the same attention on
   contiguous K/V (the cost of reading through block tables).
3. cascade: a 32k shared prefix + 1k suffix per request, batch 8..64, vs ``paged_decode`` over each request's
   full sequence (the prefix blocks shared in the block tables); the gain against the ratio of bytes read.
4. eager: B=1, 32k: decode and paged decode called eagerly (host time per call, back-to-back) vs their
   CUDA-graph GPU time, and vs SDPA's default backend called eagerly; with the recorded-launch fast path and
   without (``fast_launch=False``); host microseconds per call on a tiny problem.
5. flex: FlexAttention (``torch.compile``) with the document + causal block mask of section 1.

Times: ``do_bench`` medians (L2 flushed per call) unless named ``graph`` (CUDA-graph replay, GPU time only) or
``loop`` (wall time per call of 200 back-to-back eager calls, host overhead included when it dominates).
Writes ``<gpu>-serving.json`` (after every section, so a cut-short run keeps what it measured) and a plot.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
import torch

from benchmarks import _serving_cases as cases
from benchmarks._common import rel_err
from benchmarks import _common
from benchmarks._common import RESULTS
from reference.triton import (DEVICE, cascade_decode, flash_attention, flash_attention_forward,
                              flash_attention_varlen, flash_attention_varlen_forward, flash_decode, paged_decode,
                              paged_prefill)
from reference.triton import configs, decode_serving

HQ, HKV, D = cases.HQ, cases.HKV, cases.D
DTYPE = torch.bfloat16
SMOKE = False
#: one pinned configuration per kernel, so the run spends its time measuring, not autotuning every new shape
#: (the same configuration for packed and padded: the comparison is about the work, not the tuning)
FWD_PIN = configs.FWD_PINS["serving"]
BWD_PIN = configs.BWD_PINS["serving"]


def randn(*shape):
    return torch.randn(*shape, device=DEVICE, dtype=DTYPE)


def loop_ms(fn, n=200) -> float:
    """Wall time per call of ``n`` back-to-back eager calls (what a Python serving loop sees)."""
    return _common.loop_ms(fn, n, warmup=20, smoke=SMOKE)


def bench(fn) -> float:
    return _common.bench(fn, wall=SMOKE)


def graph_ms(fns) -> float:
    return _common.graph_ms(fns, smoke=SMOKE)


def length_mix(n: int, seed: int = 0, cap: int = 4096):
    rng = np.random.default_rng(seed)
    lens = np.clip(np.round(rng.lognormal(math.log(600), 0.9, n)), 16, cap).astype(int)
    return [int(x) for x in lens]


def cu_of(lens):
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=DEVICE)


def pad(x, lens, n_max):
    """Packed (T, H, d) -> padded (B, H, n_max, d) (zeros after each sequence)."""
    out = torch.zeros(len(lens), x.shape[1], n_max, x.shape[2], device=x.device, dtype=x.dtype)
    c = np.concatenate([[0], np.cumsum(lens)])
    for b, n in enumerate(lens):
        out[b, :, :n] = x[c[b]:c[b + 1]].transpose(0, 1)
    return out


# ------------------------------------------------------------------------------------------------------------
def varlen_inputs():
    lens = [5, 40, 17] if SMOKE else length_mix(32)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    T = sum(lens)
    q, k, v = (torch.randn(T, h, D, device=DEVICE, dtype=DTYPE, generator=g) for h in (HQ, HKV, HKV))
    return lens, q, k, v, cu_of(lens)


def varlen_section(log):
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    lens, q, k, v, cu = varlen_inputs()
    T, n_max = sum(lens), max(lens)
    res = dict(lengths=lens, total_tokens=T, max_len=n_max, padded_tokens=len(lens) * n_max,
               useful_fraction=T / (len(lens) * n_max), errors={}, ms={})
    o, _ = flash_attention_varlen_forward(q, k, v, cu, cu, n_max, n_max, causal=True)
    c = np.concatenate([[0], np.cumsum(lens)])
    worst = 0.0
    for b in range(min(4, len(lens))):  # SDPA per sequence as the reference
        s = slice(int(c[b]), int(c[b + 1]))
        ref = sdpa(q[s].transpose(0, 1)[None], k[s].transpose(0, 1)[None], v[s].transpose(0, 1)[None],
                   is_causal=True, enable_gqa=True)[0].transpose(0, 1)
        worst = max(worst, rel_err(o[s], ref))
    res["rel_err_vs_sdpa"] = worst
    log(f"  varlen forward vs SDPA per sequence: rel err {worst:.2e}")
    assert worst < 2e-2, "varlen forward disagrees with SDPA"
    qp, kp, vp = pad(q, lens, n_max), pad(k, lens, n_max), pad(v, lens, n_max)
    flops = sum(4.0 * n * n * D * HQ / 2 for n in lens)  # useful causal FLOPs (FA convention)
    res["useful_flops"] = flops
    cases = {
        "ours_varlen": lambda: flash_attention_varlen_forward(q, k, v, cu, cu, n_max, n_max, causal=True,
                                                              validate=False),
        "ours_padded": lambda: flash_attention_forward(qp, kp, vp, causal=True),
        "sdpa_padded": lambda: sdpa(qp, kp, vp, is_causal=True, enable_gqa=True),
    }
    try:  # nested (jagged) tensors: one (n_b, H, d) component per sequence, K/V expanded to Hq heads
        g = HQ // HKV
        nq = torch.nested.nested_tensor([q[int(c[b]):int(c[b + 1])] for b in range(len(lens))],
                                        layout=torch.jagged).transpose(1, 2)
        nk = torch.nested.nested_tensor([k[int(c[b]):int(c[b + 1])].repeat_interleave(g, 1)
                                         for b in range(len(lens))], layout=torch.jagged).transpose(1, 2)
        nv = torch.nested.nested_tensor([v[int(c[b]):int(c[b + 1])].repeat_interleave(g, 1)
                                         for b in range(len(lens))], layout=torch.jagged).transpose(1, 2)
        try:
            on = sdpa(nq, nk, nv, is_causal=True)
            res["errors"]["sdpa_nested"] = rel_err(on.transpose(1, 2).values(), o)
            cases["sdpa_nested"] = lambda: sdpa(nq, nk, nv, is_causal=True)
        except Exception as exc:  # noqa: BLE001 - a missing torch feature is a result, not a crash
            res["errors"]["sdpa_nested"] = f"causal unavailable: {exc!r}"[:300]
        # non-causal, where nested tensors work: against ours non-causal (twice the FLOPs of the causal rows)
        o_nc, _ = flash_attention_varlen_forward(q, k, v, cu, cu, n_max, n_max)
        res["errors"]["sdpa_nested_noncausal"] = rel_err(sdpa(nq, nk, nv).transpose(1, 2).values(), o_nc)
        cases["sdpa_nested_noncausal"] = lambda: sdpa(nq, nk, nv)
        cases["ours_varlen_noncausal"] = lambda: flash_attention_varlen_forward(q, k, v, cu, cu, n_max, n_max,
                                                                                validate=False)
    except Exception as exc:  # noqa: BLE001
        res["errors"]["sdpa_nested"] = f"unavailable: {exc!r}"[:300]
    for name, fn in cases.items():
        res["ms"][name] = bench(fn)
        log(f"  varlen fwd {name:16s} {res['ms'][name] * 1e3:9.1f} us  "
            f"{flops / (res['ms'][name] * 1e-3) / 1e12:6.1f} useful TFLOP/s")
    # forward + backward, ours packed vs ours padded
    do = randn(T, HQ, D)
    dop = pad(do, lens, n_max)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    pleaves = [x.clone().requires_grad_(True) for x in (qp, kp, vp)]

    def fb_varlen():
        flash_attention_varlen(*leaves, cu, cu, n_max, n_max, causal=True, validate=False).backward(do)

    def fb_padded():
        flash_attention(*pleaves, causal=True).backward(dop)
    res["ms"]["ours_varlen_fwd_bwd"] = bench(fb_varlen)
    res["ms"]["ours_padded_fwd_bwd"] = bench(fb_padded)
    log(f"  varlen fwd+bwd {res['ms']['ours_varlen_fwd_bwd'] * 1e3:.1f} us vs padded "
        f"{res['ms']['ours_padded_fwd_bwd'] * 1e3:.1f} us")
    res["speedup_vs_padded_fwd"] = res["ms"]["ours_padded"] / res["ms"]["ours_varlen"]
    res["speedup_vs_padded_fwd_bwd"] = res["ms"]["ours_padded_fwd_bwd"] / res["ms"]["ours_varlen_fwd_bwd"]
    return res



def flex_section(log):
    """FlexAttention with a document + causal block mask over the packed batch of ``varlen_section``."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    lens, q, k, v, cu = varlen_inputs()
    T, n_max = sum(lens), max(lens)
    o, _ = flash_attention_varlen_forward(q, k, v, cu, cu, n_max, n_max, causal=True)
    res = dict(errors={}, ms={})
    doc = torch.repeat_interleave(torch.arange(len(lens), device=DEVICE), torch.tensor(lens, device=DEVICE))

    def mask_mod(b, h, qi, ki):
        return (doc[qi] == doc[ki]) & (qi >= ki)
    bm = create_block_mask(mask_mod, None, None, T, T, device=DEVICE)
    fa = torch.compile(flex_attention)
    q1, k1, v1 = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    of = fa(q1, k1, v1, block_mask=bm, enable_gqa=True)
    res["errors"]["flex"] = rel_err(of[0].transpose(0, 1), o)
    res["ms"]["flex_block_mask"] = bench(lambda: fa(q1, k1, v1, block_mask=bm, enable_gqa=True))
    res["ms"]["ours_varlen"] = bench(lambda: flash_attention_varlen_forward(q, k, v, cu, cu, n_max, n_max,
                                                                               causal=True, validate=False))
    res["flex_over_ours"] = res["ms"]["flex_block_mask"] / res["ms"]["ours_varlen"]
    log(f"  flex block mask {res['ms']['flex_block_mask'] * 1e3:.1f} us vs ours varlen "
        f"{res['ms']['ours_varlen'] * 1e3:.1f} us (rel err {res['errors']['flex']:.1e})")
    return res


# ------------------------------------------------------------------------------------------------------------
def paged_blocks(n_seq, n_tok, bs, extra_blocks=0):
    """A random permutation of physical blocks: table (n_seq, n_tok / bs) over n_seq * n_tok / bs blocks."""
    nb = n_tok // bs
    perm = torch.randperm(n_seq * nb + extra_blocks, device=DEVICE)[:n_seq * nb]
    return perm.view(n_seq, nb).to(torch.int32)


def prefill_section(log):
    B, cached, chunk, bs = (2, 64, 16, 16) if SMOKE else (8, 4096, 512, 16)
    n = cached + chunk
    table = paged_blocks(B, n, bs)
    kc, vc = randn(B * n // bs, bs, HKV, D), randn(B * n // bs, bs, HKV, D)
    q = randn(B * chunk, HQ, D)
    cu_q = cu_of([chunk] * B)
    lens = torch.full((B,), n, dtype=torch.int32, device=DEVICE)
    k = kc[table.long()].reshape(B * n, HKV, D)  # the same keys, contiguous per sequence
    v = vc[table.long()].reshape(B * n, HKV, D)
    cu_k = cu_of([n] * B)
    o, _ = paged_prefill(q, kc, vc, table, cu_q, lens, chunk)
    ref, _ = flash_attention_varlen_forward(q, k, v, cu_q, cu_k, chunk, n, causal=True)
    res = dict(batch=B, cached=cached, chunk=chunk, block_size=bs, rel_err_vs_contiguous=rel_err(o, ref))
    log(f"  paged prefill vs contiguous varlen: rel err {res['rel_err_vs_contiguous']:.2e}")
    assert res["rel_err_vs_contiguous"] < 1e-2
    res["ms_paged"] = bench(lambda: paged_prefill(q, kc, vc, table, cu_q, lens, chunk, validate=False))
    res["ms_contiguous"] = bench(lambda: flash_attention_varlen_forward(q, k, v, cu_q, cu_k, chunk, n,
                                                                           causal=True, validate=False))
    res["paged_vs_contiguous"] = res["ms_contiguous"] / res["ms_paged"]
    log(f"  paged prefill {res['ms_paged'] * 1e3:.1f} us vs contiguous {res['ms_contiguous'] * 1e3:.1f} us "
        f"({res['paged_vs_contiguous']:.2f}x)")
    return res


# ------------------------------------------------------------------------------------------------------------
def cascade_section(log):
    """Autotuned (not pinned) forward configurations: the prefix pass has B * G query rows per kv head."""
    with configs.pinned(fwd=None if SMOKE else configs.AUTOTUNE):
        return _cascade(log)


def _cascade(log):
    P, S, bs = (64, 16, 16) if SMOKE else (32768, 1024, 16)
    batches = [2] if SMOKE else [8, 16, 32, 64]
    rows = []
    for B in batches:
        c = cases.shared_prefix_case(B, P, S, bs)
        q, kc, vc, prefix_k, prefix_v, suf_tab, suf_len, full_tab, full_len = (c[k] for k in (
            "q", "kc", "vc", "prefix_k", "prefix_v", "suf_tab", "suf_len", "full_tab", "full_len"))
        oc, _ = cascade_decode(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len)
        op = paged_decode(q, kc, vc, full_tab, full_len)
        row = dict(batch=B, prefix=P, suffix=S, block_size=bs, rel_err_vs_paged=rel_err(oc, op))
        assert row["rel_err_vs_paged"] < 2e-2, row
        f_casc = lambda: cascade_decode(q, prefix_k, prefix_v, kc, vc, suf_tab, suf_len, validate=False)  # noqa
        f_paged = lambda: paged_decode(q, kc, vc, full_tab, full_len, validate=False)  # noqa: E731
        row["ms_graph_cascade"] = graph_ms([f_casc])
        row["ms_graph_paged"] = graph_ms([f_paged])
        row["ms_cascade"] = bench(f_casc)
        row["ms_paged"] = bench(f_paged)
        nb = cases.shared_prefix_bytes(B, P, S)
        row.update(bytes_paged=nb["paged"], bytes_cascade=nb["cascade"], bytes_ratio=nb["paged"] / nb["cascade"],
                   speedup_graph=row["ms_graph_paged"] / row["ms_graph_cascade"],
                   speedup_eager=row["ms_paged"] / row["ms_cascade"])
        rows.append(row)
        log(f"  cascade B={B:3d}: graph {row['ms_graph_cascade'] * 1e3:8.1f} us vs paged "
            f"{row['ms_graph_paged'] * 1e3:8.1f} us = {row['speedup_graph']:.2f}x (bytes ratio "
            f"{row['bytes_ratio']:.2f}); eager {row['speedup_eager']:.2f}x; rel err {row['rel_err_vs_paged']:.1e}")
        del kc, vc, prefix_k, prefix_v
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return rows


# ------------------------------------------------------------------------------------------------------------
def eager_section(log):
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    B, N, bs = (1, 512, 16) if SMOKE else (1, 32768, 16)
    sets = [cases.inputs(B, N) for _ in range(1 if SMOKE else 2)]
    paged_sets = [(q, *cases.to_paged(k, v, bs)) for q, k, v in sets]
    res = dict(batch=B, context=N, block_size=bs, cases={})

    def makers(fast):
        return {
            "flash_decode": [lambda q=q, k=k, v=v: flash_decode(q, k, v, validate=False, fast_launch=fast)
                             for q, k, v in sets],
            "flash_decode validate=True": [lambda q=q, k=k, v=v, sl=p[4]: flash_decode(q, k, v, seq_lens=sl,
                                                                                       fast_launch=fast)
                                           for (q, k, v), p in zip(sets, paged_sets)],
            "paged_decode": [lambda p=p: paged_decode(p[0], p[1], p[2], p[3], p[4], validate=False, fast_launch=fast)
                             for p in paged_sets],
            "paged_decode validate=True": [lambda p=p: paged_decode(*p, fast_launch=fast) for p in paged_sets],
        }
    # correctness of the recorded fast path: a second input set of the same shapes through a recorded launch
    q, k, v = sets[0]
    flash_decode(q, k, v, validate=False)
    q2, k2, v2 = cases.inputs(B, N)
    ref = sdpa(q2.unsqueeze(2), k2, v2, enable_gqa=True).squeeze(2)
    res["fast_path_rel_err"] = rel_err(flash_decode(q2, k2, v2, validate=False), ref)
    kc2, vc2, t2, sl2 = cases.to_paged(k2, v2, bs)
    p = paged_sets[0]
    paged_decode(p[0], p[1], p[2], p[3], p[4], validate=False)
    res["fast_path_paged_rel_err"] = rel_err(paged_decode(q2, kc2, vc2, t2, sl2, validate=False), ref)
    res["fast_path_recorded"] = len(decode_serving.LAUNCH_CACHE)
    log(f"  recorded-launch path vs SDPA: {res['fast_path_rel_err']:.1e} (paged {res['fast_path_paged_rel_err']:.1e}), "
        f"{len(decode_serving.LAUNCH_CACHE)} launches recorded")
    assert res["fast_path_rel_err"] < 2e-2 and res["fast_path_paged_rel_err"] < 2e-2
    del q2, k2, v2, kc2, vc2
    for fast in (True, False):
        for name, fns in makers(fast).items():
            label = name + ("" if fast else " (no fast path)")
            r = dict(ms_loop=loop_ms(fns[0]), ms=bench(fns[0]))
            base = label.replace(" validate=True", "")
            if base == label:
                r["ms_graph"] = graph_ms(fns)
            else:  # a validating call syncs, so it cannot be captured: compare with its kernel's graph time
                r["ms_graph"] = res["cases"][base]["ms_graph"]
                r["graph_of"] = base
            r["loop_over_graph"] = r["ms_loop"] / r["ms_graph"]
            res["cases"][label] = r
            log(f"  eager {label:42s} loop {r['ms_loop'] * 1e3:7.1f} us | do_bench {r['ms'] * 1e3:7.1f} us | "
                f"graph {r['ms_graph'] * 1e3:7.1f} us | loop/graph {r['loop_over_graph']:.2f}")
    sd = [lambda q=q, k=k, v=v: sdpa(q.unsqueeze(2), k, v, enable_gqa=True) for q, k, v in sets]
    r = dict(ms_graph=graph_ms(sd), ms_loop=loop_ms(sd[0]), ms=bench(sd[0]))
    r["loop_over_graph"] = r["ms_loop"] / r["ms_graph"]
    res["cases"]["sdpa default"] = r
    log(f"  eager {'sdpa default':42s} loop {r['ms_loop'] * 1e3:7.1f} us | do_bench {r['ms'] * 1e3:7.1f} us | "
        f"graph {r['ms_graph'] * 1e3:7.1f} us")
    bars = {}
    for name in ("flash_decode", "paged_decode"):
        c = res["cases"][name]
        bars[name] = dict(loop_over_graph=c["loop_over_graph"], bar_graph=1.2,
                          loop_vs_sdpa_loop=r["ms_loop"] / c["ms_loop"], bar_sdpa=1.0)
    res["bars"] = bars
    # host microseconds per call on a tiny problem (the GPU never limits)
    qt, kt, vt = cases.inputs(1, 256)
    kct, vct, tt, slt = cases.to_paged(kt, vt, 16)
    host = {}
    for fast in (True, False):
        sfx = "" if fast else " (no fast path)"
        host["flash_decode" + sfx] = loop_ms(lambda: flash_decode(qt, kt, vt, validate=False, fast_launch=fast),
                                             300) * 1e3
        host["paged_decode" + sfx] = loop_ms(lambda: paged_decode(qt, kct, vct, tt, slt, validate=False,
                                                                  fast_launch=fast), 300) * 1e3
    host["sdpa default"] = loop_ms(lambda: sdpa(qt.unsqueeze(2), kt, vt, enable_gqa=True), 300) * 1e3
    res["host_us_tiny"] = host
    log("  host us/call (B=1, 256 keys): " + ", ".join(f"{k} {v:.1f}" for k, v in host.items()))
    return res


# ------------------------------------------------------------------------------------------------------------
def plot(out, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    if "varlen" in out:
        ms = out["varlen"]["ms"]
        ms = dict(ms, **out.get("flex", {}).get("ms", {}))
        names = [n for n in ("ours_varlen", "ours_padded", "sdpa_padded", "sdpa_nested", "flex_block_mask") if n in ms]
        ax[0].bar(range(len(names)), [ms[n] * 1e3 for n in names], color="tab:blue")
        ax[0].set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
        ax[0].set_ylabel("forward time (us)")
        ax[0].set_title(f"causal prefill of {len(out['varlen']['lengths'])} prompts "
                        f"({out['varlen']['useful_fraction']:.0%} of padded tokens real)", fontsize=9)
    if "cascade" in out:
        rows = out["cascade"]
        bs_ = [r["batch"] for r in rows]
        ax[1].plot(bs_, [r["speedup_graph"] for r in rows], "o-", label="cascade / paged decode (GPU time)")
        ax[1].plot(bs_, [r["bytes_ratio"] for r in rows], "k--", label="bytes-read ratio")
        ax[1].set_xscale("log", base=2)
        ax[1].set_xlabel("batch (requests sharing a 32k prefix, 1k suffix each)")
        ax[1].set_ylabel("speedup")
        ax[1].legend(fontsize=8)
        ax[1].set_title("cascade decode vs paged decode", fontsize=9)
    if "eager" in out:
        cases = out["eager"]["cases"]
        names = [n for n in ("flash_decode", "flash_decode (no fast path)", "paged_decode",
                             "paged_decode (no fast path)", "sdpa default") if n in cases]
        x = np.arange(len(names))
        ax[2].bar(x - 0.2, [cases[n]["ms_loop"] * 1e3 for n in names], 0.4, label="eager loop (wall per call)")
        ax[2].bar(x + 0.2, [cases[n]["ms_graph"] * 1e3 for n in names], 0.4, label="CUDA graph (GPU time)")
        ax[2].set_xticks(x, [n.replace(" (", "\n(") for n in names], fontsize=7)
        ax[2].set_ylabel("us per call")
        ax[2].legend(fontsize=8)
        ax[2].set_title("B=1, 32k keys: eager call vs GPU time", fontsize=9)
    fig.suptitle(f"{out['meta']['gpu']}, bf16, Hq=32, Hkv=8, d=128", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes: tests the script only")
    ap.add_argument("--sections", default="eager,cascade,varlen,prefill,flex",
                    help="comma-separated, run in this order (flex: torch.compile, slow to start)")
    args = ap.parse_args(argv)
    global SMOKE
    SMOKE = args.smoke
    fwd_pin = configs.FWD_PINS["smoke"] if SMOKE else FWD_PIN
    bwd_pin = None if SMOKE else BWD_PIN

    def pinned_run(t0, log):
        with configs.pinned(fwd=fwd_pin, bwd=bwd_pin):
            return _run(args, fwd_pin, bwd_pin, t0, log)
    return _common.start_run("bench_serving.py", SMOKE, args.out, pinned_run)


def _run(args, fwd_pin, bwd_pin, t0, log):
    torch.manual_seed(0)
    slug = _common.result_tag(SMOKE)
    out = dict(meta=dict(gpu=_common.device_name(SMOKE), slug=slug, torch=torch.__version__,
                         triton=__import__("triton").__version__, dtype="bfloat16", hq=HQ, hkv=HKV, d=D,
                         fwd_config=fwd_pin, bwd_config=bwd_pin or configs.backward_pin(),
                         date=time.strftime("%Y-%m-%d %H:%M:%S"),
                         timing="ms: do_bench median (L2 flushed per call); ms_graph: CUDA-graph replay GPU time; "
                                "ms_loop: wall time per call of back-to-back eager calls"))
    path = os.path.join(args.out, f"{slug}-serving.json")
    sections = dict(varlen=lambda: varlen_section(log), prefill=lambda: prefill_section(log),
                    cascade=lambda: cascade_section(log), eager=lambda: eager_section(log),
                    flex=lambda: flex_section(log))
    _common.run_sections(sections, args.sections, out, path, log, t0)
    plot(out, os.path.join(args.out, f"{slug}-serving.png"))
    log(f"wrote {path}")
    return 1 if out.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
