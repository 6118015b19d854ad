# %% [markdown]
# # Lecture 10 — Beyond one GPU: ring attention (context parallelism)
#
# **Learning objectives.** After this lecture you can:
#
# 1. Explain why splitting the keys across devices is exact (the merge rule).
# 2. Trace the K/V ring: what each device sends and computes at each step.
# 3. Compute the load imbalance of naive causal ring attention and show the zig-zag layout removes it.
# 4. State when a ring step's communication hides behind its computation.
#
# FlashAttention made attention's memory linear in the sequence length, but it still runs on **one** device: the
# keys and values of the whole sequence must sit in that device's memory, and one device does all N² work. For
# a million-token context that is too much memory and too much time. This lecture splits the *sequence* across
# devices ("context parallelism") and shows that attention stays **exact**: the same merge rule that made
# Flash-Decoding exact (lecture 7, `merge_states`) lets every device attend its queries to the key/value chunks
# of the others, one chunk at a time, while the chunks travel around a ring.
#
# Everything here runs on CPU: real `torch.distributed` processes talking over **gloo** (the same code runs on
# GPUs over NCCL, `benchmarks/course/bench_ring.py`), and simulations of the schedule. The ring is one of three ways
# to split attention over the sequence; §7 compares it with **Ulysses** (all-to-all over heads) and
# **all-gather** context parallelism (Llama 3), byte for byte, and §8 shows the ring measured on two H100s.
#
# **Reading path:** lecture 7 (merging partial attention) → this lecture → the optional assignment `a6_ring`
# (the ring's merge step and its backward step, in NumPy).
#
# References: H. Liu, M. Zaharia, P. Abbeel, *Ring Attention with Blockwise Transformers for Near-Infinite
# Context* (ICLR 2024, [arXiv:2310.01889](https://arxiv.org/abs/2310.01889)); the two-chunks-per-rank causal
# load balancing is the one described for context parallelism in *The Llama 3 Herd of Models*
# ([arXiv:2407.21783](https://arxiv.org/abs/2407.21783)); the recursive-attention merge is from FlashInfer
# (Ye et al., MLSys 2025, [arXiv:2501.01005](https://arxiv.org/abs/2501.01005)); Ulysses is S. A. Jacobs et
# al., *DeepSpeed Ulysses* ([arXiv:2309.14509](https://arxiv.org/abs/2309.14509)).

# %%
import numpy as np
import torch

from lectures._exercise import check_guess
from lectures._plots import load_results, not_run, setup
from reference.distributed import comm_model as cm
from reference.distributed import layout as L
from reference.distributed.demo import case_inputs, ring_cases_rank
from reference.distributed.launch import run_ranks
from reference.distributed.merge import merge_states_torch
from reference.distributed.ring_attention import simulate_ring_attention
from reference.distributed.schedule import ring_balance, ring_work
from reference.numpy.attention import attention

plt = setup()
_ = torch.manual_seed(0)   # (assigned: a bare call would print the returned torch.Generator)

# %% [markdown]
# ## 1. Why one device is not enough
#
# The KV cache of one layer holds `2 · N · H_kv · d` numbers. For a Llama-3-70B-like layer shape (8 kv heads of
# dimension 128, 80 layers, bf16) the keys and values of the whole model are:

# %%
H_KV, D, LAYERS, BYTES = 8, 128, 80, 2
for n in (8_192, 131_072, 1_048_576):
    gib = 2 * n * H_KV * D * LAYERS * BYTES / 2**30
    flops = 4 * n * n * 64 * D * LAYERS / 2          # causal attention, 64 query heads
    print(f"N = {n:>9,}: K/V of all layers {gib:7.1f} GiB, causal attention forward {flops / 1e15:8.1f} PFLOP")

# %% [markdown]
# At a million tokens the keys and values alone are 320 GiB — more than any single GPU holds — and the attention
# FLOPs grow as N². Splitting the **sequence** over W devices divides both: each device keeps N/W positions of
# Q, K and V and does 1/W of the work.

# %% [markdown]
# ## 2. Why splitting the keys is exact: the merge rule
#
# For a query row, attention over a key set I is the pair `(o(I), lse(I))`. For a split of the keys into disjoint
# parts A and B (lecture 7):
#
# $$\mathrm{lse} = \log\left(e^{\mathrm{lse}_A} + e^{\mathrm{lse}_B}\right), \qquad
#   o = e^{\mathrm{lse}_A - \mathrm{lse}}\, o_A + e^{\mathrm{lse}_B - \mathrm{lse}}\, o_B .$$
#
# So a device holding some queries can attend them to one chunk of keys at a time and fold each result into a
# running `(o, lse)`, in any order. `reference.distributed.merge.merge_states_torch` is this rule on torch
# tensors:

