# %% [markdown]
# # Lecture 2 — IO-awareness: attention is bottlenecked by memory, not FLOPs
#
# **Learning objectives.** After this lecture you can:
#
# 1. Classify an operation as memory- or compute-bound from its arithmetic intensity and the GPU's balance.
# 2. Reproduce the 40.3 GB vs 4.4 GB HBM table with the IO model and explain the difference.
# 3. State the $\Theta(N^2 d^2 / M)$ law and predict how the traffic changes with $M$.
# 4. Explain how tiling cuts a matmul's HBM traffic, and why the same idea applies to attention.
#
# *"The biggest cost is in moving the bits!"* (Tri Dao). This lecture quantifies that sentence with an IO
# model of a GPU (`reference.simulators.iosim`): HBM plus a small on-chip SRAM, counting every byte an algorithm moves
# between them. It reproduces the seeds' table (standard attention 40.3 GB vs FlashAttention 4.4 GB of HBM
# traffic) and FlashAttention's $\Theta(N^2 d^2 / M)$ law, and shows the same idea on the textbook example,
# tiled matrix multiplication.
#
# **Reading path:** lecture 1 → this lecture → lecture 3 (FlashAttention in NumPy).

# %%
import numpy as np

from lectures._exercise import check_guess
from lectures._plots import setup
from reference.simulators import iosim

plt = setup()

# %% [markdown]
# ## 1. The GPU memory hierarchy
#
# | level | bandwidth | size | who can read it |
# |---|---|---|---|
# | SRAM (per-SM shared memory / L1), all SMs together | **19 TB/s** | **20 MB** | the threads of one block |
# | HBM (device global memory) | **1.5 TB/s** | **80 GB** (A100 80GB; the paper's 40GB A100: 40 GB) | every thread |
# | CPU DRAM (FlashAttention paper's figure) | 12.8 GB/s | > 1 TB | over PCIe |
#
# On-chip SRAM is ~13x faster than HBM but ~4000x smaller. An operation's inputs start in HBM, are moved to
# SRAM and registers to compute, and the output is written back to HBM. **IO-aware** algorithms count these
# moves and restructure the computation to make fewer of them — an old idea: database joins (registers, cache,
# disk), Halide for image processing, communication-avoiding linear algebra. FlashAttention applies it to
# attention.

# %%
levels = ["SRAM", "HBM", "CPU DRAM"]
bandwidth = [19e12, 1.5e12, 12.8e9]
size = [20e6, 80e9, 1e12]
fig, ax = plt.subplots(1, 2, figsize=(7.5, 2.6))
ax[0].bar(levels, bandwidth, color=["tab:green", "tab:blue", "tab:gray"]); ax[0].set_yscale("log")
ax[0].set_title("bandwidth (bytes/s)")
ax[1].bar(levels, size, color=["tab:green", "tab:blue", "tab:gray"]); ax[1].set_yscale("log")
ax[1].set_title("capacity (bytes)")
plt.tight_layout()
print(f"SRAM/HBM: {19e12 / 1.5e12:.1f}x the bandwidth, 1/{80e9 / 20e6:.0f} of the size")

# %% [markdown]
# ## 2. Memory-bound vs compute-bound
#
# An operation is **compute-bound** when most time goes to arithmetic (a Fibonacci loop: a few registers, no
# memory traffic at all) and **memory-bound** when most time goes to waiting for reads and writes. Which one
# depends on its *arithmetic intensity* — FLOPs per byte of HBM traffic — compared with the machine's ratio of
# peak FLOP/s to bandwidth. An A100 does 312 TFLOP/s on fp16 tensor cores and moves 1.5 TB/s, so an operation
# needs ~208 FLOPs per byte to keep the tensor cores busy (the *ridge point* of the roofline).
#
# The **memory wall**: processor throughput has improved faster than memory bandwidth for decades, so
# memory-bound computations are likely to stay memory-bound. The ops inside standard attention:

# %%
peak, bw = iosim.A100["matmul_flops"], iosim.A100["hbm_bandwidth"]
N, d, e = 1024, 64, 2        # one head, fp16
ops = {
    "softmax (elementwise)": (5 * N * N, 2 * N * N * e),                 # read S, write P
    "mask / dropout / scale": (1 * N * N, 2 * N * N * e),
    "S = QK^T  (d=64)": (2 * N * N * d, (2 * N * d + N * N) * e),          # read Q, K; write S
    "O = PV    (d=64)": (2 * N * N * d, (N * N + 2 * N * d) * e),
    "big matmul 4096^3": (2 * 4096**3, 3 * 4096**2 * e),
}
xs = np.logspace(-1, 4, 200)
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.loglog(xs, np.minimum(peak, xs * bw) / 1e12, "k-", label="A100 roofline")
for name, (fl, by) in ops.items():
    ai = fl / by
    attainable = min(peak, ai * bw)
    ax.loglog(ai, attainable / 1e12, "o", label=f"{name}: {ai:.1f} FLOP/B")
    print(f"{name:24s} intensity {ai:8.1f} FLOP/byte -> {'compute' if ai > peak / bw else 'memory'}-bound")
ax.axvline(peak / bw, color="gray", ls=":")
ax.set_xlabel("arithmetic intensity (FLOPs per HBM byte)"); ax.set_ylabel("attainable TFLOP/s")
ax.legend(fontsize=7, loc="lower right")
plt.tight_layout()

# %% [markdown]
# Everything in standard attention except a large matmul sits left of the ridge: the elementwise passes do a
# handful of FLOPs per byte, and even $S = QK^\top$ with $d = 64$ is memory-bound because its output
# ($N^2$ elements) is larger than its inputs ($2Nd$). **Attention computation is memory-bound.** This is also
# why approximate attention — sparse (Reformer buckets similar queries and keys) or low-rank (Linformer
# projects $K, V$ to a lower rank) — trades quality for *fewer FLOPs* and often does not get faster in wall-clock
# time: FLOPs were not the bottleneck.

# %% [markdown]
# ## 3. Counting the bytes: the seeds' table
#
# Standard attention runs each step as its own kernel, and each kernel reads its inputs from HBM and writes
# its output to HBM: $S$ is written, read back for the mask, written, read for the softmax, $P$ written, read
# for dropout and for $PV$ … and the backward pass reads them all again. FlashAttention (lecture 3) fuses
# everything into one kernel that never writes $S$ or $P$. The seeds quote, for GPT-2 medium on an A100
# (batch 64, 16 heads, $N = 1024$, $d = 64$, forward + backward):
#
# | | Standard | FlashAttention |
# |---|---|---|
# | GFLOPs | 66.6 | 75.2 (+13%) |
# | HBM reads/writes | 40.3 GB | 4.4 GB (9x less) |
# | runtime | 41.7 ms | 7.3 ms (6x faster) |
#
# `reference.simulators.iosim` counts the bytes pass by pass (its docstring states every convention):

# %%
table = iosim.seeds_table()

# %% [markdown]
# Where the standard implementation's 40 GB come from — each $N \times N$ fp16 matrix over the 1024
# (batch, head) pairs is 2.15 GB, and it is moved 18 times:

# %%
cfg = (64, 16, 1024, 64)
std = iosim.standard_attention_io(*cfg, mask=True, dropout=0.1)
fa = iosim.flash_attention_io(*cfg, dropout=0.1)
print(std.table())
print()
print(fa.table())

fig, ax = plt.subplots(figsize=(7, 2.6))
kinds = [("standard", std), ("FlashAttention", fa)]
ax.barh([k for k, _ in kinds], [r.hbm_bytes / 1e9 for _, r in kinds], color=["tab:red", "tab:green"])
ax.barh(["standard", "FlashAttention"], [40.3, 4.4], fill=False, edgecolor="k", ls="--", label="seeds' figure")
for i, (_, r) in enumerate(kinds):
    ax.text(r.hbm_bytes / 1e9 + 0.5, i, f"{r.hbm_bytes / 1e9:.1f} GB (model)", va="center")
ax.set_xlabel("HBM reads + writes, forward + backward (GB)"); ax.legend(loc="lower right")
plt.tight_layout()

