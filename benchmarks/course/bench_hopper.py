"""Hopper benchmark: bf16 vs cuDNN at d=128, block-config variants, the FP8 forward, the persistent LPT kernel.

One script, one GPU call (notes/hopper.md). Every new kernel is first checked on the GPU against a float64 torch
reference on fresh random inputs (o and lse; bf16/FP8 tolerances), then timed with ``triton.testing.do_bench``
medians against baselines measured in the same run:

1. ``main``: our bf16 forward/backward (pinned best configs of notes/triton_attention.md) vs SDPA's cuDNN and
   FLASH backends, d in {64, 128}, causal and not, N = 512..16k, FlashAttention convention (batch x seqlen =
   16k, hidden 2048, heads = 2048 / d).
2. ``variants``: the d=128 forward under other block shapes / warps / pipeline depths (the warp-specialised
   ``tl.range`` loop that lost: notes/experiments_removed.md), with each compiled kernel's registers, spills,
   shared memory and SASS matrix instructions (HGMMA = Hopper wgmma, HMMA = the older mma.sync path).
3. ``fp8``: ``flash_attention_forward_fp8`` vs our bf16 forward at d=128, N >= 4k (kernel alone on quantised
   inputs, and with quantisation included); FP8 config sweep; error vs float64, plain vs Hadamard, on normal
   inputs and with outlier channels (x10, x30, x100) and the FA3 paper's outlier entries.
4. ``persistent``: the persistent LPT kernel vs one program per work item, on causal shapes and on a batch of
   mixed lengths.

    python3 -m benchmarks.course.bench_hopper --out DIR      # writes DIR/<gpu>-hopper.json and DIR/<gpu>-hopper.png
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
import traceback

import torch
import triton

from benchmarks import _common
from benchmarks._common import RESULTS, gpu_tag, lse_abs, matmul_tflops, ref64, sdpa, timestamped_log
from benchmarks._common import rel_err as rel
from reference.triton import configs, flash_attention, flash_bwd, flash_fwd
from reference.triton._kernel_helpers import LOG2E
from reference.triton.flash_fwd import forward_flops
from reference.triton.hopper import flash_fp8, flash_persistent

TOKENS, HIDDEN = 16384, 2048
D128 = (128, HIDDEN // 128)  # (head dim, heads) of sections 2-4, which run at d = 128 only
DT = torch.bfloat16
# Pinned bf16 configs: the autotuner's picks on an H200 (benchmarks/results/h200-attention.json), per (d, causal); d=128
# non-causal backward from the H100 sweep (benchmarks/tuning/tune_bwd_hopper.py, notes/hopper.md section 1).
# (the pins live in reference/triton/configs.py, with the measurement that chose each)
FWD_PIN = configs.FWD_PINS["hopper_bench"]
VARIANTS = [(64, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3), (64, 128, 4, 3), (128, 128, 8, 2),
            (128, 64, 4, 3)]
FP8_CONFIGS = [(128, 128, 8, 3), (64, 128, 4, 3), (128, 64, 8, 3), (128, 128, 4, 3)]


def bench(fn) -> float:
    """Median ms, do_bench(warmup=10 ms, rep=40 ms): the convention of this file's results (``_common.hopper_bench``)."""
    return _common.hopper_bench(fn)


DEV = "cuda"


def randn(*shape):
    return torch.randn(*shape, device=DEV, dtype=DT)


def pin_bf16(d, causal):
    """Our Triton kernels without autotuning, inside ``with pin_bf16(d, causal):``."""
    return configs.pinned(fwd=FWD_PIN, bwd=configs.HOPPER_BENCH_BWD[(d, causal)])


