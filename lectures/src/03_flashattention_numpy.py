# %% [markdown]
# # Lecture 3 — FlashAttention-2 in NumPy: tiling
#
# **Learning objectives.** After this lecture you can:
#
# 1. Trace Algorithm 1 of FlashAttention-2 for one query block, naming what each line keeps on chip.
# 2. Show that the tiled forward is exact for any block sizes, shapes and masks (against float64).
# 3. Count the tiles a causal forward visits and which of them need an element-wise mask.
# 4. Measure that the forward's memory grows linearly in $N$.
#
# FlashAttention computes *exact* attention by blocks so that the $N \times N$ matrices never reach HBM. Its two
# techniques (seeds):
#
# 1. **Tiling** — restructure the algorithm to load query/key/value block by block from global memory to
#    shared memory (SRAM), compute attention for the block on chip, and update the output by **rescaling**
#    (lecture 1's $(m, \ell)$ merge).
# 2. **Recomputation** — do not store the attention matrix for the backward pass; recompute it from the inputs
#    and the saved softmax statistics (lecture 4).
#
# This lecture walks through the forward pass, FlashAttention-2's Algorithm 1, with
# `reference.numpy.flash.flash_attention_forward`. NumPy has no SRAM: "on chip" here means "one small array",
# and the reference never holds more than one $B_r \times B_c$ tile of $S$ at a time.
#
# **Reading path:** lecture 2 → this lecture → lecture 4 → assignment `a2_flash_numpy`.

# %%
import math

import numpy as np

from lectures._exercise import check_guess
from lectures._measure import peak_mb
from lectures._plots import load_results, not_run, setup, tile_grid
from reference.simulators.scheduling import tile_visits
from reference.numpy.attention import attention
from reference.numpy.flash import flash_attention_forward
from reference.numpy.softmax import merge_softmax_stats, softmax_stats

plt = setup()
rng = np.random.default_rng(3)

# %% [markdown]
# ## 1. Algorithm 1 (FlashAttention-2 forward)
#
# **Require:** $Q, K, V \in \mathbb{R}^{N\times d}$ in HBM, block sizes $B_c, B_r$.
#
# 1. Divide $Q$ into $T_r = \lceil N/B_r \rceil$ blocks $Q_1..Q_{T_r}$ of size $B_r \times d$, and $K, V$ into
#    $T_c = \lceil N/B_c\rceil$ blocks of size $B_c \times d$.
# 2. Divide the output $O$ into $T_r$ blocks $O_i$ and the logsumexp $L$ into $T_r$ blocks $L_i$.
# 3. **for** $1 \le i \le T_r$:
# 4. &nbsp;&nbsp; load $Q_i$ from HBM to SRAM;
# 5. &nbsp;&nbsp; on chip, $O_i^{(0)} = 0$, $\ell_i^{(0)} = 0$, $m_i^{(0)} = -\infty$;
# 6. &nbsp;&nbsp; **for** $1 \le j \le T_c$:
# 7. &nbsp;&nbsp;&nbsp;&nbsp; load $K_j, V_j$ from HBM to SRAM;
# 8. &nbsp;&nbsp;&nbsp;&nbsp; $S_i^{(j)} = Q_i K_j^\top$;
# 9. &nbsp;&nbsp;&nbsp;&nbsp; $m_i^{(j)} = \max(m_i^{(j-1)}, \mathrm{rowmax}(S_i^{(j)}))$,
#    $\tilde P_i^{(j)} = \exp(S_i^{(j)} - m_i^{(j)})$,
#    $\ell_i^{(j)} = e^{m_i^{(j-1)} - m_i^{(j)}} \ell_i^{(j-1)} + \mathrm{rowsum}(\tilde P_i^{(j)})$;
# 10. &nbsp;&nbsp;&nbsp;&nbsp; $O_i^{(j)} = \mathrm{diag}(e^{m_i^{(j-1)} - m_i^{(j)}})\, O_i^{(j-1)} + \tilde P_i^{(j)} V_j$;
# 12. &nbsp;&nbsp; $O_i = \mathrm{diag}(\ell_i^{(T_c)})^{-1} O_i^{(T_c)}$;
# 13. &nbsp;&nbsp; $L_i = m_i^{(T_c)} + \log \ell_i^{(T_c)}$;
# 14–15. write $O_i$ and $L_i$ to HBM.
#
# (The FA2 paper and the slides print line 10's factor as $\mathrm{diag}(e^{m^{(j-1)} - m^{(j)}})^{-1}$; the
# running output must be *multiplied* by $e^{m^{(j-1)} - m^{(j)}} \le 1$, as written here and in the reference.)
#
# Compared with lecture 1's merge rule, two things are new: the output $O_i$ is carried **unnormalised** (only
# $\tilde P$, never $P$), so the one division happens once per row at line 12; and line 13 stores the
# logsumexp $L = m + \log \ell$ — one number per row, all the backward pass needs (lecture 4).

