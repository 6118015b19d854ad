# %% [markdown]
# # Lecture 7 — Decoding — the KV cache, Flash-Decoding and recursive attention
#
# **Learning objectives.** After this lecture you can:
#
# 1. Compute the KV cache's size per token and say why decode is memory-bound.
# 2. Explain why FlashAttention-2 leaves most SMs idle at decode.
# 3. Split one query's keys across programs and merge the results exactly (Flash-Decoding).
# 4. Show that attention over a union of key sets is recovered from the parts' outputs and lse.
#
# Training processes whole sequences; generation produces **one token at a time**. That changes what is slow:
# the query shrinks to a single row, the keys and values of the whole history must be re-read at every step, and
# FlashAttention's parallelism over query blocks disappears. This lecture covers the KV cache
# (`reference.numpy.decoding.KVCache`, `reference.numpy.decoder_layer`), why FlashAttention idles during
# decoding, Flash-Decoding (`flash_decoding`) and the property that makes it exact: attention over a union of key
# sets can be merged from attention over the parts (`reference.numpy.merge`).
#
# **Reading path:** lecture 6 → this lecture → assignment `a4_decoding` → lecture 8.

# %%
import math

import numpy as np

from lectures._exercise import check_guess
from lectures._plots import load_results, not_run, setup
from reference.simulators import cycle_model as cyc
from reference.numpy.attention import attention
from reference.numpy.decoder_layer import TinyDecoderLayer, cache_savings
from reference.numpy.decoding import KVCache, flash_decoding
from reference.numpy.merge import merge_many, merge_states

plt = setup()
rng = np.random.default_rng(7)

# %% [markdown]
# ## 1. Autoregressive decoding: prefill, then one token at a time
#
# Generating "learning systems optimizations [EOS]" after the prompt "[Accelerating LLM requires machine]":
#
# * **Pre-filling phase** (iteration 0): process *all* prompt tokens at once — a normal causal attention with
#   many queries, the case FlashAttention was built for.
# * **Decoding phase** (every later iteration): process the *single* token generated in the previous iteration;
#   its query attends to the keys and values of **all previous tokens**.
# * **Key-value cache**: save the attention keys and values of every processed token for the following
#   iterations, instead of recomputing them.
#
# A one-layer decoder with random weights shows that prefill + cached decode steps give exactly what rerunning
# the whole sequence gives:

# %%
layer = TinyDecoderLayer(d_model=32, n_heads=4, n_kv_heads=2, max_len=64, seed=0)
prompt, new = rng.standard_normal((9, 32)), rng.standard_normal((6, 32))
outs = [layer.prefill(prompt)]
for x_t in new:                                   # six decode steps, one token each
    outs.append(layer.decode_step(x_t)[None, :])
cached = np.concatenate(outs)
full = layer.forward_full(np.concatenate([prompt, new]))
print("prefill + 6 decode steps == full recomputation:", np.allclose(cached, full), f"(max diff {np.abs(cached - full).max():.1e})")
print("cache:", layer.cache)

# %% [markdown]
# Without a cache, step $t$ projects keys/values for all $t$ tokens again and recomputes causal attention over
# $t$ rows: total work grows **quadratically** in the number of generated tokens. With the cache, each step
# projects one token and computes one attention row over $t$ keys. `cache_savings` counts it (a 4096-wide,
# 32-head model, 500-token prompt):

# %%
steps = [1, 10, 100, 1000, 4000]
sav = [cache_savings(500, n, d_model=4096, n_heads=32, n_kv_heads=8) for n in steps]
for n, s in zip(steps, sav):
    print(f"{n:5d} new tokens: K/V projections {s['kv_tokens_no_cache']:>10,d} tokens without cache vs "
          f"{s['kv_tokens_cache']:>5,d} with;  attention FLOPs {s['attn_flops_no_cache'] / s['attn_flops_cache']:6.0f}x fewer")
fig, ax = plt.subplots(figsize=(5.5, 3))
ax.loglog(steps, [s["attn_flops_no_cache"] + s["kv_flops_no_cache"] for s in sav], "s-", label="no cache")
ax.loglog(steps, [s["attn_flops_cache"] + s["kv_flops_cache"] for s in sav], "o-", label="KV cache")
ax.set_xlabel("generated tokens"); ax.set_ylabel("K/V-projection + attention FLOPs"); ax.legend()
plt.tight_layout()