# %%
q, k, v = torch.randn(6, 16, dtype=torch.float64), torch.randn(20, 16, dtype=torch.float64), torch.randn(20, 16, dtype=torch.float64)


def part(keys):
    """(o, lse) of q over a subset of the keys (plain float64 attention)."""
    o, lse = attention(q.numpy(), k[keys].numpy(), v[keys].numpy(), return_lse=True)
    return torch.from_numpy(o), torch.from_numpy(lse)


o_merged, lse_merged = merge_states_torch(*part(slice(12, 20)), *part(slice(0, 12)))   # any order
o_full, lse_full = part(slice(0, 20))
print("max |o_merged - o_full|     =", float((o_merged - o_full).abs().max()))
print("max |lse_merged - lse_full| =", float((lse_merged - lse_full).abs().max()))

# %% [markdown]
# ## 3. The ring
#
# W ranks each hold a chunk of Q, K and V. At step s, rank r holds the K/V chunk of rank (r − s) mod W: it
# attends its queries to that chunk, merges, and passes the chunk to rank r + 1 while receiving the next one from
# rank r − 1. After W steps every query has seen every key. Sending the next chunk is started *before* computing
# on the current one (`torch.distributed.batch_isend_irecv`), so communication overlaps with compute.

# %%
W = 4
held = np.array([[(r - s) % W for s in range(W)] for r in range(W)])
fig, ax = plt.subplots(figsize=(4.2, 3))
ax.imshow(held, cmap="tab10", vmin=0, vmax=9)
for (r, s), c in np.ndenumerate(held):
    ax.text(s, r, f"KV{c}", ha="center", va="center", color="white", fontsize=9)
ax.set(xlabel="ring step s", ylabel="rank r", title="K/V chunk held by each rank", xticks=range(W), yticks=range(W))
ax.grid(False)
plt.show()

# %% [markdown]
# ### Running it: gloo processes on this CPU
#
# `reference.distributed.run_ranks` starts W processes joined by a gloo process group; each builds the same
# random inputs from a seed, keeps its shard, and runs `ring_attention_forward` / `ring_attention_backward`.
# We gather the shards and compare with one-process float64 attention — a ragged total length (37 is not a
# multiple of 2W), grouped-query attention (4 query heads, 2 kv heads), causal:

# %%
case = {"name": "demo", "seed": 3, "causal": True, "layout": "zigzag", "nq": 37, "nk": 37, "hq": 4, "hkv": 2}
ranks = run_ranks(ring_cases_rank, 2, ([case],), timeout=120)
res = [r[0] for r in ranks]
o_ring = L.unshard([x["o"] for x in res], "zigzag")
dq_ring = L.unshard([x["dq"] for x in res], "zigzag")
dk_ring = L.unshard([x["dk"] for x in res], "zigzag")

qf, kf, vf, do = (x.clone().requires_grad_(True) for x in case_inputs(case))
s = qf @ kf.repeat_interleave(2, dim=1).transpose(-1, -2) / 16 ** 0.5
s = s.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
o_ref = torch.softmax(s, -1) @ vf.repeat_interleave(2, dim=1)
o_ref.backward(do.detach())
print("rank shard lengths:", [x["o"].shape[2] for x in res])
print(f"output   max error vs one process: {float((o_ring - o_ref.detach()).abs().max()):.2e}")
print(f"dQ       max error vs one process: {float((dq_ring - qf.grad).abs().max()):.2e}")
print(f"dK       max error vs one process: {float((dk_ring - kf.grad).abs().max()):.2e}")

# %% [markdown]
# ### The backward pass travels the ring too
#
# FlashAttention's backward (lecture 4) recomputes `P = exp(S − lse)` and uses `D = rowsum(dO ∘ O)`. Given the
# *global* `o` and `lse` of its queries, a rank can compute exactly one K/V chunk's share of every gradient:
#
# * **dQ stays local**: each step adds the visiting chunk's contribution to the rank's own `dq`.
# * **dK, dV travel**: they belong to the chunk, so fp32 accumulators travel *with* it; each rank adds its share
#   and passes them on. After W hops they are back at the chunk's owner — the gradients above came back this way.

