"""Decode-attention benchmark (GPU): Flash-Decoding split-KV vs one split vs torch SDPA vs naive torch, and
PagedAttention decode vs contiguous. Writes ``<gpu>-decode.json`` and two plots, prints the SPEC 7 ratio table.

    python benchmarks/bench_decode.py [--quick] [--out DIR]

Shapes: bf16, Hq=32, Hkv=8 (GQA group 4), d=128, one query token per sequence, batch {1, 8, 32}, context
1k..128k (configurations whose K/V would pass ``--max-kv-gb`` are skipped). Every configuration draws fresh
random inputs, checks each implementation against SDPA (default backend) before timing, and times with
``triton.testing.do_bench`` (median; it flushes L2 before every call). Bandwidth is KV bytes read / time,
compared with the device-to-device copy bandwidth (bytes read + written of a 1 GiB copy) measured in the run.

SDPA gets ``q (B, Hq, 1, d)`` and the un-expanded ``k, v (B, Hkv, N, d)`` with ``enable_gqa=True``; if a
backend refuses that, it is timed on K/V expanded to Hq heads with ``repeat_interleave`` (outside the timed
region) and the JSON records ``"gqa": "expanded"``. The naive baseline is three torch ops on the GQA view
``q (B, Hkv, G, d)``: ``softmax(q k^T * scale) v`` in bf16 matmuls with an fp32 softmax.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reference.triton import DEVICE, INTERPRET, flash_decode, num_sms, paged_decode  # noqa: E402
from reference.triton.decode import choose_num_splits  # noqa: E402

HQ, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16
BARS = {"copy_bw_fraction_b1_ge32k": 0.85, "vs_sdpa_default_b1_ge32k": 1.0, "vs_one_split_b1_64k": 4.0,
        "paged16_vs_contiguous": 0.9}


SMOKE = False  # --smoke: tiny shapes on CPU under the interpreter, to test this script without a GPU


def gpu_slug() -> str:
    if SMOKE:
        return "cpu-smoke"
    name = torch.cuda.get_device_name()
    m = re.search(r"(GH200|H100|H200|H20|A100|A10G?|L40S?|L4|B200|B100|V100|T4|RTX\s?\d+)", name, re.I)
    return (m.group(1) if m else name).lower().replace(" ", "")


def meta_name() -> str:
    return "cpu (Triton interpreter, smoke test)" if SMOKE else torch.cuda.get_device_name()


def bench(fn, rep=100):
    if SMOKE:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")  # ms


def copy_bandwidth() -> float:
    """Bytes read + written per second of a 1 GiB device-to-device copy."""
    x = torch.randn(1 << (20 if SMOKE else 29), device=DEVICE, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    nbytes = 2 * x.numel() * x.element_size()
    del x, y
    return nbytes / (ms * 1e-3)


def empty_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def naive_decode(q, k, v, scale):
    B, Hq, d = q.shape
    qg = q.view(B, HKV, Hq // HKV, d)
    s = torch.matmul(qg, k.transpose(-1, -2)).float() * scale
    p = torch.softmax(s, dim=-1).to(q.dtype)
    return torch.matmul(p, v).reshape(B, Hq, d)


def sdpa_fn(q, k, v, backend):
    """A closure timing SDPA with a length-1 query; returns (fn, gqa_mode)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    q4 = q.unsqueeze(2)

    def call(kk, vv, gqa):
        if backend is None:
            return F.scaled_dot_product_attention(q4, kk, vv, enable_gqa=gqa).squeeze(2)
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            return F.scaled_dot_product_attention(q4, kk, vv, enable_gqa=gqa).squeeze(2)
    try:
        call(k, v, True)
        return (lambda: call(k, v, True)), "enable_gqa"
    except RuntimeError:
        g = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        call(ke, ve, False)
        return (lambda: call(ke, ve, False)), "expanded"