# %% [markdown]
# The cache itself is a pre-allocated buffer per sequence that grows token by token; its size per token is
# $2 \times \text{layers} \times H_{kv} \times d \times$ bytes (lecture 0: GQA shrinks it). Decoding reads
# **all of it** at every step, which is why decode attention is memory-bound.

# %%
cache = KVCache(max_len=8, n_kv_heads=2, head_dim=4)
cache.append(rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 4)))    # prefill: 5 tokens
cache.append(rng.standard_normal((2, 1, 4)), rng.standard_normal((2, 1, 4)))    # one decode step
print(cache, "| filled view:", cache.k.shape, "| free slots:", cache.free)

# %% [markdown]
# ## 2. Why FlashAttention idles during decoding
#
# FlashAttention-2 parallelises over batch × heads × **query blocks** (lecture 5); within a thread block it walks
# the keys/values **sequentially**. In the decoding phase there is one query per sequence and head, so the grid
# has only batch × heads thread blocks, and each streams the whole context alone.
#
# **Predict, then run.** With batch 1 and 32 query heads on a 132-SM H100, what fraction of the SMs has work?

# %%
guess = None  # your answer, a fraction between 0 and 1
check_guess(guess, cyc.split_kv_time(1, 32, 65536, num_splits=1)["sm_utilisation"], rel=0.1,
            what="fraction of SMs busy, batch 1 x 32 heads")
for b, h in ((1, 32), (1, 8), (4, 32), (16, 32)):
    m = cyc.split_kv_time(b, h, 65536, num_splits=1)
    print(f"batch {b:2d} x {h:2d} heads = {m['blocks']:3d} thread blocks on 132 SMs: "
          f"{m['sm_utilisation']:5.1%} of the SMs busy")

# %% [markdown]
# Three quarters of the GPU has nothing to do, and the rest crawls through a long context. (The presenters make
# the same point for the A100: "during inference the batch size is commonly 1, so typically
# only one streaming multiprocessor can be used (A100 has 108)" — for one head; with all heads it is a few dozen.)
#
# ## 3. Flash-Decoding: parallelise across keys/values
#
# 1. Split the keys/values into small chunks;
# 2. compute attention of the query with each chunk using FlashAttention — **in parallel**, keeping each chunk's
#    output and log-sum-exp;
# 3. reduce over all splits.