# %% [markdown]
# ## 4. Causal attention: the naive order is unbalanced
#
# With a causal mask, rank r's queries (positions in chunk r) see only chunks 0..r. In the **contiguous** layout
# rank 0 works at step 0 only, while the last rank works at every step. The ring is synchronous — a step ends when
# its slowest rank is done — so the others wait. The **zig-zag** layout splits the sequence into 2W chunks and
# gives rank r chunks r and 2W−1−r: an early chunk with little work and a late one with a lot.
#
# `reference.distributed.schedule.ring_work` counts the (query, key) pairs each rank scores at each step:

# %%
N = 4096
fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.2))
for ax, lay in zip(axes, ("contiguous", "zigzag")):
    work = ring_work(N, N, W, lay, causal=True)
    bal = ring_balance(work)
    im = ax.imshow(work / work.max(), cmap="Blues", vmin=0, vmax=1)
    for (r, st), x in np.ndenumerate(work / work.max()):
        ax.text(st, r, f"{x:.2f}", ha="center", va="center", fontsize=8, color="white" if x > 0.6 else "black")
    ax.set(xlabel="ring step", ylabel="rank", xticks=range(W), yticks=range(W),
           title=f"{lay}: efficiency {bal['efficiency']:.2f}")
    ax.grid(False)