def run_config(B, N, copy_bw, rows, log):
    scale = 1.0 / math.sqrt(D)
    q = torch.randn(B, HQ, D, device=DEVICE, dtype=DTYPE)
    k = torch.randn(B, HKV, N, D, device=DEVICE, dtype=DTYPE)
    v = torch.randn(B, HKV, N, D, device=DEVICE, dtype=DTYPE)
    kv_bytes = 2 * k.numel() * k.element_size()
    splits = choose_num_splits(B, HKV, N)
    impls = {
        "split_kv": lambda: flash_decode(q, k, v, validate=False),
        "one_split": lambda: flash_decode(q, k, v, num_splits=1, validate=False),
        "naive_torch": lambda: naive_decode(q, k, v, scale),
    }
    gqa_modes = {}
    for name, backend in (("sdpa_default", None), ("sdpa_flash", "FLASH_ATTENTION")):
        try:
            impls[name], gqa_modes[name] = sdpa_fn(q, k, v, backend)
        except (RuntimeError, torch.OutOfMemoryError) as exc:
            log(f"  {name} unavailable at B={B} N={N}: {str(exc).splitlines()[0][:100]}")
    ref = impls["sdpa_default"]() if "sdpa_default" in impls else naive_decode(q, k, v, scale)
    for name, fn in impls.items():
        row = dict(batch=B, context=N, impl=name, kv_bytes=kv_bytes,
                   num_splits=splits if name == "split_kv" else (1 if name == "one_split" else None),
                   gqa=gqa_modes.get(name))
        try:
            out = fn()
            row["rel_err_vs_sdpa"] = rel(out, ref)
            if not (row["rel_err_vs_sdpa"] < 2e-2):
                raise AssertionError(f"{name} B={B} N={N}: rel err {row['rel_err_vs_sdpa']:.3g} vs SDPA")
            del out
            ms = bench(fn)
            row.update(ms=ms, kv_gbps=kv_bytes / (ms * 1e-3) / 1e9, frac_copy_bw=kv_bytes / (ms * 1e-3) / copy_bw)
        except torch.OutOfMemoryError:
            row["skipped"] = "out of memory"
            empty_cache()
        rows.append(row)
        if "ms" in row:
            log(f"  B={B:3d} N={N:6d} {name:13s} {row['ms'] * 1e3:9.1f} us  {row['kv_gbps']:7.0f} GB/s "
                f"({row['frac_copy_bw']:.2f} of copy)  err {row['rel_err_vs_sdpa']:.1e}")
    del q, k, v, impls
    empty_cache()


def split_sweep(B, N, counts, rows, log):
    q = torch.randn(B, HQ, D, device=DEVICE, dtype=DTYPE)
    k = torch.randn(B, HKV, N, D, device=DEVICE, dtype=DTYPE)
    v = torch.randn(B, HKV, N, D, device=DEVICE, dtype=DTYPE)
    kv_bytes = 2 * k.numel() * k.element_size()
    ref = flash_decode(q, k, v, num_splits=1)
    for s in counts:
        out = flash_decode(q, k, v, num_splits=s, validate=False)
        err = rel(out, ref)
        assert err < 1e-2, f"num_splits={s}: {err}"
        ms = bench(lambda: flash_decode(q, k, v, num_splits=s, validate=False), rep=50)
        rows.append(dict(batch=B, context=N, num_splits=s, ms=ms, kv_gbps=kv_bytes / (ms * 1e-3) / 1e9))
    best = min((r for r in rows if r["batch"] == B and r["context"] == N), key=lambda r: r["ms"])
    log(f"  sweep B={B} N={N}: heuristic {choose_num_splits(B, HKV, N)} splits, best {best['num_splits']} "
        f"({best['ms'] * 1e3:.1f} us)")
    del q, k, v
    empty_cache()


def paged_config(B, N, block_sizes, rows, log):
    q = torch.randn(B, HQ, D, device=DEVICE, dtype=DTYPE)
    k = torch.randn(B, HKV, N, D, device=DEVICE, dtype=DTYPE)
    v = torch.randn(B, HKV, N, D, device=DEVICE, dtype=DTYPE)
    kv_bytes = 2 * k.numel() * k.element_size()
    contig = flash_decode(q, k, v, validate=False)
    t_contig = bench(lambda: flash_decode(q, k, v, validate=False))
    rows.append(dict(batch=B, context=N, impl="contiguous", ms=t_contig, kv_gbps=kv_bytes / (t_contig * 1e-3) / 1e9))
    for bs in block_sizes:
        nb = N // bs
        perm = torch.randperm(B * nb, device=DEVICE)  # scattered: logical block j of b -> random physical block
        tables = perm.view(B, nb).to(torch.int32)
        kc = torch.empty(B * nb, bs, HKV, D, device=DEVICE, dtype=DTYPE)
        vc = torch.empty_like(kc)
        kc[perm] = k.view(B, HKV, nb, bs, D).permute(0, 2, 3, 1, 4).reshape(B * nb, bs, HKV, D)
        vc[perm] = v.view(B, HKV, nb, bs, D).permute(0, 2, 3, 1, 4).reshape(B * nb, bs, HKV, D)
        sl = torch.full((B,), N, dtype=torch.int32, device=DEVICE)
        out = paged_decode(q, kc, vc, tables, sl)  # validated once
        err = rel(out, contig)
        assert err < 1e-3, f"paged bs={bs} B={B} N={N}: {err} vs contiguous"
        ms = bench(lambda: paged_decode(q, kc, vc, tables, sl, validate=False))
        ms_val = bench(lambda: paged_decode(q, kc, vc, tables, sl), rep=30)
        rows.append(dict(batch=B, context=N, impl=f"paged_bs{bs}", block_size=bs, ms=ms, ms_validated=ms_val,
                         kv_gbps=kv_bytes / (ms * 1e-3) / 1e9, vs_contiguous=t_contig / ms, rel_err=err))
        log(f"  paged B={B:3d} N={N:6d} bs={bs:3d} {ms * 1e3:8.1f} us vs contiguous {t_contig * 1e3:8.1f} us "
            f"({t_contig / ms:.2f}x); with validation {ms_val * 1e3:.1f} us")
        del kc, vc, out
    del q, k, v
    empty_cache()