# %%
n_splits, n_keys = 4, 64
fig, ax = plt.subplots(figsize=(8, 2.6))
for sp in range(n_splits):
    lo = sp * n_keys // n_splits
    ax.barh(1, n_keys // n_splits, left=lo, height=0.5, color=plt.cm.tab10(sp), edgecolor="white")
    ax.text(lo + n_keys / n_splits / 2, 1, f"keys {lo}..{lo + n_keys // n_splits - 1}\nprogram {sp}", ha="center",
            va="center", fontsize=8, color="white")
    ax.annotate(f"$(o_{sp}, L_{sp})$", xy=(n_keys / 2, -0.05), xytext=(lo + n_keys / n_splits / 2, 0.55),
                ha="center", fontsize=9, arrowprops=dict(arrowstyle="->", color="gray"))
ax.text(n_keys / 2, -0.3, "stage 2: merge  $L = \\log \\sum_s e^{L_s}$,  $o = \\sum_s e^{L_s - L}\\, o_s$",
        ha="center", va="center", fontsize=10, bbox=dict(boxstyle="round", fc="lightyellow"))
ax.set_ylim(-0.6, 1.4); ax.set_xlim(-1, n_keys + 1); ax.axis("off")
ax.set_title("Flash-Decoding, one (sequence, KV head): stage 1 in parallel over splits, stage 2 reduces")
plt.tight_layout()

# %% [markdown]
# With $S$ splits the grid has batch × heads × $S$ thread blocks. In the occupancy model (each thread block
# streams its keys at a fixed rate; blocks run in waves of 132):

# %%
ns = np.arange(1, 17)
model = [cyc.split_kv_time(1, 32, 65536, int(s), merge_cost=64) for s in ns]
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(ns, [model[0]["time"] / m["time"] for m in model], "o-")
ax.set_xlabel("num_splits"); ax.set_ylabel("speedup over 1 split")
ax.set_title("occupancy model: batch 1, 32 heads, 64k keys, 132 SMs")
plt.tight_layout()
best = max(range(len(ns)), key=lambda i: model[0]["time"] / model[i]["time"])
print(f"best: {ns[best]} splits ({model[best]['blocks']} blocks, one wave) -> "
      f"{model[0]['time'] / model[best]['time']:.1f}x; 5 splits need a second wave")

# %% [markdown]
# The NumPy reference does exactly the three steps (without the parallel hardware): it is exact for any number
# of splits, ragged sequence lengths and GQA:

# %%
B, Hq, Hkv, Nmax, d = 3, 8, 2, 300, 64
q = rng.standard_normal((B, Hq, d))
k, v = rng.standard_normal((B, Hkv, Nmax, d)), rng.standard_normal((B, Hkv, Nmax, d))
seq_lens = np.array([300, 17, 256])
for splits in (1, 4, 7, 64):
    o, lse = flash_decoding(q, k, v, num_splits=splits, seq_lens=seq_lens)
    err = max(np.abs(o[b] - attention(q[b][:, None, :], k[b, :, :seq_lens[b]], v[b, :, :seq_lens[b]])[:, 0]).max()
              for b in range(B))
    print(f"num_splits={splits:3d}: max |error| vs attention = {err:.1e}")

# %% [markdown]
# ## 4. Why it is exact: attention is associative and commutative (recursive attention)
#
# FlashInfer (MLSys 2025) states it for an index set $I$ of keys and pre-softmax scores
# $s_i = q k_i^\top / \sqrt d$:
#
# $$s(I) = \log \sum_{i \in I} \exp(s_i), \qquad v(I) = \sum_{i \in I} \mathrm{softmax}(s)_i\, v_i = \frac{\sum_{i\in I} \exp(s_i)\, v_i}{\exp(s(I))} .$$
#
# $s(\{i\}) = s_i$ and $v(\{i\}) = v_i$; for $I = \{1..t\}$, $v(I)$ is the attention output. For any partition
# $I = \bigcup_j I_j$:
#
# $$s\Big(\bigcup_j I_j\Big) = \log \sum_j \exp(s(I_j)), \qquad v\Big(\bigcup_j I_j\Big) = \sum_j \mathrm{softmax}\big([s(I_1), s(I_2), \ldots]\big)_j\, v(I_j) .$$
#
# So $(v, s)$ pairs — an attention output and its log-sum-exp — can be combined recursively, in any order and
# grouping: divide and conquer. It is lecture 1's $(m, \ell)$ rule with $s = m + \log \ell$. `merge_states`
# implements one combination:

# %%
qv = rng.standard_normal((1, 16)); K = rng.standard_normal((40, 16)); V = rng.standard_normal((40, 16))
parts = np.array_split(rng.permutation(40), 5)            # any partition, not even contiguous
states = [attention(qv, K[p], V[p], return_lse=True) for p in parts]
o_ref, lse_ref = attention(qv, K, V, return_lse=True)

o_seq, lse_seq = states[0]                                 # left to right (FlashAttention's order)
for o_j, lse_j in states[1:]:
    o_seq, lse_seq = merge_states(o_seq, lse_seq, o_j, lse_j)
ab = merge_states(*states[0], *states[1]); cd = merge_states(*states[2], *states[3])
o_tree, lse_tree = merge_states(*merge_states(*ab, *cd), *states[4])   # a tree (Flash-Decoding's reduction)
o_all, lse_all = merge_many([s[0] for s in states[::-1]], [s[1] for s in states[::-1]])  # reversed order
for name, (o_, l_) in (("sequential", (o_seq, lse_seq)), ("tree", (o_tree, lse_tree)), ("reversed", (o_all, lse_all))):
    print(f"{name:10s}: max |o - o_ref| = {np.abs(o_ - o_ref).max():.1e}, |lse - lse_ref| = {np.abs(l_ - lse_ref).max():.1e}")
empty = (np.zeros((1, 16)), np.full(1, -np.inf))           # an empty key set is the identity
print("merging with an empty set changes nothing:", np.allclose(merge_states(*states[0], *empty)[0], states[0][0]))

# %% [markdown]
# **Predict, then run.** Two splits of a sequence both finish with log-sum-exp $s(I_1) = s(I_2) = 1$. What is
# $s(I_1 \cup I_2)$, and with what weight does each split's output enter the merged one?

# %%
guess = None  # your answer for s(I1 u I2), a number
o12, s12 = merge_states(np.eye(2)[:1], np.ones(1), np.eye(2)[1:], np.ones(1))
check_guess(guess, float(s12[0]), rel=0.01, what="merged log-sum-exp")
print("weights of the two outputs:", o12[0].tolist())

# %% [markdown]
# ## 5. On a GPU: the course's Triton decode kernel
#
# `reference.triton.flash_decode` is the split-KV kernel (stage 1: one program per (sequence, kv head, split)
# with GQA packing — the query heads of a group share each K/V load; stage 2: the merge), with a heuristic choice
# of `num_splits` that fills the GPU. The seeds claim **"Flash-Decoding is up to 8x faster than prior work"**
# (the PyTorch blog, Oct 2023, CodeLlama-34B, against FlashAttention-2 and a native PyTorch implementation at long
# context). "Prior work" needs care, because a decode baseline without splits can be parallel in two ways:
#
# * `one_split` is the course's decode kernel with one split: one program per (sequence, **KV** head), the four
#   query heads of a GQA group packed into it — **8 programs** at batch 1 (Hkv = 8) on a GPU with 132 SMs.
# * `fa2_per_qhead` is FlashAttention-2's parallelism at decode time: one program per (sequence, **query**
#   head) — **32 programs** at batch 1, as counted in section 2 — each walking its KV head's whole cache
#   (the course's FA2 forward kernel on a one-token query).
#
# The gain against `fa2_per_qhead` is the comparison behind the seeds' "up to 8x" (Flash-Decoding vs
# FlashAttention-2 in 2023); the gain against `one_split` is larger because that baseline uses 4x fewer
# programs, so it overstates what split-KV adds over FA2. Neither SDPA backend is a no-split baseline:
# FlashAttention >= 2.2 (SDPA's `FLASH_ATTENTION` backend) already splits the KV sequence at decode time, and the
# default backend (cuDNN on recent GPUs) does too, so parity with them is the expected outcome. A naive three-op
# PyTorch implementation shows what an unfused decode leaves on the table. Our benchmark
# (`benchmarks/course/bench_decode.py`: bf16, Hq = 32, Hkv = 8, d = 128, GPU time of CUDA-graph replays) times all
# of them:

# %%
decode = load_results("*-decode.json")
if not decode:
    not_run("GPU decode benchmark", "<gpu>-decode.json")
for path, r in decode:
    rows = [x for x in r.get("results", []) if ("ms_graph" in x or "ms" in x)]
    key = "ms_graph" if all("ms_graph" in x for x in rows) else "ms"
    gpu_name = r.get("meta", {}).get("gpu") or r.get("meta", {}).get("device") or path.stem
    impls = sorted({x["impl"] for x in rows})
    batches = sorted({x["batch"] for x in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.2), squeeze=False)
    for ax, b in zip(axes[0], batches):
        for impl in impls:
            pts = sorted((x["context"], x[key] * 1e3) for x in rows if x["batch"] == b and x["impl"] == impl)
            if pts:
                ax.loglog(*zip(*pts), "o-", label=impl, ms=3)
        ax.set_title(f"batch {b}"); ax.set_xlabel("context length")
        ax.set_ylabel("GPU time per call (us)" + (", CUDA graph" if key == "ms_graph" else ""))
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"benchmarks/results/{path.name}: {gpu_name}")
    plt.tight_layout()
    by = {(x["batch"], x["context"], x["impl"]): x[key] for x in rows}
    for base in ("one_split", "fa2_per_qhead", "naive_torch", "sdpa_default", "sdpa_flash"):
        ratios = [(by[(b, n, base)] / by[(b, n, "split_kv")], b, n) for (b, n, i) in by
                  if i == "split_kv" and (b, n, base) in by]
        if ratios:
            best = max(ratios)
            print(f"{gpu_name}: split-KV vs {base:13s}: up to {best[0]:5.1f}x (batch {best[1]}, context {best[2]})")
        else:
            print(f"{gpu_name}: split-KV vs {base:13s}: not in {path.name} (re-run benchmarks/course/bench_decode.py)")
    copy_bw = r.get("meta", {}).get("copy_bw_bytes_per_s")
    flash_b1 = [x for x in rows if x["impl"] == "sdpa_flash" and x["batch"] == 1 and x.get("kv_bytes")]
    if copy_bw and flash_b1:
        f = max(flash_b1, key=lambda x: x["context"])
        print(f"{gpu_name}: SDPA flash backend, batch 1, context {f['context']}: reads the KV cache at "
              f"{f['kv_bytes'] / (f[key] * 1e-3) / copy_bw:.0%} of copy bandwidth (a kernel without split-KV "
              f"could not: compare one_split)")
    longest = max((x for x in rows if x["impl"] == "split_kv" and x["batch"] == 1), key=lambda x: x["context"], default=None)
    if copy_bw and longest and longest.get("kv_bytes"):
        bw = longest["kv_bytes"] / (longest[key] * 1e-3)
        print(f"{gpu_name}: batch 1, context {longest['context']}: split-KV reads the KV cache at {bw / 1e9:.0f} GB/s = "
              f"{bw / copy_bw:.0%} of the measured device copy bandwidth ({copy_bw / 1e9:.0f} GB/s)")
    print("seeds: 'Flash-Decoding is up to 8x faster than prior work' (vs FlashAttention-2 and native PyTorch, 2023)")