fig.suptitle(f"causal work per rank and step (fraction of the largest), N = {N}, W = {W}")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Predict, then run.** The efficiency is the ideal time (total work / W) over the real one (the sum over steps
# of the busiest rank's work). With W = 4 the contiguous layout reaches 0.57. What does it reach with W = 8?

# %%
guess = None  # your answer, a fraction between 0 and 1
check_guess(guess, ring_balance(ring_work(512, 512, 8, "contiguous"))["efficiency"], rel=0.05,
            what="causal ring efficiency, contiguous layout, W = 8")

# %% [markdown]
# Why: with the contiguous layout every step after the first costs a full block on the last rank, `W − ½` blocks in total against an
# ideal of `W/2`, so the efficiency is `W / (2W − 1)` and tends to ½. Zig-zag: 1.

# %%
worlds = [1, 2, 4, 8, 16, 32]
eff = {lay: [ring_balance(ring_work(64 * w, 64 * w, w, lay))["efficiency"] for w in worlds]
       for lay in ("contiguous", "zigzag")}
fig, ax = plt.subplots(figsize=(5.5, 3))
for lay, e in eff.items():
    ax.plot(worlds, e, "o-", label=lay)
ax.plot(worlds, [w / (2 * w - 1) for w in worlds], "k:", lw=1, label="W / (2W - 1)")
ax.set(xscale="log", xlabel="ranks W", ylabel="efficiency", ylim=(0, 1.05), title="causal ring: load balance")
ax.set_xticks(worlds, [str(w) for w in worlds])
ax.legend()
plt.show()

# %% [markdown]
# ### Measured: per-rank compute time on gloo ranks
#
# The same imbalance shows up in real time. Two gloo ranks, causal attention over 2048 positions (4 heads,
# d = 64), with the tiled NumPy FlashAttention-2 of lecture 3 as the local step (it skips fully masked tiles, so
# its time follows the causal work); each rank records the CPU time of its local compute at every ring step
# (CPU time, not wall time: it counts the work, not the moments other processes held the core):

# %%
meas = {}
for lay in ("contiguous", "zigzag"):
    c = {"name": lay, "seed": 5, "causal": True, "layout": lay, "nq": 2048, "nk": 2048, "hq": 4, "hkv": 4,
         "d": 64, "dtype": "float32", "step": "numpy"}
    out = run_ranks(ring_cases_rank, 2, ([c] * 6,), timeout=300)
    # [rank, step] in ms: the first run warms up; the minimum of the other five
    meas[lay] = np.array([[r[i]["compute_cpu_s"] for i in range(1, 6)] for r in out]).min(axis=1) * 1e3
    print(f"{lay:>10}: per-step compute ms, rank 0 {np.round(meas[lay][0], 1)}, rank 1 {np.round(meas[lay][1], 1)}"
          f"  -> per-rank totals {np.round(meas[lay].sum(1), 1)}, ratio {meas[lay].sum(1).max() / meas[lay].sum(1).min():.2f}")

fig, ax = plt.subplots(figsize=(6, 3))
for i, lay in enumerate(meas):
    for r in range(2):
        ax.bar(i * 3 + r, meas[lay][r].sum(), color=f"C{r}", label=f"rank {r}" if i == 0 else None)
ax.set_xticks([0.5, 3.5], list(meas))
ax.set(ylabel="compute CPU ms (all steps)", title="measured: causal work per rank, 2 gloo ranks")
ax.legend()
plt.show()

# %% [markdown]
# The work count predicts a ratio of 3 for the contiguous layout (rank 1: a half block at step 0, then a full
# block at step 1; rank 0: the half block only, then it idles) and 1 for zig-zag. The measured contiguous ratio
# is lower than 3 because a causal diagonal block costs more than half a full one here (the diagonal tiles are
# computed whole and masked, and each tile has a fixed Python overhead); zig-zag stays balanced because both
# ranks do the same mix of diagonal and full blocks. (CPU times, minimum of five runs: the ratio matters, not the
# milliseconds.)

# %% [markdown]
# ## 5. How each step is computed: any FlashAttention kernel
#
# A pair (query chunk, key chunk) under the global causal mask is either fully visible, invisible (skipped), or
# visible below a diagonal offset. `reference.distributed.local_step.block_calls` slices the last case into at
# most two calls of an ordinary kernel (rows that see every key; a bottom-right causal block), so the local step
# is pluggable: dense torch, the NumPy FlashAttention-2 of lecture 3, or the Triton kernels of lecture 5. A rank
# needs even fewer calls than one per pair: its keys sit in increasing position order (zig-zag chunks `r` and
# `2W−1−r`), so every query row sees a *prefix* of the local keys, and rows whose prefix grows by one per row (a
# causal call) or stays put (a plain call) join across chunk boundaries (`step_calls`). A zig-zag step is then
# ONE kernel call: the diagonal step is a causal call over both local chunks, any other step is all rows against
# the first visiting chunk or the second query chunk against both. The same schedule can run in one process
# (`simulate_ring_attention`), here with the Triton kernels in their CPU interpreter:

# %%
from reference.triton import DEVICE  # noqa: E402

qt, kt, vt = (torch.randn(1, 2, 48, 16).to(DEVICE) for _ in range(3))
o_sim, _ = simulate_ring_attention(qt, kt, vt, 3, causal=True, layout="zigzag", step="triton")
o_dense, _ = simulate_ring_attention(qt, kt, vt, 1, causal=True, step="torch")
print(f"Triton local step, 3 simulated ranks vs dense torch: max error {float((o_sim - o_dense).abs().max()):.2e}")

from reference.distributed.local_step import step_calls  # noqa: E402

segs16 = L.rank_segments(16, 2, "zigzag")
for r in range(2):
    for s in range(2):
        print(f"rank {r} (positions {segs16[r]}), step {s} (keys {segs16[(r - s) % 2]}): calls (q_lo, q_hi, k_lo, "
              f"k_hi, causal) = {step_calls(segs16[r], segs16[(r - s) % 2], 0, True)}")

# %% [markdown]
# ## 6. When is the communication hidden?
#
# Per step a rank computes on a chunk of `c = N/W` positions and sends one K/V chunk of the same length. With the
# zig-zag layout, a step is half of a full `c × c` block: `2·c²·d·H_q` FLOPs, against `2·c·d·H_kv` bf16 numbers
# (`4·c·d·H_kv` bytes) to send. Their time ratio grows linearly in `c`:
#
# $$\frac{t_\text{compute}}{t_\text{comm}} = \frac{c\, H_q\, B}{2\, H_{kv}\, F}$$
#
# with `F` the attention throughput and `B` the link bandwidth. A model, not a measurement: with the rounded
# assumptions below (an attention kernel at 500 TFLOP/s, 400 GB/s one way over NVLink, GQA 32/8), the send is
# hidden once a rank holds a few hundred positions — far below the 16k–128k per GPU of the benchmark. What limits
# the scaling in practice is everything else a step does: the merges, the per-step synchronisation, and kernels
# that run on shorter sequences than the one-GPU baseline.
#
# **Predict, then run.** With these numbers, from how many positions per rank on is the send hidden
# (`t_compute / t_comm = 1`)? And with MHA ($H_{kv} = H_q = 32$) instead of GQA-8?

# %%
F, B_LINK, HQ, HKV = 500e12, 400e9, 32, 8
guess = None  # your answer for GQA-8, a number of positions
check_guess(guess, 2 * HKV * F / (HQ * B_LINK), what="break-even positions per rank, GQA 32/8")
print(f"MHA (Hkv = 32): {2 * HQ * F / (HQ * B_LINK):.0f} positions per rank")
c = np.logspace(2, 5, 50)
fig, ax = plt.subplots(figsize=(5.5, 3))
for backward in (False, True):
    ax.loglog(c, [cm.ring_step_ratio(x, HQ, HKV, 128, F, B_LINK, backward) for x in c],
              label="backward (K/V bf16 + dK/dV fp32 travel)" if backward else "forward (K/V travel)")
ax.axhline(1, color="grey", ls="--", lw=1)
ax.set(xlabel="positions per rank c", ylabel="t_compute / t_comm", title="model: compute per step over send time")
ax.legend(fontsize=8)
plt.show()
print(f"break-even at c = {cm.ring_break_even(HQ, HKV, F, B_LINK):.0f} positions per rank (forward, model)")

# %% [markdown]
# ### The backward moves three times the bytes
#
# In the backward (§3) the K/V chunk travels again, and with it the dK/dV **accumulators**, kept in fp32 so that
# the W partial sums added along the ring do not lose precision. Per position and kv head a step now sends
# `2·d` bf16 numbers plus `2·d` fp32 numbers: `(2 + 4)/2 = 3` times the forward's bytes. Its compute is 2.5 times
# the forward's (five matmuls — S recomputed, dP, dV, dQ, dK — against two). So the break-even moves by
# `3 / 2.5 = 1.2`: with the numbers above, `c* = H_kv · (2 + 4) bytes · F / (2.5 · H_q · B)
# = 8 · 6 · 5e14 / (2.5 · 32 · 4e11) = 750` positions, up from `8 · 2 · 5e14 / (32 · 4e11) = 625`. The
# calculator `reference.distributed.comm_model` (tested in `tests/test_comm_model.py`) does this arithmetic:

# %%
fwd, bwd = cm.ring_break_even(HQ, HKV, F, B_LINK), cm.ring_break_even(HQ, HKV, F, B_LINK, backward=True)
print(f"ring break-even, forward  c* = {fwd:.0f} positions per rank")
print(f"ring break-even, backward c* = {bwd:.0f} positions per rank ({bwd / fwd:.2f}x: bytes x3, FLOPs x2.5)")
print(f"in fp32-free backward (dK/dV sent in bf16): c* = {cm.ring_break_even(HQ, HKV, F, B_LINK, True, grad_bytes=2):.0f}")

# %% [markdown]
# ## 7. Ring, Ulysses or all-gather?
#
# The ring is not the only way to split attention over the sequence. Per layer, with `c = N/W` tokens per rank
# (bytes one rank sends; bf16 activations, fp32 gradient accumulators):
#
# | scheme | what moves | forward bytes | backward bytes | overlap | limit |
# |---|---|---|---|---|---|
# | **ring** (Liu et al.) | K/V chunks hop around the ring, W − 1 hops | `(W−1)·c·2H_kv·d·2` | K/V again + dK/dV fp32, W hops: `(W−1)·c·2H_kv·d·2 + W·c·2H_kv·d·4` | step by step, behind compute | per-step sync; causal needs zig-zag |
# | **Ulysses** (DeepSpeed) | all-to-all: "c tokens, all heads" ↔ "all N tokens, H/W heads", for Q, K, V and back for O | `(W−1)/W·c·d·2·(2H_q + 2H_kv)` | the transposed all-to-alls (dO in; dQ, dK, dV out): the same | none: it sits between projection and attention | **H_q and H_kv ≥ W** (kv heads replicated otherwise) |
# | **all-gather** (Llama 3) | all-gather K and V, attend own queries (two zig-zag chunks, r and 2W−1−r) | `(W−1)·c·2H_kv·d·2` | gather again + reduce-scatter dK/dV: `(W−1)·c·2H_kv·d·(2 + 4)` | none (one collective before attention) | all K/V of the layer in memory at once |
#
# Ulysses' bytes **shrink** as `1/W` per rank (every rank sends `(W−1)/W` of its own shard once), while the
# ring and all-gather send the whole sequence's K/V through every rank; but Ulysses cannot split further than
# the heads allow (GQA-8 stops at W = 8 without replicating K/V), and its all-to-all is exposed. All-gather moves
# the ring's bytes in one collective — simple, works with any attention kernel and any mask (Llama 3 chose it
# because with GQA the K/V are small next to Q, and the gather is a small part of the step at long context) —
# and pays it unhidden. The ring hides its sends behind compute once `c` passes the break-even of §6.
#
# **Predict, then run.** 128k tokens on W = 8 GPUs, GQA 32/8, d = 128: which scheme sends the fewest bytes per
# rank in the forward, and by how much against the ring?

# %%
N_CP, W_CP = 131072, 8
guess = None  # ring bytes / Ulysses bytes
check_guess(guess, cm.comm_bytes("ring", N_CP, W_CP, HQ, HKV, 128) / cm.comm_bytes("ulysses", N_CP, W_CP, HQ, HKV, 128),
            rel=0.1, what="forward bytes per rank: ring / Ulysses, 128k on 8 GPUs")
print(f"{'scheme':>9} {'pass':>8} {'MB sent':>9} {'comm ms':>8} {'compute ms':>10} {'exposed ms':>10}   (model)")
for r in cm.compare(N_CP, W_CP, HQ, HKV, 128, F, B_LINK):
    print(f"{r['scheme']:>9} {'backward' if r['backward'] else 'forward':>8} {r['bytes'] / 1e6:9.1f} "
          f"{r['comm_s'] * 1e3:8.2f} {r['compute_s'] * 1e3:10.2f} {r['exposed_s'] * 1e3:10.2f}")
worlds = [2, 4, 8, 16, 32]
fig, ax = plt.subplots(figsize=(5.5, 3))
for scheme in cm.SCHEMES:
    xs = [w for w in worlds if scheme != "ulysses" or HQ % w == 0]
    ax.plot(xs, [cm.comm_bytes(scheme, N_CP, w, HQ, HKV, 128) / 1e6 for w in xs], "o-", label=scheme)
ax.set(xscale="log", yscale="log", xlabel="ranks W", ylabel="forward MB sent per rank per layer",
       title=f"model: {N_CP // 1024}k tokens, GQA {HQ}/{HKV}, d = 128")
ax.set_xticks(worlds, [str(w) for w in worlds])
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# (Ulysses at W = 16 and 32 replicates the 8 kv heads, and stops at W = 32 = H_q. Real systems combine them:
# Ulysses inside a node, where the all-to-all is cheap, and a ring or all-gather across nodes.)
#
# ### Ulysses, the hybrid and all-gather, running
#
# `reference.distributed.ulysses` implements the other two schemes and their combination on the same local
# steps as the ring:
#
# * `ulysses_attention`: an all-to-all turns each rank's `c` positions of every head into all `N` positions of
#   `H_q/W` heads (K/V heads split, or replicated when `H_kv < W`), attention runs locally, a second all-to-all
#   brings `o` back. In the backward `dO` goes in the same way and `dQ, dK, dV` come back, with the shares of a
#   replicated kv head summed on the way.
# * `hybrid_attention` (unified sequence parallelism): `W = a × b` ranks in `b` groups of `a`; Ulysses inside a
#   group, the zig-zag ring across groups between the ranks that hold the same heads. `a = W` is Ulysses,
#   `b = W` the ring.
# * `allgather_attention_forward` / `_backward`: gather all K/V, attend your own zig-zag queries; the backward
#   sums each position's dK/dV at its owner.
#
# Four gloo processes run each of them on a ragged causal GQA case (the hybrid as 2 groups of 2), and we
# compare with float64 attention in one process:

# %%
from reference.distributed.demo import sp_cases_rank  # noqa: E402

sp_cases = [{"name": name, "seed": 5, "scheme": scheme, "ulysses": a, "causal": True, "layout": lay,
             "nq": 29, "nk": 29, "hq": 8, "hkv": hkv}
            for name, scheme, a, lay, hkv in (("Ulysses, kv heads split", "ulysses", None, "contiguous", 4),
                                             ("Ulysses, kv heads replicated", "ulysses", None, "contiguous", 2),
                                             ("hybrid 2 x 2", "hybrid", 2, "zigzag", 2),
                                             ("all-gather", "allgather", None, "zigzag", 2))]
sp_ranks = run_ranks(sp_cases_rank, 4, (sp_cases,), timeout=120)
for i, c in enumerate(sp_cases):
    parts = [r[i] for r in sp_ranks]
    if c["scheme"] == "allgather":
        join = lambda xs: L.unshard(xs, "zigzag")  # noqa: E731
    else:
        a = 4 if c["scheme"] == "ulysses" else c["ulysses"]
        join = lambda xs, a=a, lay=c["layout"]: L.hybrid_unshard(xs, a, 4 // a, lay)  # noqa: E731
    qf, kf, vf, do = (x.clone().requires_grad_(True) for x in case_inputs(c))
    g = c["hq"] // c["hkv"]
    s = qf @ kf.repeat_interleave(g, dim=1).transpose(-1, -2) / 16 ** 0.5
    s = s.masked_fill(torch.ones(29, 29, dtype=torch.bool).triu(1), float("-inf"))
    o_ref = torch.softmax(s, -1) @ vf.repeat_interleave(g, dim=1)
    o_ref.backward(do.detach())
    errs = [float((join([p[key] for p in parts]) - ref).abs().max())
            for key, ref in (("o", o_ref.detach()), ("dq", qf.grad), ("dk", kf.grad), ("dv", vf.grad))]
    print(f"{c['name']:>30}: max error of o, dQ, dK, dV vs one process: " + ", ".join(f"{e:.1e}" for e in errs))

# %% [markdown]
# `benchmarks/course/bench_sequence_parallel.py` runs all four side by side on NCCL (ring zig-zag, Ulysses,
# all-gather and the hybrids, 32k-256k tokens, GQA 32/8, d = 128, forward and backward), times the
# communication that compute did not hide, and counts the bytes each rank sends; its CPU smoke run checks that
# those bytes are exactly the model's formulas of the table above (plus the fp32 `lse` that travels back with
# `o`, 1/d of it). **Not measured on GPUs yet:** running it needs a machine with several GPUs, and until its
# results file exists the comparison above is the model's; the ring's own GPU numbers follow in §8.
#
# ## 8. GPU results: two H100s
#
# `benchmarks/course/bench_ring.py` runs the ring on NCCL with the Triton kernels as the local step (bf16, Hq = 32,
# Hkv = 8, d = 128, 32k–256k tokens) and reports time per step, the fraction of the communication hidden behind
# compute (`hidden`: 1 − exposed wait / time of the K/V pass alone), and the scaling efficiency against one GPU
# (`one_gpu_ms / (2 · ring_ms)`). The committed run, `benchmarks/results/h100-ring-w2.json` (and `.png`), was
# measured on 2 × H100 (NVLink; `h200-ring-w2.json` is a shorter re-run on 2 × H200) with
# `NCCL_NVLS_ENABLE=0 python3 -m benchmarks.course.bench_ring --world-size 2`.

# %%
RING_CMD = "NCCL_NVLS_ENABLE=0 python3 -m benchmarks.course.bench_ring --world-size 2"
two = load_results("*-ring-w2.json")
if not two:
    not_run("2-GPU ring benchmark", "<gpu>-ring-w2.json", RING_CMD)
for path, data in two:
    print(f"{path.name}: {data['meta']['device']} x {data['meta']['world']} (re-run: {RING_CMD})")
    for r in data["rows"]:
        print(f"  N={r['n']:>7} {r['pass']:>8} causal={r['causal']!s:5} {r['layout']:>10}: ring {r['ring_ms']:8.2f} ms,"
              f" one GPU {r['one_gpu_ms']:8.2f} ms, efficiency {r['efficiency']:.2f}"
              + (f", comm hidden {r['hidden']:.2f}" if "hidden" in r else ""))
    for r in data["rows"]:
        if (r["pass"], r["causal"], r["layout"]) == ("forward", True, "zigzag"):
            print(f"  causal zig-zag N={r['n'] // 1024}k: local compute per rank {max(map(sum, r['compute_ms'])):.1f} ms "
                  f"(half the one-GPU time: {r['one_gpu_ms'] / 2:.1f} ms), exposed wait "
                  f"{max(map(sum, r['wait_ms'])):.2f} ms")
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for (p_, causal, lay), style in ((("forward", True, "zigzag"), "o-"), (("forward", True, "contiguous"), "s--"),
                                     (("forward", False, "zigzag"), "^:"), (("backward", True, "zigzag"), "d-")):
        rows = [r for r in data["rows"] if (r["pass"], r["causal"], r["layout"]) == (p_, causal, lay)]
        ax.plot([r["n"] for r in rows], [r["efficiency"] for r in rows], style,
                label=f"{p_}, {'causal' if causal else 'full'}, {lay}")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="tokens N", ylabel="efficiency vs one GPU", ylim=(0, 1.05),
           title=f"measured: ring attention, {data['meta']['world']} GPUs ({path.name})")
    ax.set_xticks([r["n"] for r in rows], [f"{r['n'] // 1024}k" for r in rows])
    ax.legend(fontsize=7)
    plt.show()

# %% [markdown]
# What the run shows (`benchmarks/quoted_numbers.py` checks each number below against the JSON):
#
# * **The communication is hidden**: the fraction hidden is 0.99–1.00 in every forward row — as §6 predicts,
#   16k–128k positions per GPU are far past a break-even of a few hundred.
# * **Causal zig-zag scales**: efficiency 0.75 / 0.90 / 0.95 / 0.98 at 32k / 64k / 128k / 256k. What it loses at
#   32k is not communication (the recorded waits are 0) but the local kernels: at 32k a rank's local steps add
#   up to 10.7 ms of compute against 8.6 ms for half of the one-GPU time, because each step runs FlashAttention
#   on short segments (two per rank, split further at the causal diagonal), where a kernel is less efficient than
#   on the baseline's whole sequence; the rest is the merges and the per-step synchronisation.
# * **Contiguous** stays at 0.57–0.67: §4's imbalance, `W / (2W − 1) = 0.67` for W = 2, measured on real kernels.
# * **The backward** (causal zig-zag, dK/dV travelling in fp32) reaches 0.82 / 0.90 / 0.94 / 0.94. Its bytes are
#   three times the forward's (§6); the exposed waits stay under 0.5% of its time at every length.
# * **Re-run on 2 × H200** (`h200-ring-w2.json`, 32k–128k, the same command, after the one-call-per-step change
#   of §5): causal zig-zag 0.97 / 0.97 / 1.00, contiguous 0.69 / 0.64 / 0.67, backward 0.88 / 0.92 / 0.95,
#   communication hidden 0.99–1.00.
# * **The Hopper kernels as the local step** (`step="gluon"`: lecture 6's persistent ping-pong forward and
#   warp-specialised backward; `h200-ring-gluon-w2.json`, same command with `--step gluon --seqs
#   32768,65536,131072,262144`): at 128k the causal zig-zag ring runs 1.22x faster than with the Triton step, 604
#   TFLOP/s per GPU, efficiency 0.92 / 0.94 / 0.99 / 1.02 at 32k / 64k / 128k / 256k against one GPU running the
#   same kernels; backward 0.91 / 0.94 / 0.95 / 0.94. (A run of the same command on another 2 × H200 machine
#   was lower at 32k: a 32k ring call is short, so its fixed per-call host cost (notes/ring_attention.md) moves the
#   ratio by several points between machines; from 64k on, the two runs' forward efficiencies are equal to two
#   decimals.) Why one kernel call
#   per step mattered: with the faster kernel the fixed per-step costs weigh more. A profile of one rank on one
#   H100 (`python3 -m benchmarks.course.profile_ring`, notes/ring_attention.md) found that at 64k the old
#   decomposition spent 3.5 ms per rank in its five fp32 merges and ran five shorter kernels; one call per step, no
#   merge on the diagonal step and one fused merge afterwards took that rank from 0.84 to 0.94 of half the
#   one-GPU time.
# * **Four GPUs** (`h200-ring-gluon-w4.json`, `--world-size 4`, 64k–256k): causal zig-zag 0.90 / 0.95 / 1.02, 584
#   TFLOP/s per GPU at 256k, backward 0.92 / 0.94 / 0.93. Efficiencies above 1 are real but flattering: the
#   one-GPU call over the whole 256k sequence runs at a lower rate per FLOP than the shorter local calls.

# ## Summary
#
# * Attention over a sequence split across devices is exact because partial results merge (`merge_states`).
# * Ring attention passes K/V chunks around a ring, overlapping each send with the compute on the previous chunk;
#   the backward keeps dQ local and sends the dK/dV accumulators around with their chunk.
# * Under a causal mask the contiguous split leaves ranks idle (efficiency `W / (2W − 1)`); the zig-zag split
#   (chunks r and 2W−1−r) balances it exactly.
# * The local step is any FlashAttention kernel that returns `lse`: everything from lectures 3–5 carries over.
# * The backward sends three times the forward's bytes (fp32 dK/dV travel) for 2.5 times its compute: the
#   break-even chunk grows by 1.2x (625 → 750 positions in the model).
# * Ulysses (all-to-all over heads) sends `(H_q + H_kv) / (H_kv · W)` of the ring's forward bytes (§7's two
#   formulas divided: `2/W` with one kv head per query head, `5/W` for GQA 32/8, so the ring sends 8/5 of
#   Ulysses' bytes at W = 8) but needs `H ≥ W` and exposes them; all-gather (Llama 3) sends the ring's bytes in
#   one exposed collective; the ring hides them behind compute.
# * Measured on two H100s: causal zig-zag 0.95 of perfect scaling at 128k, communication hidden; with the
#   Hopper kernels as the local step on two H200s, 0.99 at 128k and 604 TFLOP/s per GPU.