def bars(rows, paged, copy_bw):
    def get(B, N, impl):
        for r in rows:
            if r["batch"] == B and r["context"] == N and r["impl"] == impl and "ms" in r:
                return r
        return None
    table = []
    for N in sorted({r["context"] for r in rows if r["batch"] == 1 and r["context"] >= 32768}):
        s, d, o = get(1, N, "split_kv"), get(1, N, "sdpa_default"), get(1, N, "one_split")
        if s:
            table.append(("split-KV KV-bytes/time / copy BW", 1, N, s["frac_copy_bw"],
                          BARS["copy_bw_fraction_b1_ge32k"]))
        if s and d:
            table.append(("split-KV speed / SDPA default", 1, N, d["ms"] / s["ms"], BARS["vs_sdpa_default_b1_ge32k"]))
        if s and o and N == 65536:
            table.append(("split-KV speed / one split", 1, N, o["ms"] / s["ms"], BARS["vs_one_split_b1_64k"]))
    for r in paged:
        if r.get("block_size") == 16:
            table.append(("paged bs16 speed / contiguous", r["batch"], r["context"], r["vs_contiguous"],
                          BARS["paged16_vs_contiguous"]))
    return [dict(what=w, batch=B, context=N, value=val, bar=bar, passed=bool(val >= bar))
            for (w, B, N, val, bar) in table]