# %% [markdown]
# ## 2. Lines 5–13 by hand, for one query block
#
# The loop below is Algorithm 1 for a single block $i$ with explicit prints, so you can watch $m$ grow and
# $\ell$ and $O$ being rescaled. The reference computes all blocks (and heads) the same way.

# %%
N, d, Br, Bc = 24, 8, 6, 8
Q, K, V = (rng.standard_normal((N, d)) for _ in range(3))
scale = 1 / math.sqrt(d)

i = 2                                                      # third query block: rows 12..17
Qi = Q[i * Br:(i + 1) * Br] * scale                        # line 4 (scale folded into Q once)
Oi, li, mi = np.zeros((Br, d)), np.zeros(Br), np.full(Br, -np.inf)   # line 5
for j in range(math.ceil(N / Bc)):                         # line 6
    Kj, Vj = K[j * Bc:(j + 1) * Bc], V[j * Bc:(j + 1) * Bc]  # line 7
    Sij = Qi @ Kj.T                                         # line 8
    m_new = np.maximum(mi, Sij.max(axis=1))                 # line 9
    Pt = np.exp(Sij - m_new[:, None])
    li = np.exp(mi - m_new) * li + Pt.sum(axis=1)
    Oi = np.exp(mi - m_new)[:, None] * Oi + Pt @ Vj         # line 10
    mi = m_new
    print(f"j={j}: m[0]={mi[0]:+.3f}  l[0]={li[0]:.3f}  |O[0]|={np.linalg.norm(Oi[0]):.3f}")
Oi = Oi / li[:, None]                                      # line 12
Li = mi + np.log(li)                                       # line 13

o_ref, lse_ref = flash_attention_forward(Q, K, V, block_q=Br, block_k=Bc)
print("block i by hand == reference rows:", np.allclose(Oi, o_ref[i * Br:(i + 1) * Br]),
      np.allclose(Li, lse_ref[i * Br:(i + 1) * Br]))
print("(m, l) merge of lecture 1 gives the same L:",
      np.allclose(Li, [float(m + np.log(l)) for m, l in
                       [merge_softmax_stats(*softmax_stats(s[:12]), *softmax_stats(s[12:]))
                        for s in (Q[i * Br:(i + 1) * Br] * scale) @ K.T]]))

# %% [markdown]
# ## 3. Exact, for any block sizes, shapes and masks
#
# FlashAttention is not an approximation: for every block size (including ragged last tiles), causal or not,
# with GQA and in float16, it matches standard attention up to rounding.

# %%
for (nq, nk, bq, bk, causal) in ((100, 100, 64, 64, False), (100, 100, 16, 48, True), (37, 129, 8, 32, True),
                                 (1, 257, 64, 64, True)):
    q = rng.standard_normal((2, 4, nq, 32)); k = rng.standard_normal((2, 2, nk, 32)); v = rng.standard_normal((2, 2, nk, 32))
    o, lse = flash_attention_forward(q, k, v, causal=causal, block_q=bq, block_k=bk)
    o_ref, lse_ref = attention(q, k, v, causal=causal, return_lse=True)
    print(f"Nq={nq:3d} Nk={nk:3d} blocks {bq:2d}x{bk:2d} causal={causal!s:5}  GQA 4q/2kv heads:  "
          f"max|dO|={np.abs(o - o_ref).max():.1e}  max|dL|={np.abs(lse - lse_ref).max():.1e}")
q16, k16, v16 = ((rng.standard_normal((256, 64)) * 3).astype(np.float16) for _ in range(3))
o16, _ = flash_attention_forward(q16, k16, v16)      # logits in the tens: e^x overflows float16 above 11.09
print("float16 input, logits up to", float(np.abs(q16.astype(float) @ k16.T.astype(float) / 8).max().round(1)),
      "-> finite:", np.isfinite(o16).all(), " max err vs float64:",
      np.abs(o16 - attention(q16.astype(np.float64), k16.astype(np.float64), v16.astype(np.float64))).max())