def with_fwd_pin(fn):
    """Run ``fn`` with the Triton forward pinned (``FWD_PIN``): its baselines then skip autotuning."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with configs.pinned(fwd=FWD_PIN):
            return fn(*args, **kwargs)
    return wrapped


def kernel_report(compiled) -> dict:
    """Registers, spills, shared memory and SASS matrix-instruction counts of one compiled Triton kernel."""
    if compiled is None:  # the interpreter compiles nothing
        return {}
    out = {"n_regs": getattr(compiled, "n_regs", None), "n_spills": getattr(compiled, "n_spills", None),
           "shared": getattr(compiled.metadata, "shared", None)}
    try:
        sass = compiled.asm["sass"]
        for op in ("HGMMA", "QGMMA", "HMMA", "MUFU.EX2", "LDL", "STL", "UTMALDG", "LDGSTS", "BAR.SYNC"):
            out[op] = len(re.findall(r"\b" + re.escape(op) + r"\b", sass))
    except Exception as e:  # noqa: BLE001
        out["sass_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


# ---------------------------------------------------------------- 0. correctness of every new kernel
CHECK_CASES = [(2, 4, 2, 1000, 1000, 128, True), (1, 4, 4, 777, 1500, 128, False), (1, 2, 1, 300, 200, 64, True),
               (2, 2, 2, 1, 129, 128, True), (1, 8, 2, 4096, 4096, 128, True)]
CHECK_MIXED = (4, 4, 3000, [3000, 17, 1290, 2048])  # B, H, N, lengths
ACC_SHAPE = (1, 8, 2048, 128)
MIXED_BATCH = (12, 16384)  # sequences, longest length
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
FP8_SEQLENS = [4096, 8192, 16384]
PERSISTENT_SEQLENS = [2048, 8192]


def checks(log):
    res = []
    torch.manual_seed(1)
    for (B, Hq, Hkv, Nq, Nk, d, causal) in CHECK_CASES:
        q, k, v = randn(B, Hq, Nq, d), randn(B, Hkv, Nk, d), randn(B, Hkv, Nk, d)
        ro, rl = ref64(q, k, v, causal)
        for had in (False, True):
            o, lse = flash_fp8.flash_attention_forward_fp8(q, k, v, causal=causal, hadamard=had, seed=3)
            r = {"kernel": "fp8", "hadamard": had, "shape": [B, Hq, Hkv, Nq, Nk, d], "causal": causal,
                 "o_rel": rel(o, ro), "lse_abs": lse_abs(lse, rl), "nan": bool(torch.isnan(o).any())}
            r["ok"] = r["o_rel"] < 0.1 and r["lse_abs"] < 0.1 and not r["nan"]
            res.append(r)
        for pers in (True, False):
            for order in ("lpt", "naive"):
                o, lse = flash_persistent.flash_attention_forward_persistent(q, k, v, causal=causal, order=order,
                                                                             persistent=pers)
                r = {"kernel": f"persistent={pers}/{order}", "shape": [B, Hq, Hkv, Nq, Nk, d], "causal": causal,
                     "o_rel": rel(o, ro), "lse_abs": lse_abs(lse, rl)}
                r["ok"] = r["o_rel"] < 2e-2 and r["lse_abs"] < 1e-2
                res.append(r)
    # mixed lengths
    B, H, N, lens = CHECK_MIXED
    d = 128
    lens = torch.tensor(lens)
    q, k, v = randn(B, H, N, d), randn(B, H, N, d), randn(B, H, N, d)
    o, lse = flash_persistent.flash_attention_forward_persistent(q, k, v, causal=True, seq_lens=lens)
    errs = []
    for b, L in enumerate(lens.tolist()):
        ro, rl = ref64(q[b:b + 1, :, :L], k[b:b + 1, :, :L], v[b:b + 1, :, :L], True)
        errs.append(max(rel(o[b:b + 1, :, :L], ro), lse_abs(lse[b:b + 1, :, :L], rl)))
        errs.append(float(o[b, :, L:].abs().max()) if L < N else 0.0)
    res.append({"kernel": "persistent varlen", "lens": lens.tolist(), "max_err": max(errs), "ok": max(errs) < 2e-2})
    # bf16 variants
    q, k, v = randn(2, 4, 1000, 128), randn(2, 4, 1000, 128), randn(2, 4, 1000, 128)
    for causal in (False, True):
        ro, rl = ref64(q, k, v, causal)
        for cfg in VARIANTS if DEV == "cuda" else []:
            o, lse = run_variant(q, k, v, causal, cfg)
            res.append({"kernel": f"bf16 {cfg}", "causal": causal, "o_rel": rel(o, ro), "lse_abs": lse_abs(lse, rl),
                        "ok": rel(o, ro) < 2e-2 and lse_abs(lse, rl) < 1e-2})
    for r in res:
        log(f"check {r['kernel']:<28} {str(r.get('causal', '')):5} {str(r.get('shape', r.get('lens'))):<32} "
            f"o {r.get('o_rel', r.get('max_err', 0)):.2e} lse {r.get('lse_abs', 0):.1e} {'ok' if r['ok'] else 'FAIL'}")
    return res


# ---------------------------------------------------------------- 1. bf16 vs cuDNN / FLASH
def main_table(log, seqlens):
    from torch.nn.attention import SDPBackend
    impls = {"ours": lambda q, k, v, c: flash_attention(q, k, v, causal=c),
             "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    if DEV == "cpu":  # dry run of the script's logic under the interpreter
        impls["cudnn"] = impls["flash"] = sdpa(SDPBackend.MATH)
    rows = []
    for d in (128, 64):
        H = HIDDEN // d
        for causal in (False, True):
            with pin_bf16(d, causal):
                for N in seqlens:
                    B = TOKENS // N
                    row = {"d": d, "causal": causal, "N": N, "B": B, "H": H}
                    q, k, v = (randn(B, H, N, d).requires_grad_(True) for _ in range(3))
                    do = randn(B, H, N, d)
                    ff = forward_flops(B, H, N, N, d, causal)
                    fb = flash_bwd.backward_flops(B, H, N, N, d, causal)
                    outs = {}
                    for name, fn in impls.items():
                        try:
                            with torch.no_grad():
                                outs[name] = fn(q, k, v, causal)
                                tf = bench(lambda: fn(q, k, v, causal))
                            o = fn(q, k, v, causal)
                            tb = bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
                            row[name] = {"fwd_tflops": ff / tf / 1e9, "bwd_tflops": fb / tb / 1e9}
                            del o
                        except RuntimeError as e:
                            row[name] = {"error": str(e).splitlines()[0][:200]}
                    row["o_rel_vs_flash"] = rel(outs["ours"], outs["flash"])
                    rows.append(row)
                    g = lambda n, p: row[n].get(f"{p}_tflops", float("nan"))  # noqa: E731
                    log(f"bf16 d={d} causal={causal!s:5} N={N:5} fwd ours {g('ours', 'fwd'):5.0f} cudnn "
                        f"{g('cudnn', 'fwd'):5.0f} flash {g('flash', 'fwd'):5.0f} /cudnn "
                        f"{g('ours', 'fwd') / g('cudnn', 'fwd'):.2f} | bwd ours {g('ours', 'bwd'):5.0f} cudnn "
                        f"{g('cudnn', 'bwd'):5.0f} /cudnn {g('ours', 'bwd') / g('cudnn', 'bwd'):.2f} | "
                        f"err {row['o_rel_vs_flash']:.1e}")
                    del q, k, v, do, outs
    return rows


# ---------------------------------------------------------------- 2. d=128 forward variants
def run_variant(q, k, v, causal, cfg, want_kernel=False):
    """Our forward kernel (flash_fwd._attn_fwd, TMA path) under one (BLOCK_M, BLOCK_N, warps, stages)."""
    bm, bn, w, s = cfg
    B, H, N, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    desc = flash_fwd._descriptor
    args = (q, k, v, o, lse, desc(q, bm, d), desc(k, bn, d), desc(v, bn, d), desc(o, bm, d),
            *q.stride(), *k.stride(), *v.stride(), *o.stride(), lse.stride(0), lse.stride(1),
            H, 1, N, k.shape[2], d ** -0.5 * LOG2E.value, q, q, q, 0, 0, 0)
    kern = flash_fwd._attn_fwd[(triton.cdiv(N, bm), B * H)](*args, HEAD_DIM=d, CAUSAL=causal, USE_TMA=True,
                                                             INTERP=False, BLOCK_M=bm, BLOCK_N=bn, num_warps=w,
                                                             num_stages=s)
    return (o, lse, kern) if want_kernel else (o, lse)


def variants(log, seqlens):
    out = []
    d, H = D128
    for causal in (False, True):
        for N in seqlens:
            B = TOKENS // N
            q, k, v = randn(B, H, N, d), randn(B, H, N, d), randn(B, H, N, d)
            ff = forward_flops(B, H, N, N, d, causal)
            for cfg in VARIANTS:
                r = {"variant": "blocks", "config": list(cfg), "causal": causal, "N": N}
                try:
                    _, _, kern = run_variant(q, k, v, causal, cfg, want_kernel=True)
                    r["tflops"] = ff / bench(lambda: run_variant(q, k, v, causal, cfg)) / 1e9
                    if N == seqlens[0]:
                        r["kernel"] = kernel_report(kern)
                except Exception as e:  # noqa: BLE001
                    r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                out.append(r)
                log(f"variant d=128 causal={causal!s:5} N={N:5} {cfg} {r.get('tflops', float('nan')):6.1f} TFLOP/s "
                    f"{r.get('kernel', r.get('error', ''))}")
            del q, k, v
    return out


# ---------------------------------------------------------------- 3. FP8
@with_fwd_pin
def fp8_speed(log, seqlens):
    out = []
    d, H = D128
    best = None
    for causal in (False, True):
        for N in seqlens:
            B = TOKENS // N
            q, k, v = randn(B, H, N, d), randn(B, H, N, d), randn(B, H, N, d)
            ff = forward_flops(B, H, N, N, d, causal)
            r = {"causal": causal, "N": N, "B": B, "H": H}
            r["bf16_tflops"] = ff / bench(lambda: flash_fwd.flash_attention_forward(q, k, v, causal=causal)) / 1e9
            cfgs = FP8_CONFIGS if best is None else [best]
            for cfg in cfgs:
                bm, bn, w, s = cfg
                key = "fp8_" + "_".join(map(str, cfg))
                try:
                    x = flash_fp8.prepare_fp8(q, k, v, causal=causal, block_m=bm, block_n=bn)
                    c = {"num_warps": w, "num_stages": s}
                    flash_fp8.attention_fp8(x, config=c)
                    r[key] = ff / bench(lambda: flash_fp8.attention_fp8(x, config=c)) / 1e9
                except Exception as e:  # noqa: BLE001
                    r[key] = None
                    r[key + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            if best is None:
                best = max(FP8_CONFIGS, key=lambda c: r.get("fp8_" + "_".join(map(str, c))) or 0)
                r["fp8_kernel"] = kernel_report(flash_fp8.attention_fp8(
                    flash_fp8.prepare_fp8(q, k, v, causal=causal, block_m=best[0], block_n=best[1]),
                    config={"num_warps": best[2], "num_stages": best[3]}, return_kernel=True)[2])
            bk = "fp8_" + "_".join(map(str, best))
            r["fp8_best_config"] = list(best)
            r["fp8_tflops"] = r[bk]
            cfg = dict(BLOCK_M=best[0], BLOCK_N=best[1], num_warps=best[2], num_stages=best[3])
            r["fp8_with_quant_tflops"] = ff / bench(
                lambda: flash_fp8.flash_attention_forward_fp8(q, k, v, causal=causal, config=cfg)) / 1e9
            r["fp8_hadamard_with_quant_tflops"] = ff / bench(
                lambda: flash_fp8.flash_attention_forward_fp8(q, k, v, causal=causal, hadamard=True, config=cfg)) / 1e9
            r["speedup_kernel"] = (r["fp8_tflops"] or 0) / r["bf16_tflops"]
            r["speedup_with_quant"] = r["fp8_with_quant_tflops"] / r["bf16_tflops"]
            out.append(r)
            log(f"fp8 causal={causal!s:5} N={N:5} bf16 {r['bf16_tflops']:5.0f} fp8 {r['fp8_tflops'] or 0:5.0f} "
                f"({best}) x{r['speedup_kernel']:.2f} | with quant {r['fp8_with_quant_tflops']:5.0f} "
                f"x{r['speedup_with_quant']:.2f} | sweep "
                + " ".join(f"{c}:{r.get('fp8_' + '_'.join(map(str, c))) or 0:.0f}" for c in cfgs))
            del q, k, v
    return out


@with_fwd_pin
def fp8_accuracy(log):
    """FP8 error vs float64, plain vs Hadamard, and bf16's for scale; normal and outlier inputs."""
    out = []
    B, H, N, d = ACC_SHAPE
    g = torch.Generator(device=DEV).manual_seed(7)
    for kind, factor in (("normal", 1), ("channels", 10), ("channels", 30), ("channels", 100), ("entries", 10)):
        x = [torch.randn(B, H, N, d, device=DEV, generator=g) for _ in range(3)]
        if kind == "channels":  # a few channels of Q and K scaled (outlier features, as in the FA3 talk)
            ch = torch.randperm(d, device=DEV, generator=g)[:4]
            for t in x[:2]:
                t[..., ch] *= factor
        elif kind == "entries":  # FA3 paper 4.3: 0.1% of entries get an extra N(0, 10^2)
            for t in x:
                t += (torch.rand(t.shape, device=DEV, generator=g) < 1e-3) * torch.randn(
                    t.shape, device=DEV, generator=g) * factor
        q, k, v = (t.to(DT) for t in x)
        for causal in (False, True):
            ro, rl = ref64(q, k, v, causal)
            r = {"inputs": kind, "factor": factor, "causal": causal}
            o, _ = flash_fwd.flash_attention_forward(q, k, v, causal=causal)
            r["bf16_rel"] = rel(o, ro)
            errs = {"plain": [], "hadamard": []}
            for seed in range(3):
                for had in (False, True):
                    o, lse = flash_fp8.flash_attention_forward_fp8(q, k, v, causal=causal, hadamard=had, seed=seed)
                    errs["hadamard" if had else "plain"].append((rel(o, ro), lse_abs(lse, rl)))
            for key, vals in errs.items():
                r[f"fp8_{key}_rel"] = sum(e for e, _ in vals) / len(vals)
                r[f"fp8_{key}_lse_abs"] = max(e for _, e in vals)
            r["ratio_plain_over_hadamard"] = r["fp8_plain_rel"] / r["fp8_hadamard_rel"]
            out.append(r)
            log(f"fp8 error {kind:8} x{factor:<3} causal={causal!s:5} bf16 {r['bf16_rel']:.2e} plain "
                f"{r['fp8_plain_rel']:.2e} hadamard {r['fp8_hadamard_rel']:.2e} ratio "
                f"{r['ratio_plain_over_hadamard']:.2f}")
    return out