# %% [markdown]
# Measured on the H200 (printed above, `h200-decode.json`): about 10x over FA2's parallelism at batch 1 and 128k
# tokens, against 14x over `one_split` — the same order as the seeds' 8x. SDPA's `FLASH_ATTENTION` backend reads
# the cache at a large fraction of copy bandwidth at batch 1, which no kernel with one program per head could: it
# splits too. At batch 32 there are enough (sequence, head) pairs to fill the GPU, and splitting stops mattering.
#
# ### How close to the copy bandwidth can one decode launch get?
#
# At batch 1 and 32k keys the decode reads 134 MB and does almost no arithmetic, so its bar is a fraction of
# the copy bandwidth. But the copy bandwidth is measured on a 1 GiB copy, and a decode is *one* launch of ~50 µs:
# its programs start, wait a full memory latency for their first bytes and finish at different times. How much
# does that cost, and does splitting the keys finer (more, shorter programs) help the read and the decode alike?
#
# **Predict** before running the next cell: a kernel that only sums the same 134 MB with 32 splits per kv head
# (the decode's partition: 256 programs) and the same kernel with 128 splits (1024 programs) — which one reads
# closer to the copy bandwidth? Then the decode itself with 32 and with 128 splits: faster or slower with more?

# %%
guess = None  # your answer: "more" if 128 splits should *decode* faster than 32, else "fewer"
probe = load_results("*-read-ceiling-probe.json")
if not probe:
    not_run("read-ceiling probe", "<gpu>-read-ceiling-probe.json")