# %% [markdown]
# ## 4. The tiling "animation", as a picture of the tiles visited
#
# The seeds show an animation (Francisco Massa) of the blocks moving through SRAM. Frozen into one figure: each
# square is a $B_r \times B_c$ tile of $S$, numbered in the order Algorithm 1 computes it — the outer loop
# walks down the query blocks, the inner loop across the key blocks. Each tile is touched exactly once and
# immediately folded into $O_i$; none is ever written to HBM.
#
# With a **causal** mask, tiles entirely above the diagonal contain only masked entries, so FlashAttention
# skips them: it neither loads their $K_j, V_j$ nor computes them. Only the tiles on the diagonal pay for a
# mask; those below it run unmasked. That removes almost half the work.
#
# **Predict, then run.** $N = 512$, $64 \times 64$ tiles: 64 tiles without a mask. How many does the causal
# pass compute?

# %%
guess = None  # your answer, a number of tiles
check_guess(guess, int((tile_visits(512, 512, 64, 64, causal=True) > 0).sum()), rel=0,
            what="tiles computed, causal, N=512, 64x64 tiles")
full = tile_visits(512, 512, 64, 64)
causal = tile_visits(512, 512, 64, 64, causal=True)
chunk = tile_visits(192, 512, 64, 64, causal=True)         # Nq < Nk: bottom-right alignment
fig, ax = plt.subplots(1, 3, figsize=(10, 3.6))
tile_grid(ax[0], full, "non-causal: all 64 tiles", annotate=True)
tile_grid(ax[1], causal, f"causal: {np.count_nonzero(causal)} of 64 tiles", cmap="Oranges", annotate=True)
tile_grid(ax[2], chunk, f"causal, Nq=192 < Nk=512", cmap="Greens", annotate=True)
plt.tight_layout()
for n_blocks in (8, 32, 128):
    t = tile_visits(n_blocks * 64, n_blocks * 64, 64, 64, causal=True)
    print(f"T={n_blocks:4d} blocks: causal visits {np.count_nonzero(t) / t.size:.3f} of the tiles "
          f"(-> 1/2 + 1/(2T))")