def plots(rows, out_dir, slug, copy_bw):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    batches = sorted({r["batch"] for r in rows})
    impls = ["split_kv", "one_split", "sdpa_default", "sdpa_flash", "naive_torch"]
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, B in zip(axes[0], batches):
        for impl in impls:
            pts = sorted((r["context"], r["ms"] * 1e3) for r in rows if r["batch"] == B and r["impl"] == impl
                         and "ms" in r)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ns = sorted({r["context"] for r in rows if r["batch"] == B})
        kvb = [2 * B * HKV * n * D * 2 for n in ns]
        ax.plot(ns, [b / copy_bw * 1e6 for b in kvb], "k--", label="KV bytes / copy BW")
        ax.set(xscale="log", yscale="log", xlabel="context length", ylabel="time (us)",
               title=f"decode, B={B}, Hq={HQ}, Hkv={HKV}, d={D}, bf16")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    p1 = os.path.join(out_dir, f"{slug}-decode-time.png")
    fig.savefig(p1, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for B in batches:
        for base, style in (("one_split", "-o"), ("sdpa_flash", "--s")):
            pts = []
            for n in sorted({r["context"] for r in rows if r["batch"] == B}):
                s = [r for r in rows if (r["batch"], r["context"], r["impl"]) == (B, n, "split_kv") and "ms" in r]
                o = [r for r in rows if (r["batch"], r["context"], r["impl"]) == (B, n, base) and "ms" in r]
                if s and o:
                    pts.append((n, o[0]["ms"] / s[0]["ms"]))
            if pts:
                ax.plot(*zip(*pts), style, label=f"B={B}: split-KV vs {base}")
    ax.axhline(8, color="r", ls=":", label='seed slides: "up to 8x faster than prior work"')
    ax.axhline(1, color="gray", lw=0.8)
    ax.set(xscale="log", xlabel="context length", ylabel="speedup (x)",
           title="Flash-Decoding: measured speedup of splitting K/V")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p2 = os.path.join(out_dir, f"{slug}-decode-speedup.png")
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [p1, p2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few configurations only")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes: tests the script only")
    ap.add_argument("--max-kv-gb", type=float, default=18.0, help="skip configurations with more K/V than this")
    args = ap.parse_args(argv)
    global SMOKE
    SMOKE = args.smoke
    if not SMOKE and (INTERPRET or not torch.cuda.is_available()):
        print("bench_decode.py needs a CUDA GPU (the interpreter would take hours); nothing run.")
        return 0
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()

    def log(msg):
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    slug = gpu_slug()
    copy_bw = copy_bandwidth()
    log(f"{meta_name()} ({num_sms()} SMs): copy bandwidth {copy_bw / 1e9:.0f} GB/s (read+write)")
    if SMOKE:
        batches, contexts = [1, 2], [256, 512]
    elif args.quick:
        batches, contexts = [1, 8], [4096, 32768, 65536]
    else:
        batches, contexts = [1, 8, 32], [1024 * 2 ** i for i in range(8)]  # 1k .. 128k
    rows = []
    for B in batches:
        for N in contexts:
            if 2 * B * HKV * N * D * 2 > args.max_kv_gb * 1e9:
                log(f"  skip B={B} N={N}: K/V over {args.max_kv_gb} GB")
                continue
            run_config(B, N, copy_bw, rows, log)
    sweep = []
    sweep_cases = [(1, 65536, [1, 2, 4, 8, 16, 24, 33, 48, 64, 96, 128])]
    if not args.quick:
        sweep_cases += [(1, 32768, [8, 16, 24, 33, 48, 64]), (8, 32768, [1, 2, 4, 5, 8, 16]),
                        (32, 32768, [1, 2, 3, 4, 8])]
    if SMOKE:
        sweep_cases = [(1, 512, [1, 2, 4])]
    for B, N, counts in sweep_cases:
        split_sweep(B, N, counts, sweep, log)
    paged = []
    paged_cases = [(1, 32768), (8, 8192)] if args.quick else [(1, 32768), (1, 131072), (8, 32768), (32, 8192)]
    if SMOKE:
        paged_cases = [(1, 512)]
    for B, N in paged_cases:
        paged_config(B, N, [16, 32, 128], paged, log)
    table = bars(rows, paged, copy_bw)
    meta = dict(gpu=meta_name(), slug=slug, sms=num_sms(), torch=torch.__version__,
                triton=__import__("triton").__version__, copy_bw_bytes_per_s=copy_bw, dtype="bfloat16",
                hq=HQ, hkv=HKV, d=D, quick=args.quick, date=time.strftime("%Y-%m-%d %H:%M:%S"),
                timing="triton.testing.do_bench median (ms), L2 flushed per call; fresh randn inputs per config",
                sdpa_gqa="enable_gqa=True where accepted, else K/V expanded (see rows' gqa field)")
    path = os.path.join(args.out, f"{slug}-decode.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, results=rows, split_sweep=sweep, paged=paged, bars=table), f, indent=1)
    figs = plots(rows, args.out, slug, copy_bw)
    log(f"wrote {path}, {', '.join(figs)}")

    print("\nSPEC 7 decode bars (bf16, Hq=32, Hkv=8, d=128)")
    print(f"{'what':36s} {'B':>3s} {'context':>8s} {'value':>7s} {'bar':>5s}  pass")
    for r in table:
        print(f"{r['what']:36s} {r['batch']:3d} {r['context']:8d} {r['value']:7.2f} {r['bar']:5.2f}  "
              f"{'yes' if r['passed'] else 'NO'}")
    print("\nspeedup of split-KV over: one split | SDPA default | SDPA flash | naive  (time split-KV us)")
    for B in batches:
        for N in contexts:
            g = {r["impl"]: r for r in rows if r["batch"] == B and r["context"] == N and "ms" in r}
            if "split_kv" not in g:
                continue
            s = g["split_kv"]["ms"]
            cols = [f"{g[i]['ms'] / s:6.2f}" if i in g else "   n/a" for i in
                    ("one_split", "sdpa_default", "sdpa_flash", "naive_torch")]
            print(f"B={B:3d} N={N:6d}  " + "  ".join(cols) + f"   ({s * 1e3:.1f} us, "
                  f"{g['split_kv']['frac_copy_bw']:.2f} of copy BW)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
