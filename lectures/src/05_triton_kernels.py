# %% [markdown]
# # Lecture 5 — From the algorithm to a GPU kernel: parallelism and Triton
#
# **Learning objectives.** After this lecture you can:
#
# 1. Map FlashAttention-2's loops to a GPU launch grid and compute its number of programs.
# 2. Contrast split-K (FA1) and split-Q (FA2) across warps and say what split-Q saves.
# 3. Read a Triton kernel: program ids, block pointers, masks, `tl.dot`, and run it in the interpreter.
# 4. Say what the interpreter checks on a CPU and what only a GPU run can show.
#
# Algorithm 1 (lecture 3) is two nested loops. On a GPU the question is *which loop runs in parallel, and at
# which level*: the GPU has many streaming multiprocessors (SMs: 108 on an A100, 132 on an H100), each runs
# **thread blocks** (CTAs), and each thread block is made of **warps** of 32 threads. Thread blocks cannot talk
# to each other during a kernel; warps in one block can, through shared memory, at a cost. This lecture follows
# the seeds' two steps — thread-block-level and warp-level parallelism — then runs the course's Triton kernels
# (`reference.triton`) on tiny shapes in Triton's CPU interpreter, and shows GPU results when they exist.
#
# **Reading path:** lecture 4 → this lecture → lecture 5a (a Triton primer) and 5b (timing and profiling) →
# assignment `a3_triton` (the forward) and `a3b_triton_backward` (the backward) → lecture 6.

# %%
import inspect
import math

import numpy as np
import torch

from lectures._exercise import check_guess
from lectures._plots import gantt, load_results, not_run, setup
from reference.simulators import scheduling
from reference.numpy.attention import attention
from reference.numpy.merge import merge_many

plt = setup()
rng = np.random.default_rng(5)

# %% [markdown]
# ## 1. Thread-block-level parallelism
#
# How to partition FlashAttention across thread blocks (an A100 has 108 SMs, so we want at least ~108 blocks)?
#
# * **Step 1: different heads to different thread blocks.** Batch × heads gives independent problems — but
#   typically 16–64 heads, and with a small batch that is not enough blocks.
# * **Step 2: different *queries* to different thread blocks.** Each query block's rows are independent (FA2's
#   outer loop, line 3). Why not split the *keys/values* across thread blocks? Because **thread blocks cannot
#   communicate**, and the softmax of a row needs all of its keys: a split over keys would need a second kernel
#   to combine the pieces (which is exactly what Flash-Decoding does when it has no other choice — lecture 7).
#
# The Triton forward kernel's grid is `(cdiv(N, BLOCK_M), B * H)`: one program per (query block, batch × head).
#
# **Predict, then run.** Batch 1, 16 heads, $N = 2048$, `BLOCK_M = 128`: how many programs does the grid launch,
# and is that enough for the A100's 108 SMs?

# %%
guess = None  # your answer, a number of programs
check_guess(guess, math.ceil(2048 / 128) * 1 * 16, rel=0, what="programs, B=1, H=16, N=2048, BLOCK_M=128")
for B, H, N, bm in ((1, 16, 2048, 128), (8, 16, 2048, 128), (1, 32, 512, 128), (2, 16, 16384, 128)):
    heads_only = B * H
    with_q = B * H * math.ceil(N / bm)
    print(f"B={B:2d} H={H:2d} N={N:5d}: heads only -> {heads_only:4d} thread blocks "
          f"({heads_only / 108:4.2f} per A100 SM); heads x query blocks -> {with_q:5d} ({with_q / 108:5.2f} per SM)")

# %% [markdown]
# **Do we need to handle workload imbalance?** The seeds' answer: no — the GPU scheduler automatically loads the
# next thread block onto an SM as soon as one finishes. With causal masking query blocks have unequal cost
# (block $i$ visits $i+1$ key blocks), and the dynamic scheduler absorbs most of it when there are many blocks
# per SM. It cannot fix the *tail* when there are few; that is the FA3 refinement (LPT ordering, lecture 6).
# The same greedy scheduler, simulated with `reference.simulators.scheduling.schedule` on a small "GPU" of 6 SMs:

# %%
tiles = scheduling.causal_tiles(n_batches=2, n_q_blocks=8, n_heads=2)
sched = scheduling.schedule(tiles, 6, "naive")
fig, ax = plt.subplots(figsize=(8, 2.8))
gantt(ax, sched, "dynamic scheduling, causal, 32 blocks on 6 SMs:", label=lambda t: f"{t.q_block}")
plt.tight_layout()
print(f"busy fraction {sched.efficiency:.1%}; lower bound on the finish time {scheduling.makespan_lower_bound(tiles, 6)}, "
      f"achieved {sched.makespan}")

# %% [markdown]
# ## 2. Warp-level parallelism: split-K (FA1) vs split-Q (FA2)
#
# Inside one thread block, how are the 4–8 warps given work?
#
# * **FlashAttention-1: split K/V across warps** ("split-K"). Every warp sees all of $Q_i$ but a slice of the
#   keys, so each produces a *partial* output and partial softmax statistics; the warps must write them to shared
#   memory, synchronise, and add them up with rescaling. **Splitting across K/V requires communication.**
# * **FlashAttention-2: split Q across warps** ("split-Q"). Every warp owns some query rows and sees all of
#   $K_j, V_j$ (shared memory, read-only); each warp's rows are finished on their own. **Splitting across Q
#   avoids communication.**
#
# The figure colours the scores $S_i = Q_i K^\top$ of one thread block by the warp that computes them:

# %%
Br_fig, Nk_fig, w_fig = 16, 32, 4
split_k = np.tile(np.repeat(np.arange(w_fig), Nk_fig // w_fig), (Br_fig, 1))   # warp w owns a slice of keys
split_q = np.repeat(np.arange(w_fig), Br_fig // w_fig)[:, None] * np.ones((1, Nk_fig), int)  # ... of queries
fig, ax = plt.subplots(1, 2, figsize=(9, 2.8))
for a, grid, title in ((ax[0], split_k, "FA1 split-K: warps own key columns\n-> partial O per warp, merge in smem"),
                       (ax[1], split_q, "FA2 split-Q: warps own query rows\n-> finished rows, no exchange")):
    a.imshow(grid, cmap="tab10", vmin=0, vmax=9, aspect="auto"); a.grid(False)
    a.set_title(title, fontsize=9); a.set_xlabel("keys of $K_j$ (all key blocks)"); a.set_ylabel("rows of $Q_i$")
    for w in range(w_fig):
        r, c = np.argwhere(grid == w).mean(0)
        a.text(c, r, f"warp {w}", ha="center", va="center", fontsize=8, color="white")
plt.tight_layout()

# %% [markdown]
# The split-K combine is the merge of lecture 1/7; the data it moves through shared memory is the price.
# **Predict, then run:** with $B_r = 128$ rows, $d = 128$ and 4 warps, each warp's partial output and its
# $(m, \ell)$ in fp32 go through shared memory. How many KiB per query block?

# %%
guess = None  # your answer, in KiB
check_guess(guess, 4 * 128 * (128 + 2) * 4 / 1024, what="split-K shared-memory exchange (KiB)")
Br, d, warps = 128, 128, 4
q = rng.standard_normal((Br, d)); K = rng.standard_normal((512, d)); V = rng.standard_normal((512, d))
# split-K: each warp attends the whole query block over its quarter of the keys -> partial (o, lse) per warp
parts = [attention(q, K[w::warps], V[w::warps], return_lse=True) for w in range(warps)]
o_splitk, _ = merge_many([p[0] for p in parts], [p[1] for p in parts])
# split-Q: each warp attends its quarter of the query rows over all keys -> disjoint rows, just concatenated
o_splitq = np.concatenate([attention(q[w * Br // warps:(w + 1) * Br // warps], K, V) for w in range(warps)])
print("split-K (with merge) and split-Q both exact:", np.allclose(o_splitk, attention(q, K, V)),
      np.allclose(o_splitq, attention(q, K, V)))
smem = warps * Br * (d + 2) * 4       # every warp's fp32 partial O plus (m, l), written then read back
print(f"split-K exchanges {smem / 1024:.0f} KiB of partial results through shared memory per query block "
      f"(+ a barrier); split-Q exchanges 0 bytes")

# %% [markdown]
# ## 3. Triton: one program per thread block
#
# Triton programs are written per *thread block*: a program loads blocks of data (`tl.load` of a
# `BLOCK_M × d` tile), computes on whole blocks (`tl.dot` runs on tensor cores; `tl.max`, `tl.exp2`, `tl.sum`
# along rows), and stores blocks; the compiler assigns the work to warps and threads (split-Q style), stages the
# loads through shared memory and pipelines them. The heart of the course's forward kernel is lines 7–10 of
# Algorithm 1, the device function `reference.triton.flash_fwd.attend_key_block` (its docstring lists what each
# argument is) — here is its body; compare it with lecture 3's NumPy loop:

# %%
from reference.triton import DEVICE, INTERPRET  # noqa: E402  (sets TRITON_INTERPRET=1 when there is no GPU)
from reference.triton import flash_attention, flash_attention_forward, flash_decode, paged_decode, softmax  # noqa: E402
from reference.triton.flash_fwd import attend_key_block  # noqa: E402

print("Triton interpreter (CPU)" if INTERPRET else "compiled for the GPU", "| device:", DEVICE)
from reference.triton.flash_fwd import mask_running_max  # noqa: E402  (defined in its kernel helpers)


def body(jit_fn):
    """The code of a @triton.jit function after its docstring (a @triton.jit object wraps .fn)."""
    return inspect.getsource(getattr(jit_fn, "fn", jit_fn)).split('"""')[2].strip("\n")


print(body(attend_key_block))
print("\n# ... and line 9's masks and running max, `mask_running_max` (shared with the FP8 kernel):")
print(body(mask_running_max))

# %% [markdown]
# Details worth noticing: `exp2` with $\log_2 e$ folded into the scale (one MUFU instruction per score; the
# returned LSE is converted back to natural log), masks only on the tiles that need them (ragged tails and the
# causal diagonal), and the running max guarded so fully masked rows give 0, not NaN.
#
# ## 4. The kernels, run in the interpreter on tiny shapes
#
# The interpreter executes the same kernels with NumPy on the CPU — slow, but exact enough to check every kernel
# against the float64 formulas (this is how the assignments test Triton code on a laptop):

# %%
def f64(x):
    return x.detach().to(torch.float64).cpu().numpy()

torch.manual_seed(5)  # the same inputs on every build: the printed errors do not change from run to run
x = torch.randn(6, 300, device=DEVICE) * 5
print("softmax            : max |err| vs torch.softmax =", (softmax(x) - torch.softmax(x, -1)).abs().max().item())

q = torch.randn(1, 4, 75, 32, device=DEVICE); k = torch.randn(1, 2, 75, 32, device=DEVICE)
v = torch.randn(1, 2, 75, 32, device=DEVICE)
for causal in (False, True):
    o, lse = flash_attention_forward(q, k, v, causal=causal)
    o_ref, lse_ref = attention(f64(q), f64(k), f64(v), causal=causal, return_lse=True)
    print(f"flash forward      : causal={causal!s:5} GQA 4/2 heads, N=75 (ragged): max |err| O "
          f"{np.abs(f64(o) - o_ref).max():.1e}, LSE {np.abs(f64(lse) - lse_ref).max():.1e}")

qg = q.clone().requires_grad_(True); kg = k.clone().requires_grad_(True); vg = v.clone().requires_grad_(True)
do = torch.randn_like(q)
flash_attention(qg, kg, vg, causal=True).backward(do)
q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
s = q64 @ k64.repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(32)
s = s.masked_fill(torch.ones(75, 75, dtype=torch.bool).triu(1), float("-inf"))
(torch.softmax(s, -1) @ v64.repeat_interleave(2, 1)).backward(do.double())
print("flash backward     : max rel err dQ, dK, dV vs autograd =",
      [f"{((a.grad.double() - b.grad).abs().max() / b.grad.abs().max()).item():.1e}" for a, b in
       ((qg, q64), (kg, k64), (vg, v64))])

qd = torch.randn(2, 8, 32, device=DEVICE); kd = torch.randn(2, 2, 200, 32, device=DEVICE)
vd = torch.randn(2, 2, 200, 32, device=DEVICE)
lens = torch.tensor([200, 57], device=DEVICE, dtype=torch.int32)
od = flash_decode(qd, kd, vd, seq_lens=lens, num_splits=3)
ref = [attention(f64(qd[b])[:, None], f64(kd[b, :, :int(lens[b])]), f64(vd[b, :, :int(lens[b])]))[:, 0] for b in range(2)]
print("flash_decode       : 3 splits, ragged lengths: max |err| =", max(np.abs(f64(od[b]) - ref[b]).max() for b in range(2)))

bs = 16                                   # the same K/V, scattered into 16-token pages in a shuffled order
nblk = math.ceil(200 / bs)
perm = torch.randperm(2 * nblk)
k_cache = torch.zeros(2 * nblk, bs, 2, 32, device=DEVICE); v_cache = torch.zeros_like(k_cache)
tables = perm.view(2, nblk).to(torch.int32)
for b in range(2):
    for j in range(nblk):
        n = min(bs, 200 - j * bs)
        k_cache[tables[b, j], :n] = kd[b, :, j * bs:j * bs + n].transpose(0, 1)
        v_cache[tables[b, j], :n] = vd[b, :, j * bs:j * bs + n].transpose(0, 1)
op = paged_decode(qd, k_cache, v_cache, tables.to(DEVICE), lens)
print("paged_decode       : block size 16, shuffled pages: max |diff| vs flash_decode =", (op - od).abs().max().item())

# %% [markdown]
# ## 5. On a GPU
#
# `benchmarks/course/bench_attention.py` times the same kernels against PyTorch's SDPA backends (FLASH_ATTENTION is
# FlashAttention-2; cuDNN) in the FlashAttention convention (batch × seqlen = 16k, hidden 2048, bf16). The course's
# bars (docs/design.md §7) are ≥ 1.0x SDPA-flash in the forward and ≥ 0.9x in the backward.
# If a result file is present:

# %%
gpu = [(p, r) for p, r in load_results("*.json") if isinstance(r, dict) and r.get("attention")]
if not gpu:
    not_run("GPU attention benchmark", "<gpu>-attention.json")
for path, r in gpu:
    rows = r["attention"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
    for ax, pas in zip(axes, ("fwd", "bwd")):
        for (d, causal), st in zip(((64, False), (64, True), (128, False), (128, True)), ("-", "--", "-", "--")):
            sel = [x for x in rows if x["d"] == d and x["causal"] == causal]
            for impl, mk, col in (("ours", "o", "tab:blue"), ("sdpa_flash", "s", "tab:orange"),
                                  ("sdpa_cudnn", "^", "tab:green")):
                pts = [(x["N"], x[impl][f"{pas}_tflops"]) for x in sel if x.get(impl, {}).get(f"{pas}_tflops")]
                if pts and d == 128:
                    ax.plot(*zip(*pts), mk + st, color=col, label=f"{impl} {'causal' if causal else ''}", ms=4)
        ax.set_xscale("log", base=2); ax.set_xlabel("sequence length N"); ax.set_title(f"{pas}, d=128 (dashed: causal)")
    axes[0].set_ylabel("TFLOP/s"); axes[1].legend(fontsize=7)
    fig.suptitle(f"benchmarks/results/{path.name}: {r.get('gpu')}, {r.get('dtype')}")
    plt.tight_layout()
    for pas in ("fwd", "bwd"):
        ratios = [x["ours"][f"{pas}_tflops"] / x["sdpa_flash"][f"{pas}_tflops"] for x in rows
                  if x.get("ours", {}).get(f"{pas}_tflops") and x.get("sdpa_flash", {}).get(f"{pas}_tflops")]
        best = max((x["ours"][f"{pas}_tflops"] or 0) for x in rows)
        if ratios:
            print(f"{r.get('gpu')}: {pas} ours / SDPA-flash: min {min(ratios):.2f}x, median "
                  f"{float(np.median(ratios)):.2f}x, max {max(ratios):.2f}x; best ours {best:.0f} TFLOP/s")
