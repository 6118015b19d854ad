"""GPU benchmark: our Triton FlashAttention-2 (forward, backward) and fused softmax, side by side with torch.

FlashAttention convention (FA2 paper, section 4.1): batch x seqlen = 16k tokens, hidden 2048, heads = 2048 / d,
d in {64, 128}, seqlen 512 .. 16k, causal and not, bf16. FLOPs: 4 * B * H * N^2 * d for the forward (halved
when causal), 2.5x that for the backward. Implementations timed in the same process on the same inputs:
ours, torch SDPA with each backend (FLASH_ATTENTION = FA2, CUDNN_ATTENTION, EFFICIENT_ATTENTION) and naive
torch attention (skipped where it would not fit). Ceilings measured in the same run: a bf16 8192^3 matmul and
a device-to-device copy. Softmax: 4096 rows x N in {1k .. 32k}, GB/s (bytes read + written) vs torch.softmax.

Every timing is a ``triton.testing.do_bench`` median on fresh random inputs (never zeros); before timing, our
outputs (o, dq, dk, dv) are compared with SDPA-flash's. Writes ``<gpu>-attention.json`` and ``<gpu>-attention.png`` into --out and
prints the ratio table ours / SDPA-flash and ours / cuDNN.

    python -m benchmarks.course.bench_attention [--quick] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import triton
import triton.testing

from benchmarks._common import RESULTS, bench, copy_bandwidth, gpu_tag, matmul_tflops, rel_err, sdpa
from reference.triton import flash_attention, flash_attention_forward, softmax
from reference.triton import flash_bwd, flash_fwd

TOKENS, HIDDEN = 16384, 2048
DTYPE = torch.bfloat16


# ---------------------------------------------------------------- attention implementations
def naive(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def ours(q, k, v, causal):
    return flash_attention(q, k, v, causal=causal)


def implementations(quick: bool):
    from torch.nn.attention import SDPBackend
    impls = {"ours": ours, "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
             "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
    if not quick:
        impls["sdpa_efficient"] = sdpa(SDPBackend.EFFICIENT_ATTENTION)
        impls["naive"] = naive
    return impls


def make_inputs(B, H, N, d, requires_grad):
    g = lambda: torch.randn(B, H, N, d, device="cuda", dtype=DTYPE).requires_grad_(requires_grad)  # noqa: E731
    return g(), g(), g()


def check_vs_flash(B, H, N, d, causal, impls):
    """Our o and grads vs SDPA-flash on the same fresh inputs; also runs the autotuners for this shape."""
    q, k, v = make_inputs(B, H, N, d, True)
    do = torch.randn(B, H, N, d, device="cuda", dtype=DTYPE)
    out = {}
    for name in ("ours", "sdpa_flash"):
        for t in (q, k, v):
            t.grad = None
        o = impls[name](q, k, v, causal)
        o.backward(do)
        out[name] = [o.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()]
    o_ours, lse = flash_attention_forward(q.detach(), k.detach(), v.detach(), causal=causal)
    errs = {n: rel_err(a, b) for n, a, b in zip(("o", "dq", "dk", "dv"), out["ours"], out["sdpa_flash"])}
    errs["max_abs_o"] = float((out["ours"][0].float() - out["sdpa_flash"][0].float()).abs().max())
    errs["lse_finite"] = bool(torch.isfinite(lse).all())
    return errs


def time_attention(impl, B, H, N, d, causal):
    """(forward ms, backward ms) of one implementation; None where it runs out of memory or is unsupported."""
    try:
        q, k, v = make_inputs(B, H, N, d, False)
        with torch.no_grad():
            fwd = bench(lambda: impl(q, k, v, causal))
        del q, k, v
        q, k, v = make_inputs(B, H, N, d, True)
        o = impl(q, k, v, causal)
        do = torch.randn_like(o)
        bwd = bench(lambda: o.backward(do, retain_graph=True), grad_to_none=[q, k, v])
        del o, q, k, v, do
        return fwd, bwd
    except (torch.cuda.OutOfMemoryError, RuntimeError) as e:  # an SDPA backend may refuse a shape
        print(f"    skipped: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        torch.cuda.empty_cache()
        return None, None


def naive_fits(B, H, N) -> bool:
    return B * H * N * N * 2 <= 4.5e9  # one bf16 score matrix; the naive path keeps a few of them


# ---------------------------------------------------------------- softmax
def time_softmax(rows, n, reps_bytes=256 << 20):
    """GB/s of ours and torch.softmax, cycling through enough buffers that the L2 cache cannot hold them."""
    nbuf = max(1, math.ceil(reps_bytes / (rows * n * 2)))
    xs = [torch.randn(rows, n, device="cuda", dtype=DTYPE) * 4 for _ in range(nbuf)]
    err = rel_err(softmax(xs[0]), torch.softmax(xs[0].float(), -1))
    res = {"rel_err_vs_torch_fp32": err}
    ys = [torch.empty_like(x) for x in xs]
    for name, fn in (("ours", lambda i: softmax(xs[i])), ("torch", lambda i: torch.softmax(xs[i], -1)),
                     ("copy_same_size", lambda i: ys[i].copy_(xs[i]))):
        it = iter(range(1 << 62))
        ms = bench(lambda: fn(next(it) % nbuf))
        res[name] = 2 * rows * n * 2 / ms / 1e6
        # the same calls replayed from a CUDA graph: kernel time alone, without the host's launch cost
        it = iter(range(1 << 62))
        ms = triton.testing.do_bench_cudagraph(lambda: fn(next(it) % nbuf), rep=50, return_mode="median")
        res[name + "_graph"] = 2 * rows * n * 2 / ms / 1e6
    return res


# ---------------------------------------------------------------- plotting / report
def _log2_axes(ax, title, xlabel, ylabel):
    """A log2 x axis from the smallest size, y from 0, a light grid: every panel of ``plot``."""
    ax.set_xscale("log", base=2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    att = results["attention"]
    ds = sorted({r["d"] for r in att})
    fig = plt.figure(figsize=(20, 4.2 * (len(ds) + 1)))
    gs = fig.add_gridspec(len(ds) + 1, 4)
    styles = {"ours": "o-", "sdpa_flash": "s--", "sdpa_cudnn": "^--", "sdpa_efficient": "v:", "naive": "x:"}
    for i, d in enumerate(ds):
        for j, (pass_, causal) in enumerate([("fwd", False), ("fwd", True), ("bwd", False), ("bwd", True)]):
            ax = fig.add_subplot(gs[i, j])
            rows = [r for r in att if r["d"] == d and r["causal"] == causal]
            for impl in styles:
                pts = [(r["N"], r[impl][f"{pass_}_tflops"]) for r in rows
                       if impl in r and r[impl].get(f"{pass_}_tflops")]
                if pts:
                    ax.plot(*zip(*pts), styles[impl], label=impl)
            _log2_axes(ax, f"{pass_} d={d} {'causal' if causal else 'non-causal'}", "seqlen", "TFLOP/s")
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    ax = fig.add_subplot(gs[len(ds), :2])
    sm = results["softmax"]
    for impl, st in (("ours", "o-"), ("torch", "s--"), ("copy_same_size", "k.:"), ("ours_graph", "o-"),
                     ("torch_graph", "s--"), ("copy_same_size_graph", "k.:")):
        ax.plot([r["N"] for r in sm], [r[impl] for r in sm], st, label=impl, alpha=0.45 if "graph" in impl else 1)
    ax.axhline(results["ceilings"]["copy_GBps"], color="k", ls="-.", label="device copy, 1 GiB")
    _log2_axes(ax, f"softmax, {sm[0]['rows'] if sm else 0} rows, bf16", "row length N", "GB/s (read + write)")
    ax.legend(fontsize=8)
    c = results["ceilings"]
    fig.suptitle(f"{results['gpu']}: bf16, batch x seqlen = 16k, hidden 2048 | matmul {c['matmul_TFLOPs']:.0f} TFLOP/s, "
                 f"copy {c['copy_GBps']:.0f} GB/s")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def ratio_table(results) -> str:
    lines = ["", f"{'d':>4} {'causal':>6} {'N':>6} | {'fwd ours':>8} {'/flash':>7} {'/cudnn':>7} | "
             f"{'bwd ours':>8} {'/flash':>7} {'/cudnn':>7}"]
    for r in results["attention"]:
        o, f, c = r.get("ours", {}), r.get("sdpa_flash", {}), r.get("sdpa_cudnn", {})

        def ratio(a, b, key):
            return f"{a[key] / b[key]:7.2f}" if a.get(key) and b.get(key) else f"{'-':>7}"
        lines.append(f"{r['d']:>4} {str(r['causal']):>6} {r['N']:>6} | {o.get('fwd_tflops') or 0:8.1f} "
                     f"{ratio(o, f, 'fwd_tflops')} {ratio(o, c, 'fwd_tflops')} | {o.get('bwd_tflops') or 0:8.1f} "
                     f"{ratio(o, f, 'bwd_tflops')} {ratio(o, c, 'bwd_tflops')}")
    cp = results["ceilings"]["copy_GBps"]
    lines.append("")
    lines.append("softmax GB/s: do_bench (host launch included) | CUDA-graph replay (kernel alone)")
    lines.append(f"{'N':>6} | {'ours':>5} {'torch':>5} {'/torch':>6} {'/copy1G':>7} {'/copyN':>6} | "
                 f"{'ours':>5} {'torch':>5} {'/torch':>6} {'/copy1G':>7} {'/copyN':>6}")
    for r in results["softmax"]:
        a = [r[f"{k}{g}"] for g in ("", "_graph") for k in ("ours", "torch", "copy_same_size")]
        lines.append(f"{r['N']:>6} | {a[0]:5.0f} {a[1]:5.0f} {a[0] / a[1]:6.2f} {a[0] / cp:7.2f} {a[0] / a[2]:6.2f} | "
                     f"{a[3]:5.0f} {a[4]:5.0f} {a[3] / a[4]:6.2f} {a[3] / cp:7.2f} {a[3] / a[5]:6.2f}")
    return "\n".join(lines)


def tuned_configs():
    out = {}
    for name, tuner in (("fwd", flash_fwd._attn_fwd_tuned), ("bwd_dkdv", flash_bwd._bwd_dkdv_tuned),
                        ("bwd_dq", flash_bwd._bwd_dq_tuned)):
        out[name] = {str(k): str(v) for k, v in getattr(tuner, "cache", {}).items()}
    return out


def _dump(out, tag, results):
    with open(os.path.join(out, f"{tag}.json"), "w") as f:
        json.dump(results, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a subset: N in {2k, 8k}, ours/flash/cudnn only")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--pointer", action="store_true", help="also time our forward without tensor descriptors")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA GPU (the Triton interpreter is far too slow to time)")
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    t0 = time.time()
    gpu = torch.cuda.get_device_name()
    results = {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "dtype": "bfloat16",
               "convention": "batch*seqlen=16384, hidden=2048, heads=2048/d; fwd flops 4BHN^2d (x0.5 causal), "
                             "bwd 2.5x fwd; do_bench medians", "quick": args.quick}
    results["ceilings"] = {"matmul_TFLOPs": matmul_tflops(), "copy_GBps": copy_bandwidth() / 1e9}
    print(f"{gpu}: matmul {results['ceilings']['matmul_TFLOPs']:.0f} TFLOP/s, "
          f"copy {results['ceilings']['copy_GBps']:.0f} GB/s", flush=True)

    tag = gpu_tag() + ("-attention-quick" if args.quick else "-attention")
    os.makedirs(args.out, exist_ok=True)
    seqlens = [2048, 8192] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    impls = implementations(args.quick)
    att = []
    for d in (64, 128):
        H = HIDDEN // d
        for causal in (False, True):
            for N in seqlens:
                B = TOKENS // N
                row = {"d": d, "causal": causal, "N": N, "B": B, "H": H}
                row["check_vs_sdpa_flash"] = check_vs_flash(B, H, N, d, causal, impls)
                ff = flash_fwd.forward_flops(B, H, N, N, d, causal)
                fb = flash_bwd.backward_flops(B, H, N, N, d, causal)
                for name, impl in impls.items():
                    if name == "naive" and not naive_fits(B, H, N):
                        continue
                    fwd, bwd = time_attention(impl, B, H, N, d, causal)
                    row[name] = {"fwd_ms": fwd, "bwd_ms": bwd,
                                 "fwd_tflops": ff / fwd / 1e9 if fwd else None,
                                 "bwd_tflops": fb / bwd / 1e9 if bwd else None}
                if args.pointer:  # the same forward with plain pointer loads (use_tma=False)
                    q, k, v = make_inputs(B, H, N, d, False)
                    flash_attention_forward(q, k, v, causal=causal, use_tma=False)
                    ms = bench(lambda: flash_attention_forward(q, k, v, causal=causal, use_tma=False))
                    row["ours_pointer_fwd_tflops"] = ff / ms / 1e9
                    del q, k, v
                o = row["ours"]
                print(f"d={d} causal={causal!s:5} N={N:5} | err {row['check_vs_sdpa_flash']['o']:.1e} "
                      f"dq {row['check_vs_sdpa_flash']['dq']:.1e} | ours fwd {o['fwd_tflops'] or 0:6.1f} "
                      f"bwd {o['bwd_tflops'] or 0:6.1f} | flash fwd {row['sdpa_flash']['fwd_tflops'] or 0:6.1f} "
                      f"bwd {row['sdpa_flash']['bwd_tflops'] or 0:6.1f} | cudnn fwd "
                      f"{row['sdpa_cudnn']['fwd_tflops'] or 0:6.1f} bwd {row['sdpa_cudnn']['bwd_tflops'] or 0:6.1f}"
                      + (f" | ptr fwd {row['ours_pointer_fwd_tflops']:6.1f}" if "ours_pointer_fwd_tflops" in row
                         else ""), flush=True)
                att.append(row)
                _dump(args.out, tag, {**results, "attention": att, "partial": True})
    results["attention"] = att

    sm = []
    for n in ([1024, 8192, 32768] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768]):
        r = {"rows": 4096, "N": n, **time_softmax(4096, n)}
        sm.append(r)
        print(f"softmax N={n}: ours {r['ours']:.0f} GB/s, torch {r['torch']:.0f}, same-size copy "
              f"{r['copy_same_size']:.0f} | graph: ours {r['ours_graph']:.0f}, torch {r['torch_graph']:.0f}, "
              f"copy {r['copy_same_size_graph']:.0f}", flush=True)
    results["softmax"] = sm
    results["tma_used"] = True  # use_tma=None: tensor descriptors wherever the GPU and strides allow
    results["tuned_configs"] = tuned_configs()
    results["seconds"] = time.time() - t0

    _dump(args.out, tag, results)
    plot(results, os.path.join(args.out, f"{tag}.png"))
    table = ratio_table(results)
    print(table)
    print(f"\nwrote {args.out}/{tag}.json and .png in {results['seconds']:.0f} s")


if __name__ == "__main__":
    main()