# ---------------------------------------------------------------- 4. persistent LPT
@with_fwd_pin
def persistent(log, seqlens):
    out = []
    d, H = D128
    fp = flash_persistent.flash_attention_forward_persistent
    shapes = [(TOKENS // N, N, None) for N in seqlens]
    gen = torch.Generator().manual_seed(11)
    nseq, longest = MIXED_BATCH
    mixed = torch.randint(128, longest, (nseq,), generator=gen)
    mixed[0] = longest
    shapes.append((nseq, longest, mixed))
    for B, N, lens in shapes:
        q, k, v = randn(B, H, N, d), randn(B, H, N, d), randn(B, H, N, d)
        tokens2 = (lens.double() ** 2).sum().item() if lens is not None else B * N * N
        ff = 2.0 * H * tokens2 * d  # causal: half of 4 H N^2 d per sequence
        r = {"B": B, "N": N, "lens": None if lens is None else lens.tolist()}
        for pers in (False, True):
            for order, l2 in (("naive", False), ("lpt", False), ("lpt", True)):
                key = f"{'persistent' if pers else 'grid'}_{order}{'_l2' if l2 else ''}_tflops"
                r[key] = ff / bench(lambda: fp(q, k, v, causal=True, seq_lens=lens, order=order, persistent=pers,
                                               l2_group=l2)) / 1e9
        r["flash_fwd_tflops"] = ff / bench(lambda: flash_fwd.flash_attention_forward(q, k, v, causal=True)) / 1e9
        r["note"] = "flash_fwd computes the padded batch (all N rows) when lens is given" if lens is not None else ""
        r["persistent_lpt_over_grid_naive"] = r["persistent_lpt_l2_tflops"] / r["grid_naive_tflops"]
        out.append(r)
        log(f"persistent B={B:3} N={N:5} mixed={lens is not None!s:5} grid naive {r['grid_naive_tflops']:5.0f} "
            f"grid lpt {r['grid_lpt_tflops']:5.0f} lpt-l2 {r['grid_lpt_l2_tflops']:5.0f} | pers naive "
            f"{r['persistent_naive_tflops']:5.0f} lpt {r['persistent_lpt_tflops']:5.0f} lpt-l2 "
            f"{r['persistent_lpt_l2_tflops']:5.0f} | flash_fwd {r['flash_fwd_tflops']:5.0f}")
        del q, k, v
    return out


@with_fwd_pin
def profile_once():
    """One call each of our bf16 forward, cuDNN's and our FP8 forward, d=128, N=8k, non-causal (run under ncu)."""
    from torch.nn.attention import SDPBackend
    B, H, N, d = 2, 16, 8192, 128
    q, k, v = randn(B, H, N, d), randn(B, H, N, d), randn(B, H, N, d)
    x = flash_fp8.prepare_fp8(q, k, v)
    for _ in range(2):  # the first call compiles
        flash_fwd.flash_attention_forward(q, k, v)
        sdpa(SDPBackend.CUDNN_ATTENTION)(q, k, v, False)
        flash_fp8.attention_fp8(x)
    q, k, v = randn(8, H, 2048, d), randn(8, H, 2048, d), randn(8, H, 2048, d)  # causal, where LPT lost
    for order, l2 in (("naive", False), ("lpt", False), ("lpt", True)):
        flash_persistent.flash_attention_forward_persistent(q, k, v, causal=True, order=order, l2_group=l2)
    torch.cuda.synchronize()


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(22, 4.5))
    for ax, (pass_, causal) in zip(axes[:2], (("fwd", False), ("fwd", True))):
        for impl, st in (("ours", "o-"), ("cudnn", "^--"), ("flash", "s--")):
            pts = [(r["N"], r[impl].get(f"{pass_}_tflops")) for r in res.get("main", [])
                   if r["d"] == 128 and r["causal"] == causal and r[impl].get(f"{pass_}_tflops")]
            if pts:
                ax.plot(*zip(*pts), st, label=f"bf16 {impl}")
        pts = [(r["N"], r["fp8_tflops"]) for r in res.get("fp8_speed", []) if r["causal"] == causal and r["fp8_tflops"]]
        if pts:
            ax.plot(*zip(*pts), "D-", label="fp8 ours (kernel)")
        ax.set_title(f"d=128 forward, {'causal' if causal else 'non-causal'}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[2]
    acc = [r for r in res.get("fp8_accuracy", []) if not r["causal"]]
    if acc:
        x = range(len(acc))
        ax.bar([i - 0.27 for i in x], [r["bf16_rel"] for r in acc], 0.27, label="bf16")
        ax.bar(list(x), [r["fp8_plain_rel"] for r in acc], 0.27, label="fp8")
        ax.bar([i + 0.27 for i in x], [r["fp8_hadamard_rel"] for r in acc], 0.27, label="fp8 + Hadamard")
        ax.set_xticks(list(x), [f"{r['inputs']}\nx{r['factor']}" for r in acc], fontsize=8)
        ax.set_yscale("log")
        ax.set_title("forward error vs float64 (non-causal)")
        ax.legend(fontsize=8)
    ax = axes[3]
    pe = res.get("persistent", [])
    if pe:
        keys = ("grid_naive", "grid_lpt", "grid_lpt_l2", "persistent_naive", "persistent_lpt", "persistent_lpt_l2",
                "flash_fwd")
        x = range(len(pe))
        for i, key in enumerate(keys):
            ax.bar([j + (i - 3) * 0.12 for j in x], [r[f"{key}_tflops"] for r in pe], 0.12, label=key)
        ax.set_xticks(list(x), [f"N={r['N']}" if r["lens"] is None else "mixed" for r in pe], fontsize=8)
        ax.set_title("causal d=128: persistent LPT vs one program per item")
        ax.set_ylabel("TFLOP/s")
        ax.legend(fontsize=7)
    fig.suptitle(res["gpu"])
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--parts", default="checks,main,variants,fp8_speed,fp8_accuracy,persistent")
    ap.add_argument("--profile", action="store_true", help="run each d=128 N=8k forward once (for ncu) and exit")
    ap.add_argument("--quick", action="store_true", help="fewer sequence lengths")
    ap.add_argument("--suffix", default="", help="appended to the output file names (e.g. a re-run of one part)")
    ap.add_argument("--seqlens", default=None, help="comma-separated N for the bf16 table (default 512..16k)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_hopper.py needs a CUDA GPU")
    if args.profile:
        return profile_once()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    log, lines = timestamped_log(t0)

    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "capability": list(torch.cuda.get_device_capability()),
           "convention": "batch*seqlen=16384, hidden=2048, heads=2048/d, bf16; fwd flops 4BHN^2d (x0.5 causal), "
                         "bwd 2.5x fwd; do_bench(warmup=10 ms, rep=40 ms) medians"}
    tag = gpu_tag()
    path = os.path.join(args.out, f"{tag}-hopper{args.suffix}.json")

    def dump():
        res["seconds"] = time.time() - t0
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    res["matmul_TFLOPs"] = matmul_tflops()
    log(f"{res['gpu']} matmul {res['matmul_TFLOPs']:.0f} TFLOP/s")
    parts = args.parts.split(",")
    seq = SEQLENS if not args.quick else [2048, 8192]
    if args.seqlens:
        seq = [int(n) for n in args.seqlens.split(",")]
    steps = [("checks", lambda: checks(log)), ("main", lambda: main_table(log, seq)),
             ("variants", lambda: variants(log, [2048, 8192])),
             ("fp8_speed", lambda: fp8_speed(log, FP8_SEQLENS if not args.quick else [8192])),
             ("fp8_accuracy", lambda: fp8_accuracy(log)),
             ("persistent", lambda: persistent(log, PERSISTENT_SEQLENS if not args.quick else [8192]))]
    for name, fn in steps:
        if name not in parts:
            continue
        try:
            res[name] = fn()
        except Exception as e:  # noqa: BLE001  (keep what the other parts measured)
            res[name + "_error"] = traceback.format_exc()[-3000:]
            log(f"{name} FAILED: {type(e).__name__}: {e}")
        dump()
    try:
        plot(res, os.path.join(args.out, f"{tag}-hopper{args.suffix}.png"))
    except Exception as e:  # noqa: BLE001
        log(f"plot failed: {e}")
    res["log"] = lines
    dump()
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