for path, r in probe:
    rows = {x["name"]: x for x in r["rows"] if "ms_graph" in x}
    print(f"{path.name}: {r['gpu']}, {r['kv_bytes'] / 1e6:.0f} MB, graph-timed over {r['input_sets']} input sets")
    for name, x in rows.items():
        moved = 2 if name.startswith("copy") else 1  # the copy reads and writes the bytes
        print(f"  {name:40s} {x['ms_graph'] * 1e3:6.1f} us = {moved * x['frac_copy_bw']:.2f} of copy")
    dec = {x["splits"]: x["ms_graph"] for x in rows.values() if x["name"].startswith("flash_decode") and x["tma"]}
    if {32, 128} <= set(dec):
        check_guess(guess, "more" if dec[128] < dec[32] else "fewer", what="which split count decodes faster")

# %% [markdown]
# A launch that only reads gets closer to the copy bandwidth with more, shorter programs: they fill the memory
# system sooner and finish closer together, so the ramp and the tail shrink. (A copy of the same bytes in one
# launch runs at nearly the rate of the 1 GiB copy: the size of one launch alone costs little.) The decode does
# the opposite. Nsight Compute on the H100 (`probe_read_ceiling --ncu`, `h100-read-ceiling-ncu.json`) splits its
# time: with the merge moved into a second kernel, stage 1 alone takes the same 52 µs at 32 and at 128 splits,
# while the merge that the last program of each kv head runs inside the launch (section 4's rule) costs 0.5 µs
# at 32 splits and 6.4 µs at 128, on the critical path. A two-level merge (groups of 16 splits first,
# `DecodeVariant(merge_group=16)` in `experiments/decode_variants.py`) takes most of that back, yet 128 splits
# still decode slower than 32 (`sweep_decode_32k`): each program also loads its queries, fills its pipeline and
# publishes its partial state with an atomic ticket, and with 4 key blocks a program that fixed cost outweighs what
# the finer partition wins.
# What is left between the decode and 0.9 of copy (the course's bar for this row) is therefore about 4% of
# partition (the read-only launch: 0.89 of copy with the decode's 32 splits, 0.93 with 128) and about 5% of the
# decode's own per-program work. (One caution about such measurements: a single CUDA-graph median of a 50 µs
# launch moved by a third between two runs minutes apart (`notes/serving_perf.md`); compare such rows only within
# one run.)