# %% [markdown]
# What the model reproduces and what it does not (all stated in `reference/simulators/iosim.py`):
#
# * **HBM traffic**: 40.3 GB modelled vs 40.3 GB; 4.6 GB vs 4.4 GB for FlashAttention (FA1 blocks for a
#   192 KiB SRAM). Ratio 8.7x vs the seeds' 9.2x.
# * **FLOPs**: the *ratio* is reproduced — recomputation in the backward costs 17% more matmul FLOPs (seeds:
#   13% more). The seeds' absolute GFLOPs are off by a factor ~12 (acknowledged by the first author in the
#   flash-attention issue tracker); the model's 825/962 GFLOPs are the matmul counts.
# * **Runtime**: only a roofline lower bound (26.8 ms vs 3.9 ms, 6.9x) against the measured 41.7 vs 7.3 ms
#   (5.7x). More FLOPs, 9x fewer bytes, 6x faster: **the bytes decide**.

# %%
r = table["ratios"]
print(f"HBM: standard / flash = {r['hbm']:.2f}x (seeds {r['seeds_hbm']:.2f}x)")
print(f"FLOPs: flash / standard = {r['matmul_flops']:.3f} (seeds {r['seeds_flops']:.3f})")
print(f"runtime: roofline estimate {r['runtime']:.1f}x, seeds measured {r['seeds_runtime']:.1f}x")

# %% [markdown]
# ## 4. The $\Theta(N^2 d^2 / M)$ law
#
# FlashAttention paper, Theorem 2: with SRAM of size $M$ (elements) and $d \le M \le Nd$, standard attention
# needs $\Theta(Nd + N^2)$ HBM accesses and FlashAttention $\Theta(N^2 d^2 M^{-1})$. The paper's proof counts
# **FlashAttention-1's loop order**: the outer loop runs over key/value blocks, a tile of
# $B_c = \lceil M / 4d \rceil$ keys stays in SRAM, and $Q$, $O$ (and the statistics $\ell, m$) are streamed
# past it, $T_c = N / B_c = 4Nd/M$ times; each stream moves $Nd$ elements: $4N^2d^2/M$ (FA1 also writes $O$
# back every time: reads *and* writes).
#
# **FlashAttention-2 swaps the loops** (lecture 3's Algorithm 1): the outer loop runs over query blocks, $Q_i$
# and the running $O_i, \ell_i, m_i$ stay on chip, and $K$, $V$ are streamed, $T_r = N / B_r$ times. With
# $B_r = \Theta(M/d)$ the traffic is again $\Theta(N^2 d^2/M)$, but $O$ is written **once**, at the end, and
# no statistics travel through HBM:
#
# | | on chip for a whole inner loop | streamed through HBM | passes |
# |---|---|---|---|
# | FlashAttention-1 | $K_j, V_j$ | $Q$, $O$, $\ell$, $m$ (read **and written** every pass) | $T_c = N/B_c$ |
# | FlashAttention-2 | $Q_i$, $O_i$, $\ell_i$, $m_i$ | $K$, $V$ (read only) | $T_r = N/B_r$ |
#
# The same law does not mean the same bytes: those depend on the block sizes. `reference.simulators.iosim` counts either
# order (`version="fa1"` with FA1's $B_c = \lceil M/4d \rceil$, $B_r = \min(B_c, d)$; `"fa2"` with
# $128 \times 128$ tiles). FA2's gain is not fewer HBM bytes — it is that each query block is independent
# (one thread block each, no communication: lecture 5) and that the rescaling work leaves the inner loop.
# The sweep below uses FA1's order, the one the theorem counts.
#
# **Predict, then run.** Forward, one head, $N = 4096$, $d = 64$, A100 SRAM: does FA2's order move more or fewer
# HBM bytes than FA1's, and by what factor (FA2 / FA1)?

# %%
guess = None  # your answer, a number (FA2 bytes / FA1 bytes)
io = {v: iosim.flash_attention_io(1, 1, 4096, 64, backward=False, version=v) for v in ("fa1", "fa2")}
for v, rep in io.items():
    print(f"{v}: blocks {rep.params['block_q']}x{rep.params['block_k']}, passes T_c={rep.params['t_c']} / "
          f"T_r={rep.params['t_r']}, HBM {rep.hbm_bytes / 1e6:.1f} MB")
check_guess(guess, io["fa2"].hbm_bytes / io["fa1"].hbm_bytes, what="FA2 / FA1 forward HBM bytes")