# %%
# Time follows the tile count. Measured on an H200 with the course's Triton kernel (timings change from run
# to run, so they are read from the committed benchmark file, `benchmarks/results/h200-attention.json`):
for path, res in load_results("h200-attention.json"):
    rows = {(r["causal"], r["N"]): r["ours"]["fwd_ms"] for r in res["attention"] if r["d"] == 64}
    for n in sorted({n for _, n in rows}):
        visited = np.count_nonzero(tile_visits(n, n, 128, 128, True)) / (n // 128) ** 2
        print(f"N={n:5d}, d=64: causal / non-causal forward time {rows[True, n] / rows[False, n]:.2f}, "
              f"128 x 128 tiles visited {visited:.2f}")

# %% [markdown]
# ## 5. Memory is linear in the sequence length
#
# Standard attention holds $S$ (and $P$): $\Theta(N^2)$ memory. FlashAttention holds $Q, K, V, O$, the
# statistics $L$ ($N$ numbers) and one tile: $\Theta(Nd)$. Measured right here with `tracemalloc` (peak
# allocation of one forward call, float32, $d = 64$, one head).
#
# **Predict, then run.** From $N = 1024$ to $N = 2048$, by what factor does the peak memory of the *standard*
# implementation grow?

# %%
ns = [256, 512, 1024, 2048]
naive_mb, tiled_mb = [], []
for n in ns:
    q, k, v = (rng.standard_normal((n, 64)).astype(np.float32) for _ in range(3))
    naive_mb.append(peak_mb(lambda: attention(q, k, v, return_lse=True)))
    tiled_mb.append(peak_mb(lambda: flash_attention_forward(q, k, v)))
    print(f"N={n:5d}: naive {naive_mb[-1]:7.2f} MB   tiled {tiled_mb[-1]:6.2f} MB   ratio {naive_mb[-1] / tiled_mb[-1]:5.1f}x")
guess = None  # your answer, a number
check_guess(guess, naive_mb[-1] / naive_mb[-2], what="standard peak memory, N=2048 / N=1024")
print(f"(the tiled forward's peak grew {tiled_mb[-1] / tiled_mb[-2]:.2f}x)")
fig, ax = plt.subplots(figsize=(5.5, 3))
ax.loglog(ns, naive_mb, "s-", label="standard (materialises S, P)")
ax.loglog(ns, tiled_mb, "o-", label="FlashAttention-2 tiled (64x64)")
ax.set_xlabel("sequence length N"); ax.set_ylabel("peak MB (one call)"); ax.legend(fontsize=8)
ax.set_title("measured in this notebook")
plt.tight_layout()

# %% [markdown]
# The CPU benchmark (`make bench-cpu`, `benchmarks/course/cpu_numpy.py`) measures the same up to $N = 4096$ together
# with run time; docs/design.md §7 asks the tiled forward to stay within 3x the naive time and under 1/10 of its peak
# memory. If its result file is present, here it is:

# %%
runs = load_results("cpu-numpy.json")
if not runs:
    not_run("CPU NumPy benchmark", "cpu-numpy.json")
else:
    path, res = runs[0]
    m = res["machine"]
    print(f"benchmarks/results/{path.name}: d={res['d']}, {res['dtype']}, one head, "
          f"{'causal' if res.get('causal') else 'full'} attention, {m.get('machine')} with {m.get('cpu_count')} cores")
    rows0 = res["runs"][0]["rows"]
    tiles = sorted({k[5:-6] for k in rows0[0] if k.startswith("tiled") and k.endswith("_fwd_s")})
    xs = [r["N"] for r in rows0]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3))
    ax[0].loglog(xs, [r["naive_fwd_peak_bytes"] / 1e6 for r in rows0], "s-", label="naive")
    for t in tiles:
        ax[0].loglog(xs, [r[f"tiled{t}_fwd_peak_bytes"] / 1e6 for r in rows0], "o-", label=f"tiled {t}")
    for run, ls in zip(res["runs"], ("-", ":", "--")):
        rows = run["rows"]
        ax[1].loglog(xs, [r["naive_fwd_s"] * 1e3 for r in rows], "s" + ls, label=f"naive, {run['label']}")
        for t in tiles:
            ax[1].loglog(xs, [r[f"tiled{t}_fwd_s"] * 1e3 for r in rows], "o" + ls, label=f"tiled {t}, {run['label']}")
        last = rows[-1]
        for t in tiles:
            print(f"{run['label']:18s} N={last['N']}, tiles {t:7s}: forward time "
                  f"{last[f'tiled{t}_fwd_s'] / last['naive_fwd_s']:5.2f}x naive, peak memory "
                  f"{last[f'tiled{t}_fwd_peak_bytes'] / last['naive_fwd_peak_bytes']:.3f}x naive")
    ax[0].set_ylabel("peak MB (forward)"); ax[1].set_ylabel("forward ms (median)")
    for a in ax:
        a.set_xlabel("N"); a.legend(fontsize=6)
    fig.suptitle(f"benchmarks/results/{path.name} (wall times on a shared machine are noisy)")
    plt.tight_layout()

# %% [markdown]
# ## 6. What this bought on GPUs, and the limits (seeds)
#
# Numbers quoted from the FlashAttention paper and talk (A100), not measured here:
#
# * **2–4x speedup** end to end for attention, with no approximation; **10–20x memory reduction**, memory
#   linear in sequence length.
# * Training time, 8x A100: GPT-2 small — HuggingFace 9.5 days, Megatron-LM 4.7 days, FlashAttention
#   2.7 days (3.5x); GPT-2 medium — 21.0, 11.5, 6.9 days (3.0x). Longer sequences (GPT-3 at 2K and 8K
#   context) become trainable at all.
#
# Limitations the presenters list: the kernels are GPU-specific CUDA (each GPU has its own best block sizes,
# because $B_c$ and $B_r$ follow from the SRAM size); no multi-GPU FlashAttention (GPU-to-GPU transfer is an
# even slower memory level); and at inference time with batch size 1 and one query, it cannot use the GPU's
# parallelism — lecture 7. On H100 FlashAttention-2 reaches only 35–40% of peak, which is what FlashAttention-3
# fixes (lecture 6). Lecture 5 shows how the loops of Algorithm 1 are mapped onto a GPU.