# %% [markdown]
# In this model FA2's order streams more bytes ($T_r = N/128$ passes over $K, V$ against FA1's $T_c = N/384$
# over $Q, O$) and FA2 still runs faster on a GPU, for the reasons above. Either way, since $d^2$ is much smaller than $M$
# (e.g. $64^2 = 4096$ vs ~100k elements), both are many times fewer accesses than $N^2$. The model shows the
# slopes on log-log axes. **Predict, then run:** the slope of FlashAttention's HBM bytes against $M$ on
# log-log axes (FA1's blocks, $N = 8192$, $d = 64$, $M$ from 8 to 128 KiB)? Assignment 2 asks you to recover it
# from your own forward's byte count.

# %%
sweep = iosim.scaling_sweep(verbose=False)
guess = None  # your answer, a number
check_guess(guess, sweep["vs_sram"]["flash_slope"], rel=0.05, what="log-log slope of FA bytes vs M")
fig, axes = plt.subplots(1, 3, figsize=(9, 2.9))
for ax, (key, xname, xl) in zip(axes, (("vs_sram", "sram_bytes", "SRAM M (bytes)"),
                                       ("vs_head_dim", "head_dim", "head dim d"),
                                       ("vs_seq_len", "seq_len", "sequence length N"))):
    s = sweep[key]
    ax.loglog(s[xname], np.array(s["flash_bytes"]) / 1e6, "o-", label=f"flash, slope {s['flash_slope']:+.2f}")
    ax.loglog(s[xname], np.array(s["standard_bytes"]) / 1e6, "s--", label=f"standard, slope {s['standard_slope']:+.2f}")
    ax.minorticks_off(); ax.set_xticks(s[xname])
    ax.set_xticklabels([f"{x // 1024}K" if key == "vs_sram" else str(x) for x in s[xname]], fontsize=8)
    ax.set_xlabel(xl); ax.legend(fontsize=7); ax.set_title(f"expected flash slope {s['expected']:+.0f}", fontsize=9)
axes[0].set_ylabel("HBM MB (fwd, 1 head)")
plt.tight_layout()

# %% [markdown]
# ## 5. The same idea on a matmul: tiling
#
# The seeds' notebook demo profiled three matrix multiplications with a GPU memory simulator. For
# $C = AB$ with $m = n = k$:
#
# * **naive** — each $C_{ij}$ loads row $i$ of $A$ and column $j$ of $B$: $2mnk$ element reads;
# * **row** — keep one row of $A$ in SRAM while all of $B$ streams past: $B$ is read $m$ times;
# * **tiled** — keep three $T \times T$ tiles ($T = \sqrt{M/3}$) in SRAM: $A$ and $B$ are each read $n/T$
#   times, $\Theta(mnk / \sqrt M)$ — and the big matmul becomes compute-bound.
#
# Tiling a matmul is standard. Attention resisted it because the softmax needs a whole row of $S$ before it can
# normalise; lecture 1's $(m, \ell)$ statistics remove that obstacle.

# %%
mm = {a: iosim.matmul_io(1024, 1024, 1024, algorithm=a) for a in ("naive", "row", "tiled")}
for a, rep in mm.items():
    print(f"{a:6s}: {rep.hbm_bytes / 1e9:8.3f} GB HBM traffic, intensity {rep.flops / rep.hbm_bytes:8.1f} FLOP/B")
ms = [12 * 1024, 48 * 1024, 192 * 1024, 768 * 1024]
tiled = [iosim.matmul_io(1024, 1024, 1024, sram_bytes=m).hbm_bytes for m in ms]
slope = np.polyfit(np.log(ms), np.log(tiled), 1)[0]
fig, ax = plt.subplots(1, 2, figsize=(8, 2.6))
ax[0].bar(list(mm), [r.hbm_bytes / 1e9 for r in mm.values()]); ax[0].set_yscale("log")
ax[0].set_ylabel("GB"); ax[0].set_title("1024^3 fp16 matmul, M = 192 KiB")
ax[1].loglog(ms, np.array(tiled) / 1e6, "o-"); ax[1].set_xlabel("SRAM M (bytes)"); ax[1].set_ylabel("MB")
ax[1].minorticks_off(); ax[1].set_xticks(ms); ax[1].set_xticklabels([f"{m // 1024}K" for m in ms])
ax[1].set_title(f"tiled traffic vs M: slope {slope:+.2f} (theory -0.5)")
plt.tight_layout()
