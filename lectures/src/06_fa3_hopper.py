# %% [markdown]
# # Lecture 6 — FlashAttention-3: optimizing attention for Hopper (and Blackwell)
#
# **Learning objectives.** After this lecture you can:
#
# 1. Explain why the exponential limits FlashAttention on Hopper, using the cycle model's exp-to-matmul ratio.
# 2. Describe ping-pong (inter-warpgroup) and intra-warpgroup overlap, and the mbarriers that order them.
# 3. Explain how a Hadamard rotation lowers the FP8 quantisation error, and reproduce the effect.
# 4. Compare naive and LPT tile schedules for causal attention with the scheduling simulator.
# 5. Read the phases of a warp-specialised kernel's barriers through the mbarrier model.
#
# FlashAttention-2 reaches ~70% of peak on an A100 but only **35–40% on an H100**. Tri Dao's talk
# ("Optimizing Attention for Modern Hardware"; Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao) explains why and
# what FlashAttention-3 does about it:
#
# 1. **New instructions** on H100: WGMMA (a higher-throughput, asynchronous matrix multiply; the older
#    `mma.sync` can only reach 2/3 of peak) and TMA (asynchronous bulk copies global ↔ shared memory that save
#    registers).
# 2. **Asynchrony**: overlap the softmax with the matmuls — between warpgroups (warp specialisation, pingpong
#    scheduling) and within a warpgroup.
# 3. **Low precision**: FP8, with incoherent processing to tame outliers.
#
# plus persistent kernels, LPT scheduling for causal attention, GQA packing and MLA. Upshot (the FA3 paper's
# abstract, H100, FP16/BF16): **1.5–2.0x faster than FlashAttention-2**; the algorithmic ideas carry over to
# Blackwell. None of this can run on a CPU, so this lecture turns each idea into arithmetic or a simulation from
# `reference.simulators` (`scheduling`, `fp8_error`, `cycle_model`) and reproduces the talk's numbers where that is possible. Numbers marked *(talk)* are quoted, not measured here.
#
# **Reading path:** lecture 5 → this lecture → lecture 7.

# %%
import numpy as np

from lectures._exercise import check_guess
from lectures._plots import gantt, load_results, setup
from reference.simulators import cycle_model as cyc, fp8_error as fp8err, scheduling as sched

plt = setup()

# %% [markdown]
# ## 1. Why overlap: the exponential is slow
#
# One attention tile of $128 \times 128$ with head dimension 128 does two GEMMs ($S = QK^\top$ and $O \mathrel{+}= PV$)
# on the tensor cores and one `exp2` per score on the multi-function unit (MUFU). The talk's arithmetic, per
# SM and per clock. **Predict, then run:** on an H100 in FP8 (tensor cores twice as fast as in FP16, MUFU
# unchanged), how long do the exponentials take, as a fraction of the GEMMs' cycles?

# %%
guess = None  # your answer, a number (exp cycles / GEMM cycles)
check_guess(guess, cyc.tile_cycles(128, 128, 128, "H100", "fp8")["exp_over_mma"], what="H100 fp8: exp / GEMM cycles")
for gpu, dt in (("H100", "fp16"), ("H100", "fp8"), ("B200", "bf16")):
    c = cyc.tile_cycles(128, 128, 128, gpu, dt)
    print(f"{gpu} {dt:4s}: GEMMs {c['gemm_flops'] / 1e6:.1f} MFLOP / {cyc.HARDWARE[gpu]['mma_flops_per_cycle'][dt]} "
          f"FLOP/cycle = {c['mma_cycles']:5.0f} cycles ({c['mma_cycles_per_gemm']:.0f} per GEMM);  "
          f"exp2: {c['exp_ops']} ops / 16 per cycle = {c['exp_cycles']:.0f} cycles  -> exp/GEMM = {c['exp_over_mma']:.2f}")

# %% [markdown]
# The special function units have very low throughput relative to tensor cores: on H100 in FP16 the
# exponentials take **50% of the cycles of the GEMMs**; in FP8 (GEMMs twice as fast) or on Blackwell (UMMA at
# 8192 FLOPs/cycle: 512 cycles per GEMM) they take **as long as** the GEMMs. Done one after the other, the
# tensor cores idle a third to a half of the time. We want to be doing `exp2` while the tensor cores are busy.
#
# ## 2. Inter-warpgroup overlap: pingpong scheduling
#
# Four words of Hopper vocabulary, used from here on:
#
# * a **warpgroup** is four consecutive warps of a CTA, 128 threads: the unit that issues one Hopper matrix
#   multiply together;
# * **WGMMA** (`wgmma.mma_async`, Gluon's `warpgroup_mma`) is that matrix multiply: a warpgroup issues it, the
#   tensor cores run it *asynchronously* reading operands from shared memory, and a later `wgmma.wait_group n`
#   waits until at most `n` issued groups are still running — so the warpgroup can compute something else in
#   between;
# * **TMA** (the Tensor Memory Accelerator) copies a whole tile between global and shared memory from one
#   instruction, described by a tensor descriptor, without using the threads' registers;
# * an **mbarrier** is a barrier object in shared memory: threads *arrive* on it, a TMA copy can add the bytes it
#   will write, and a thread *waits* on it until the expected arrivals and bytes have come. Each completion flips
#   its one-bit phase, so a waiter names the phase it expects (section 10b follows the phases through a loop).
#
# The easy solution is to leave it to the warp schedulers (several warpgroups in flight); it works reasonably
# well. FlashAttention-3 does better with explicit **pingpong** scheduling: two warpgroups synchronise with
# barriers (`bar.sync`) so that one does its softmax while the other's GEMMs run *(talk: 580 → 640 TFLOPS)*.
# A timeline with the cycle counts above:

# %%
c = cyc.tile_cycles(128, 128, 128, "H100", "fp16")
g, e = c["mma_cycles"], c["exp_cycles"]
fig, ax = plt.subplots(2, 1, figsize=(8, 3.4), sharex=True)
t = 0
for k in range(4):                                   # one warpgroup, no overlap
    ax[0].barh(0, g, left=t, color="tab:blue"); ax[0].barh(0, e, left=t + g, color="tab:orange"); t += g + e
ax[0].set_yticks([0]); ax[0].set_yticklabels(["WG1"]); ax[0].set_title(
    f"no overlap: tensor cores busy {cyc.pingpong_utilisation(g, e, overlap=False):.0%}")
for wg in range(2):                                  # pingpong: WG2 starts its GEMMs while WG1 does softmax
    t = wg * g
    for k in range(2):
        ax[1].barh(wg, g, left=t, color="tab:blue"); ax[1].barh(wg, e, left=t + g, color="tab:orange")
        t += 2 * g
ax[1].set_yticks([0, 1]); ax[1].set_yticklabels(["WG1", "WG2"]); ax[1].invert_yaxis()
ax[1].set_title(f"pingpong: tensor cores busy {cyc.pingpong_utilisation(g, e):.0%} (blue = GEMMs, orange = softmax)")
ax[1].set_xlabel("cycles")
plt.tight_layout()
for gpu, dt in (("H100", "fp16"), ("H100", "fp8"), ("B200", "bf16")):
    c2 = cyc.tile_cycles(128, 128, 128, gpu, dt)
    print(f"{gpu} {dt}: tensor-core utilisation without overlap "
          f"{cyc.pingpong_utilisation(c2['mma_cycles'], c2['exp_cycles'], False):.0%}, with pingpong "
          f"{cyc.pingpong_utilisation(c2['mma_cycles'], c2['exp_cycles']):.0%}")

# %% [markdown]
# **Intra-warpgroup overlap.** Within one warpgroup, FA3 pipelines two stages: the `PV` GEMM of iteration $k$
# runs (asynchronously, WGMMA) while the softmax of iteration $k+1$ is computed *(talk: 640 → 670 TFLOPS)*. The
# cost is registers: the accumulator of the next $QK^\top$ and the operand of the current $PV$ are live at the
# same time.
#
# **Blackwell** has the same problem, worse: UMMA takes 512 cycles per GEMM and MUFU.EX2 1024 cycles per tile,
# so the CUTLASS Blackwell FMHA (example 77) runs two query tiles ($Q_H$, $Q_L$) in pingpong: while the tensor
# cores compute $S^L = Q_L K^\top$ and $O^H \mathrel{+}= P^H V$, the MUFU exponentiates $S^H$, and vice versa.
# A second Blackwell problem is *instruction issue*: an SM issues 4 instructions per cycle (one per scheduler, 32
# lanes each) and the FP32 pipes do 128 FMA lane-ops per cycle, so to reach peak *every* instruction would have
# to be an FMA. New SASS instructions halve the pressure: `FADD2`, `FMUL2`, `FFMA2` (2 ops per instruction;
# PTX `add/mul/fma.f32x2`, intrinsics `__fadd2_rn`, `__fmul2_rn`, `__ffma2_rn`) and `FMNMX3` (3-input max, which
# the compiler emits for `fmax(a, fmax(b, c))`).

# %%
row = 128
print(f"row max over {row} scores: {row - 1} two-input FMNMX vs {int(np.ceil((row - 1) / 2))} three-input FMNMX3")
print(f"scale-and-subtract x*log2e - m*log2e over {row} scores: {row} FFMA vs {row // 2} FFMA2 instructions")

# %% [markdown]
# ## 3. FP8 with incoherent processing
#
# FP8 tensor cores double WGMMA throughput but trade off accuracy: e4m3 keeps 3 mantissa bits, and LLM
# activations have **outliers** — a few huge entries. FA3 multiplies $Q$ and $K$ by a random orthogonal matrix
# $J$ before quantising, which "spreads out" the outliers; the scores do not change, because
# $S = QK^\top = (QJ)(KJ)^\top$ when $JJ^\top = I$. $J$ is a Hadamard matrix times a random $\pm 1$ diagonal, so
# applying it costs $O(d \log d)$ per row, and can be fused with the rotary embedding.
#
# The talk: *"reduces quantization error by 2.6x on normally distributed QKV data with 0.1% entries given large
# magnitude"*. The FA3 paper (section 4.3) gives the setup: entries $\mathcal N(0,1)$ plus, for 0.1% of them, an
# independent $\mathcal N(0, 10^2)$; its Table 3 gives the RMSE of the attention output vs FP64 for each
# combination: baseline FP8 (per-tensor scales, no rotation) $2.4\cdot10^{-2}$; FA3 FP8 with both block
# quantisation and incoherent processing $9.1\cdot10^{-3}$ (the 2.6x); without block quantisation (per-tensor
# scales + rotation) $9.3\cdot10^{-3}$; without incoherent processing (block scales, no rotation)
# $2.4\cdot10^{-2}$. So the rotation does the work, the block scales add little. `fp8err.fp8_incoherent_experiment`
# redoes the **per-tensor + rotation** row ($9.3\cdot10^{-3}$) and the baseline on the CPU (e4m3 rounding by
# `torch.float8_e4m3fn`, per-tensor scale, $d = 128$, one head per length):

# %%
rng = np.random.default_rng(6)
ns = [512, 1024, 2048, 4096]
res = [fp8err.fp8_incoherent_experiment(rng, n=n, d=128, n_heads=1) for n in ns]
print(f"{'N':>5} | {'S rmse plain':>12} {'S rmse J':>9} {'ratio':>6} | {'O rmse plain':>12} {'O rmse J':>9} {'ratio':>6}")
for n, r in zip(ns, res):
    print(f"{n:5d} | {r['s_plain']:12.3f} {r['s_hadamard']:9.3f} {r['s_ratio']:6.2f} | "
          f"{r['o_plain']:12.2e} {r['o_hadamard']:9.2e} {r['o_ratio']:6.2f}")
print("(QJ)(KJ)^T - QK^T in float64, largest |difference|:", max(r["rotation_err"] for r in res))

fig, ax = plt.subplots(1, 2, figsize=(8.5, 3))
ax[0].plot(ns, [r["o_plain"] for r in res], "s-", label="FP8, per-tensor scale")
ax[0].plot(ns, [r["o_hadamard"] for r in res], "o-", label="FP8 + random Hadamard")
ax[0].axhline(2.4e-2, color="tab:blue", ls=":", label="FA3 Table 3: baseline FP8 2.4e-2")
ax[0].axhline(9.3e-3, color="tab:orange", ls=":", label="FA3 Table 3: per-tensor + rotation 9.3e-3")
ax[0].set_xscale("log", base=2); ax[0].set_xlabel("sequence length N"); ax[0].set_ylabel("RMSE of O")
ax[0].legend(fontsize=7)
ax[1].plot(ns, [r["o_ratio"] for r in res], "o-", label="output O")
ax[1].plot(ns, [r["s_ratio"] for r in res], "s--", label="scores S")
ax[1].axhline(2.6, color="k", ls=":", label="talk: 2.6x")
ax[1].set_xscale("log", base=2); ax[1].set_xlabel("sequence length N"); ax[1].set_ylabel("error reduction")
ax[1].legend(fontsize=7)
plt.tight_layout()

# %% [markdown]
# What we measure (see also `notes/lectures.md`): the output error with the rotation matches the paper's
# per-tensor + rotation row ($9.3\cdot10^{-3}$) closely, and the reduction grows with $N$ — about 1.3x at $N = 512$,
# 1.8x at 1024, **1.9–2.5x at $N = 4096$** (12 random draws, mean 2.13x) and 2.3–2.9x at $N = 8192$ (mean 2.64x),
# i.e. the talk's 2.6x at long sequences (`python3 -m benchmarks.course.fp8_error`,
# `benchmarks/results/cpu-fp8-error.json`; the cell above is its first run, one draw per length; the test suite
# checks a 1.8–4x band at $N = 4096$). Surprisingly, the **RMS error of $S$
# itself does not improve at all** (ratio ≈ 1): FP8 rounding is *relative* (3 mantissa bits at every magnitude), and a rotation preserves norms, so the total
# rounding error of $q \cdot k$ is unchanged. What changes is its *direction*: an outlier coordinate of $q$
# rounded with relative error $\varepsilon$ scales its whole contribution to the row's logits by $1+\varepsilon$,
# an error aligned with the logits themselves (a wrong softmax "temperature" for that row). After rotation the
# outlier is spread over 128 coordinates whose independent roundings largely cancel along the row:

# %%
q, k = fp8err.outlier_qkv(rng, (1024, 128)), fp8err.outlier_qkv(rng, (1024, 128))
j = fp8err.random_hadamard(128, rng)
s = q @ k.T
for name, s8 in (("plain", fp8err.quantize_fp8(q) @ fp8err.quantize_fp8(k).T),
                 ("Hadamard", fp8err.quantize_fp8(q @ j) @ fp8err.quantize_fp8(k @ j).T)):
    along, rest, beta = fp8err.aligned_error(s, s8)
    print(f"{name:8s}: error along the logits {along:.3f} (largest row 'temperature' error {beta:.3f}), "
          f"remaining error {rest:.3f}")

# %% [markdown]
# FP8 has a second, purely mechanical problem the talk lists: **layout conformance** — the FP8 WGMMA wants its
# second operand K-major, so $V$ must be transposed in the kernel (FA3 does it in shared memory) and the
# register layout of $P$ after the first GEMM must be permuted to match the operand layout of the second.
#
# ## 4. Persistent kernels: hiding prologue and epilogue
#
# Tensor cores are so fast that a tile's *prologue* (load $Q$ and the first $K, V$) and *epilogue* (write $O$
# and LSE) are no longer negligible. A persistent kernel launches a fixed number of CTAs (= number of SMs),
# each looping over work tiles; with asynchronous TMA stores, one tile's epilogue and the next tile's prologue
# overlap the mainloop *(talk: 670 → 700 TFLOPS)*:

# %%
for pro_epi in (1, 2, 4):
    plain = cyc.persistent_time(132 * 8, 132, mainloop=20, prologue=pro_epi, epilogue=pro_epi, persistent=False)
    pers = cyc.persistent_time(132 * 8, 132, mainloop=20, prologue=pro_epi, epilogue=pro_epi)
    print(f"8 tiles per SM, mainloop 20, prologue = epilogue = {pro_epi}: one CTA per tile {plain:.0f}, "
          f"persistent {pers:.0f}  ({plain / pers:.2f}x)")

# %% [markdown]
# ## 5. Load balancing causal attention: longest-processing-time-first
#
# With a causal mask, query block $i$ visits $i+1$ key blocks (lecture 3), so work tiles are unequal. The talk's
# example: 2 batches × 4 query blocks (costs 1, 2, 3, 4) on 3 SMs. Handing tiles out in launch order — what the
# hardware scheduler, or a persistent kernel's tile counter, does — leaves the longest tile for last: per-SM work
# **[9, 5, 6]**. Sorting tiles longest-first (LPT, Graham 1969) gives **[7, 7, 6]**:

# %%
tiles = sched.causal_tiles(n_batches=2, n_q_blocks=4)
naive, lpt = sched.schedule(tiles, 3, "naive"), sched.schedule(tiles, 3, "lpt")
print("tile costs in launch order:", [t.cost for t in tiles])
print("naive:", naive.loads, " LPT:", lpt.loads)
fig, ax = plt.subplots(2, 1, figsize=(7, 3.6), sharex=True)
gantt(ax[0], naive, "launch order:")
gantt(ax[1], lpt, "LPT:")
plt.tight_layout()

# %% [markdown]
# At GPU scale (132 SMs, 16 heads, $N = 8192$ in 128-row blocks, so 64 query blocks per head) the naive order
# leaves a ragged tail; LPT lands on or next to the lower bound
# $\max(\text{longest tile}, \lceil\text{total}/W\rceil)$ — in the table below it meets it in three rows and
# is one unit above it (129 vs 128) for 2 batches x 32 blocks. LPT is a heuristic (Graham's guarantee:
# within $4/3 - 1/(3W)$ of the optimum), not always optimal.
#
# The model's assumption: each SM is **one worker running one program at a time** (one resident CTA per SM,
# as in FA3's persistent kernel, which launches one CTA per SM and loops over tiles). A kernel with several
# resident CTAs per SM shares the SM's throughput among them and is not modelled by this list schedule.
# The talk measured causal attention going from 670 to 730 TFLOPS. The caveat: reordering tiles changes which
# $K, V$ blocks are hot at the same time, so care is needed not to spill the L2 cache (L2 swizzling).

# **Predict, then run.** 2 batches x 16 heads x 32 query blocks (block $i$ costs $i + 1$) on 132 SMs: what is
# the lower bound on the makespan?

# %%
guess = None  # your answer, a number of time units
check_guess(guess, sched.makespan_lower_bound(sched.causal_tiles(2, 32, n_heads=16), 132), rel=0,
            what="makespan lower bound, 2 x 16 x 32 tiles on 132 SMs")
print(f"{'batch':>5} {'q blocks':>8} | {'naive makespan':>14} {'LPT':>6} {'bound':>6} | {'naive eff':>9} {'LPT eff':>8}")
for b, nb in ((1, 16), (2, 32), (4, 64), (8, 64)):
    tl = sched.causal_tiles(b, nb, n_heads=16)
    n_, l_ = sched.schedule(tl, 132, "naive"), sched.schedule(tl, 132, "lpt")
    print(f"{b:5d} {nb:8d} | {n_.makespan:14d} {l_.makespan:6d} {sched.makespan_lower_bound(tl, 132):6d} | "
          f"{n_.efficiency:9.1%} {l_.efficiency:8.1%}")

# %% [markdown]
# ## 6. Decoding: split-KV and GQA packing
#
# For decoding, the query length is a few tokens while the context is long (e.g. 128k). FA2 already had
# Flash-Decoding (split along the KV length; lecture 7). FA3 adds **GQA packing**: a WGMMA tile is 64 rows tall
# (M = 64), which is mostly wasted for one query token — unless the query heads that share a KV head are stacked
# into the same tile. That also means each K/V block is loaded once per group instead of once per query head.
# FA2 did this for one query token (a reshape); FA3 extends it to any query length, which also helps some
# compute-bound cases with tile-quantisation effects.

# %%
print(f"{'q_len':>5} {'Hq/Hkv':>7} | {'unpacked: tiles, util':>22} | {'packed: tiles, util':>20} | K/V loads")
for q_len, hq, hkv in ((1, 32, 8), (1, 64, 8), (1, 64, 1), (4, 32, 8), (16, 64, 1)):
    r = cyc.gqa_packing(q_len, hq, hkv)
    print(f"{q_len:5d} {f'{hq}/{hkv}':>7} | {r['tiles_unpacked']:10d}, {r['util_unpacked']:9.1%} | "
          f"{r['tiles_packed']:8d}, {r['util_packed']:9.1%} | {r['kv_loads_unpacked']} -> {r['kv_loads_packed']}")

# %% [markdown]
# ## 7. Multi-head latent attention (MLA)
#
# DeepSeek's MLA caches one compressed latent per token (head dim 576 for $QK^\top$, 512 for $PV$) shared by all
# 128 query heads. Two consequences:
#
# * **Registers.** The $64 \times 512$ fp32 output accumulator of one warpgroup (128 threads) would need 256
#   registers per thread — more than a thread can have. FA3 splits with warp specialisation: WG1 does the
#   $QK^\top$ matmul *and* half of $PV$, WG2 only the other half of $PV$:

# %%
print("one WG, O 64x512:", cyc.accumulator_registers(64, 512), "registers/thread (limit 255)")
print("WG1: S 64x64 + O 64x256:", cyc.accumulator_registers(64, 64) + cyc.accumulator_registers(64, 256),
      "| WG2: O 64x256:", cyc.accumulator_registers(64, 256))

# %% [markdown]
# * **Compute-bound decoding.** Each cached byte is reused by all 128 heads, so even a single query token does
#   enough FLOPs per byte to approach the compute-bound regime — unlike GQA decoding:

# %%
ridge = 989e12 / 3.35e12     # H100 SXM: dense bf16 FLOP/s over HBM bytes/s
for name, args in (("GQA-8 decode (Hq=32, Hkv=8, d=128)", (1, 4, 128, 128, 2 * 128 * 2)),
                   ("MLA decode, 1 token", (1, 128, 576, 512, 576 * 2)),
                   ("MLA decode, 2 tokens (speculative)", (2, 128, 576, 512, 576 * 2))):
    ai = cyc.decode_intensity(*args)
    print(f"{name:36s}: {ai:6.1f} FLOP per KV byte  ({ai / ridge:.2f}x the H100 ridge point {ridge:.0f})")

# %% [markdown]
# ## 8. The talk's benchmarks, and ours
#
# The speed-up over FA2 this lecture quotes is the FA3 paper's: 1.5–2.0x (H100, FP16/BF16; the paper reaches
# 740 TFLOPS, 75% of peak). The talk's later benchmark slide *(talk, H100, CUDA 12.8, Triton 3.1, cuDNN 9.6)*
# shows a newer FA3 build reaching up to 840 TFLOPS in BF16; causal attention 730–750 TFLOPS, about matmul
# speed; FP8 up to 1.3 PFLOPS. This course's Triton kernels are FlashAttention-2-style (no warp specialisation, no explicit pingpong); if the GPU benchmark has been
# run, here is how far they get (an H200 has the H100's tensor cores, 989 dense bf16 TFLOPS, with faster HBM, so
# its attention TFLOPS are comparable to the talk's H100 numbers):

# %%
gpu = [(p, r) for p, r in load_results("*.json") if isinstance(r, dict) and r.get("attention")]
if not gpu:
    print("GPU benchmark results (benchmarks/results/<gpu>-attention.json) are not there yet -- `make bench` has not "
          "been run on a GPU for this checkout, so no GPU numbers are shown (none are invented).")
for path, r in gpu:
    for causal in (False, True):
        for impl in ("ours", "sdpa_flash", "sdpa_cudnn"):
            vals = [x[impl]["fwd_tflops"] for x in r["attention"]
                    if x["causal"] == causal and x.get(impl, {}).get("fwd_tflops")]
            if vals:
                print(f"benchmarks/results/{path.name} ({r.get('gpu')}, {r.get('dtype')}): {impl:10s} "
                      f"{'causal' if causal else 'non-causal':10s} forward: best {max(vals):5.0f} TFLOP/s")
    print("talk (FA3, H100): up to 840 TFLOPS non-causal, 730-750 causal (BF16)")

# %% [markdown]
# ## 9. Two of these ideas as the course's Triton kernels
#
# Two of the ideas above exist as kernels in `reference.triton` (Triton 3.6; on a CPU they run in the Triton
# interpreter, so the cells below use tiny shapes):
#
# * `flash_attention_forward_fp8(q, k, v, causal, hadamard=...)` — Q, K, V rounded to e4m3 with **one scale per
#   block** (64 query rows, 128 key rows on the GPU), fp32 accumulation, $P$ rounded to e4m3 for $PV$, $V$ stored
#   transposed (the layout-conformance point of section 3), and the random Hadamard rotation of $Q$ and $K$ as
#   an option;
# * `flash_attention_forward_persistent(q, k, v, seq_lens=..., order="lpt")` — one program per SM, each pulling
#   the next (batch, head, query block) item from a global counter, the items sorted longest-first by
#   `reference.simulators.scheduling.order_tiles` (the `schedule` of section 5, on the GPU's scheduler).
#
# Both return what `flash_attention_forward` returns, `(o, lse)`. Assignment 3's optional Part 4 has you write
# the first one yourself (its quantisation kernel included), graded for accuracy against float64 and, on a
# Hopper GPU, for speed against the bf16 forward. First a check against float64 on a small causal problem
# (ragged, GQA):

# %%
import torch

from reference.triton import flash_attention_forward_fp8, flash_attention_forward_persistent, DEVICE

gen = torch.Generator().manual_seed(0)
q = torch.randn(1, 4, 48, 64, generator=gen).to(DEVICE, torch.bfloat16)
k, v = (torch.randn(1, 2, 80, 64, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(2))
kk, vv = (x.double().repeat_interleave(2, 1) for x in (k, v))
s = q.double() @ kk.transpose(-1, -2) / 8.0
s = s.masked_fill(torch.ones(48, 80, dtype=torch.bool).triu(80 - 48 + 1).to(s.device), float("-inf"))
o_ref = torch.softmax(s, -1) @ vv
for name, (o, _) in (("FP8", flash_attention_forward_fp8(q, k, v, causal=True)),
                     ("FP8 + Hadamard", flash_attention_forward_fp8(q, k, v, causal=True, hadamard=True)),
                     ("persistent LPT", flash_attention_forward_persistent(q, k, v, causal=True))):
    err = ((o.double() - o_ref).norm() / o_ref.norm()).item()
    print(f"{name:15s}: relative error vs float64 {err:.1e}")

# %% [markdown]
# On the GPU (`benchmarks/course/bench_hopper.py`, one run per GPU; results in `benchmarks/results/<gpu>-hopper.json`,
# notes in `notes/hopper.md`): how close the course's bf16 FA2 kernel gets to cuDNN at d = 128, what FP8 buys,
# how much error the rotation removes, and what the persistent LPT kernel changes. Without a results file
# nothing is shown (no number is invented). One H100 number is an outlier: the causal N = 2048 forward at
# 0.38x cuDNN was 0.82x when re-run (`main_rerun` in `h100-hopper.json`); the persistent rows come from re-runs after the
# kernel learned to launch two programs per SM (the notes give both runs and the ncu profile that showed why).

# %%
runs = load_results("*-hopper.json")
if not runs:
    print("benchmarks/results/<gpu>-hopper.json is not there yet: run `python3 -m benchmarks.course.bench_hopper` on "
          "a Hopper GPU.")
for path, r in runs:
    print(f"== {path.name}: {r.get('gpu')}")
    for row in r.get("main", []):
        if row["d"] == 128 and row["N"] >= 2048 and "fwd_tflops" in row.get("cudnn", {}):
            o, c = row["ours"], row["cudnn"]
            print(f"  bf16 d=128 {'causal' if row['causal'] else 'non-causal':10s} N={row['N']:5d}: forward "
                  f"{o['fwd_tflops']:4.0f} TFLOP/s = {o['fwd_tflops'] / c['fwd_tflops']:.2f}x cuDNN, backward "
                  f"{o['bwd_tflops'] / c['bwd_tflops']:.2f}x cuDNN")
    for row in r.get("fp8_speed", []):
        print(f"  FP8 {'causal' if row['causal'] else 'non-causal':10s} N={row['N']:5d}: {row['fp8_tflops']:4.0f} "
              f"TFLOP/s = {row['speedup_kernel']:.2f}x our bf16 forward (kernel alone), "
              f"{row['speedup_with_quant']:.2f}x with the quantisation in torch")
    for row in r.get("fp8_accuracy", []):
        if not row["causal"]:
            print(f"  FP8 error vs float64, {row['inputs']:8s} x{row['factor']:<3}: plain {row['fp8_plain_rel']:.1e}, "
                  f"Hadamard {row['fp8_hadamard_rel']:.1e} ({row['ratio_plain_over_hadamard']:.1f}x); "
                  f"bf16 {row['bf16_rel']:.1e}")
    for row in r.get("persistent", []):
        what = f"N={row['N']}" if row["lens"] is None else f"{len(row['lens'])} mixed lengths"
        print(f"  causal {what:18s}: one program per item {row['grid_naive_tflops']:4.0f} TFLOP/s, persistent LPT "
              f"{row['persistent_lpt_tflops']:4.0f}, persistent LPT in L2-sized head groups "
              f"{row['persistent_lpt_l2_tflops']:4.0f} ({row['persistent_lpt_over_grid_naive']:.2f}x)")

# %% [markdown]
# ## 10. Warp specialisation and ping-pong, written out in Gluon
#
# Section 9's kernels are plain Triton, and Triton schedules a `tl.dot` loop itself: in one iteration
# $S_j = QK_j^\top \to \mathrm{softmax} \to O \mathrel{+}= P_jV_j$ runs in order, so the tensor cores wait during
# every softmax (sections 1-2). Triton 3.6 also ships **Gluon**, a lower-level dialect in which the kernel
# names the hardware steps of section 2's vocabulary: asynchronous `warpgroup_mma` (WGMMA) and its wait, TMA
# copies, mbarriers, and
# `gl.warp_specialize` with a register budget per partition (`setmaxnreg`). `reference.triton.hopper.flash_gluon`
# uses it for the course's production forward (`flash_attention_forward_gluon(q, k, v, causal)`, Hopper only),
# which combines the last three ideas below; `experiments/gluon_schedules.py` builds the ablations from the same
# pieces, each one idea short (`schedule=` and `persistent=` of its `forward`), so section 10d can measure what
# each idea is worth:
#
# * `"overlap"`: FA3's intra-warpgroup overlap in one partition: issue $S_j$ and $P_{j-1}V_{j-1}$, wait for $S_j$
#   only, do its softmax while $P_{j-1}V_{j-1}$ runs;
# * `"specialized"`: a producer warp issues all TMA copies into a two-slot ring of K/V tiles; two consumer
#   warpgroups (64 query rows each) run the overlapped loop, with 240 registers each and 24 for the producer;
# * `"pingpong"`: the same plus a pair of "turn" mbarriers, so the two consumers issue their GEMMs alternately
#   (section 2's timeline);
# * persistent (the production kernel; `persistent=False` in the experiments gives one CTA per tile): one CTA
#   per SM loops over query tiles, so the next tile's Q and K/V load under the current tile's epilogue instead
#   of after a new CTA starts. The tiles go in head-major order (CTAs that run together share their heads' K/V
#   in L2) and, causal, in heavy/light pairs (query block $n-1-i$ with block $i$), the static version of
#   section 5's balancing.
#
# ### 10a. The consumer loop, line by line against FA3 Algorithm 2
#
# All the schedules run one function per consumer, `attend_overlapped`. Below is its real source (read from
# the module, not a copy), with the steps of FA3's Algorithm 2 ("consumer warpgroup forward pass with
# intra-warpgroup overlapping", Shah et al. 2024) written next to the lines that do them. Algorithm 2 is one
# warpgroup; the `PINGPONG` lines (marked **turn**) are section 3.1's inter-warpgroup ping-pong, which FA3
# writes with named barriers (`bar.sync`) and this kernel with a pair of mbarriers.

# %%
import inspect

from reference.triton.configs import GluonForwardConfig
from reference.triton.hopper import flash_gluon as fg

ALG2 = [  # (a piece of the source line, what it does in FA3 Algorithm 2 / section 3.1)
    ("mbarrier.wait(k_bars.index(it0 % STAGES)", "Alg.2: wait for K_0 in shared memory"),
    ("mbarrier.wait(turn_bars.index(WG), (r0 & 1)", "turn: wait until the other warpgroup issued its round"),
    ("s = warpgroup_mma(q_smem, k_smem.index(it0", "Alg.2: S_cur = Q K_0^T (WGMMA, async)"),
    ("mbarrier.arrive(turn_bars.index(1 - WG))", "turn: hand the tensor cores to the other warpgroup"),
    ("s = warpgroup_mma_wait(0, deps=(s,))", "Alg.2: commit and wait (nothing else in flight yet)"),
    ("mbarrier.arrive(k_bars.index(STAGES + it0", "Alg.2: release K stage 0 (empty barrier, count 2)"),
    ("p, alpha, m_i, l_i = online_softmax(s, m_i, l_i, 0,", "Alg.2: m_i, P_cur, l_i from S_cur"),
    ("for part in gl.static_range(", "one loop, or two with PEELED (unmasked, then masked blocks; 10c)"),
    ("for j in range(lo, end):", "Alg.2: main loop over key blocks j = 1 .. T_c - 1"),
    ("mbarrier.wait(k_bars.index(slot)", "Alg.2: wait for K_j"),
    ("mbarrier.wait(v_bars.index(prev)", "Alg.2: wait for V_{j-1}"),
    ("mbarrier.wait(turn_bars.index(WG), ((r0 + j)", "turn: my round j"),
    ("s = warpgroup_mma(q_smem, k_smem.index(slot)", "Alg.2: S_next = Q K_j^T, commit, do not wait"),
    ("acc = warpgroup_mma(p_op, v_smem.index(prev)", "Alg.2: O += P_cur V_{j-1}, commit, do not wait"),
    ("s = warpgroup_mma_wait(1, deps=(s,))", "Alg.2: wait for Q K_j^T only (1 group may stay in flight)"),
    ("mbarrier.arrive(k_bars.index(STAGES + slot))", "Alg.2: release K_j (Alg.2 frees K and V together)"),
    ("if N_K > 0:", "FENCE: always true; ends the block, so the P V wait stays below (10c)"),
    ("p, alpha, m_i, l_i = online_softmax(s, m_i, l_i, j,", "Alg.2: m_i, P_next, l_i from S_next -- under P V"),
    ("acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))", "Alg.2: wait for P_cur V_{j-1}"),
    ("mbarrier.arrive(v_bars.index(STAGES + prev))", "Alg.2: release V_{j-1}"),
    ("acc = acc * gl.convert_layout(alpha", "Alg.2: rescale O (FA2's alpha)"),
    ("p_op = gl.convert_layout(p.to(dtype)", "Alg.2: S_next -> S_cur (P as the next WGMMA's A operand)"),
    ("mbarrier.wait(v_bars.index(last)", "Alg.2: wait for V_{T_c-1}"),
    ("mbarrier.wait(turn_bars.index(WG), ((r0 + hi)", "turn: my last round (the last P V)"),
    ("acc = warpgroup_mma(p_op, v_smem.index(last)", "Alg.2: O += P_last V_{T_c-1}, commit and wait"),
]


def annotated(fn, notes):
    """The source of ``fn`` with ``notes`` appended to the lines that contain each piece (every piece must match:
    a kernel that changed makes this cell fail instead of mislabelling a line)."""
    lines = inspect.getsource(fn).splitlines()
    body = lines[[i for i, l in enumerate(lines) if l.strip().startswith('"""')][1] + 1:]  # skip the docstring
    unused = [piece for piece, _ in notes if not any(piece in l for l in body)]
    if unused:
        raise RuntimeError(f"{fn.__name__} changed; no line contains {unused}")
    out = []
    for line in body:
        hit = [note for piece, note in notes if piece in line]
        code = line.rstrip()
        out.append(f"{code:<104s}# <- {hit[0]}" if hit else code)
    return "\n".join(out)


print(annotated(fg.attend_overlapped.fn, ALG2))

# %% [markdown]
# Three things to read in it. (1) `warpgroup_mma_wait(1, ...)` is the whole trick of Algorithm 2: WGMMA
# groups retire in order, so "at most one group still in flight" after issuing $S_j$ then $P_{j-1}V_{j-1}$
# means $S_j$ is done and $P_{j-1}V_{j-1}$ may still run while the softmax of $S_j$ executes. With
# `warpgroup_mma_wait(0)` there the loop would be section 1's serial chain again. (2) The price is registers:
# `acc`, the next `s` and the `p_op` operand are live together (section 2; the compiled kernel below has 168
# registers per thread and, non-causal, no spills). (3) Every shared-memory slot has two barriers: "ready" (the TMA copy
# landed; count 1) and "empty" (both consumers are done with it; count 2). The producer, whose whole job is
# this loop, fills the ring:

# %%
print(inspect.getsource(fg.produce_kv.fn))

# %% [markdown]
# ### 10b. The barriers' phases over a few iterations
#
# An mbarrier counts completed **phases**; `mbarrier.wait(bar, P)` returns once the phase of parity $P$ has
# completed, and a freshly initialised barrier counts the phase before the first as complete: `wait(bar, 1)`
# passes at once, `wait(bar, 0)` blocks until the first completion. Count the tiles the ring has carried as
# $t$ (`it` in `produce_kv`, `it0 + j` in the consumer loop: a persistent CTA keeps counting across its query
# tiles) and the matmul rounds as $r$ (`r0 + j`). That is why the producer waits for the empty barrier with
# parity `((t // STAGES) & 1) ^ 1` (its first pass through the ring is free), the consumers for the ready
# barrier with `(t // STAGES) & 1`, and warpgroup `WG` for its turn in round $r$ with `(r & 1) ^ (1 - WG)`:
# WG 0's round 0 passes a fresh barrier, WG 1's round 0 waits for WG 0's first arrival.
# `reference.simulators.mbarrier` models exactly this (three agents, round-robin, a barrier = a count and a phase) and
# refuses a wrong phase: it reports a deadlock, a slot overwritten before both consumers released it, or
# matmul rounds out of turn. Four key/value tiles, a two-slot ring:

# %%
from lectures._barrier_plot import barrier_timeline
from reference.simulators import mbarrier as mb

events = mb.run_pingpong(n_tiles=4, stages=2)
rows = ["K ready[0]", "K ready[1]", "V ready[0]", "V ready[1]", "K empty[0]", "K empty[1]", "V empty[0]",
        "V empty[1]", "turn[0]", "turn[1]"]
fig, ax = plt.subplots(figsize=(11, 3.8))
barrier_timeline(ax, events, rows, "4 K/V tiles through a 2-slot ring, two consumers taking turns "
                 "(circle: a wait passes, with its parity; triangle: a phase completes, with the count)")
plt.tight_layout()
print("matmul rounds in issue order:", " | ".join(f"{e.agent} {e.detail.split(': ')[1]}" for e in events
                                                 if e.action == "issue")[:230], "...")
for name, bad in (("turn parities of the two warpgroups swapped",
                   dict(turn_phase_fn=lambda r, wg: mb.turn_phase(r, 1 - wg))),
                  ("empty barrier waited with the ready parity", dict(empty_phase_fn=mb.ready_phase))):
    try:
        mb.run_pingpong(4, 2, **bad)
    except mb.ProtocolError as err:
        print(f"{name}: {str(err)[:150]}")

# %% [markdown]
# ### 10c. What the compiler makes of it: predict, then compile for sm_90a on this CPU
#
# The interpreter cannot run Gluon, but Triton's compiler builds the kernel for the H100 on any machine, and
# the `cuobjdump` in its wheel reads the binary. `python3 -m benchmarks.course.gluon_aot` compiled each variant
# (the production kernel, `pingpong_persistent`, and the ablations of `experiments/gluon_schedules.py`; one to
# three minutes on two cores; results in `benchmarks/results/sm90a-gluon-aot.json`): registers per thread, shared memory,
# spills (`LDL`/`STL`), Hopper matrix instructions (`HGMMA`), mbarrier waits and arrivals, and the wgmma waits
# by how many groups they leave in flight. **Predict first:** the `pingpong` kernel adds to `specialized` one
# turn wait and one turn arrival before and after each of its three matmul issue points (round 0, the loop,
# the last $PV$). How many more `mbarrier.try_wait` instructions does its PTX have? And how many
# `wgmma.wait_group 1` does it have in all?

# %%
import json
import os
import subprocess
import sys

from lectures._plots import ROOT

(_, aot), = load_results("sm90a-gluon-aot.json")
var = aot["variants"]
guess = None  # your answer: extra mbarrier waits of pingpong over specialized (PTX)
check_guess(guess, var["pingpong"]["ptx_mbarrier_wait"] - var["specialized"]["ptx_mbarrier_wait"], rel=0,
            what="extra mbarrier.try_wait in pingpong")
guess = None  # your answer: wgmma.wait_group 1 in the pingpong kernel
check_guess(guess, var["pingpong"]["ptx_wgmma_wait_1"], rel=0, what="wgmma.wait_group 1 in pingpong")
print(f"compiled for {aot['target']} by Triton {aot['triton']}")
print(f"{'variant':24s} {'regs':>4} {'shared B':>8} {'spill':>5} {'HGMMA':>5} {'mbar wait':>9} {'mbar arrive':>11} "
      f"{'wgmma wait(0)':>13} {'wait(1)':>7}")
for name, u in ((n, u) for n, u in var.items() if "key_loop" not in u):  # key-loop options: the next cells
    print(f"{name:24s} {u['registers']:4d} {u['shared_bytes']:8d} {u['LDL'] + u['STL']:5d} {u['HGMMA']:5d} "
          f"{u['ptx_mbarrier_wait']:9d} {u['ptx_mbarrier_arrive']:11d} {u['ptx_wgmma_wait_0']:13d} "
          f"{u['ptx_wgmma_wait_1']:7d}")

# %% [markdown]
# Per consumer: three `wait_group 0` (after $S_0$, after each $PV$ in the loop, after the last $PV$) and one
# `wait_group 1`; the warp-specialised kernels have two consumers, so twice the one-partition `overlap` kernel's
# counts (and twice its `HGMMA`s: each consumer's code is its own copy). 168 registers is the kernel-wide cap
# (3 warpgroups x 128 threads x 168 fill the 64K register file); `setmaxnreg` then moves registers from the
# producer (24) to the two consumers (240). None of the kernels in this table spills, which the plain-Triton
# 128-row tile could not manage (notes/hopper.md, section 1). Spills are not gone everywhere: the causal
# persistent kernel (next table, the `_causal_` rows) spills: 38 `LDL` and 32 `STL`, scalars kept from one tile
# to the next and saved around each tile's epilogue, none inside the key-block loop, so they cost a few memory
# requests per tile, not per key block. The persistent kernels add 32 KB of shared memory for a second Q buffer
# and four barriers to hand it back.
#
# **Predict, then run (one live compile, about 5 s).** The production kernel's ring has `STAGES = 2`. With
# `STAGES = 3` (`GluonForwardConfig(num_stages=3)`, 128 x 128 tiles), how many bytes of shared memory does its CTA
# need, and does that fit the 227 KiB a Hopper CTA may have? (Two Q buffers of 128 x 128 bf16 -- the next tile's
# Q loads while this one is computed -- and `STAGES` slots each of K and V, 128 x 128 bf16 tiles, plus a few
# hundred bytes of barriers.)

# %%
guess = None  # your answer, in bytes
env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}  # compile-only mode, no GPU needed
res = subprocess.run([sys.executable, "-m", "benchmarks.course.gluon_aot", "--one", "pingpong", "--persistent",
                      "--config", "128,128,3,4"], env=env, capture_output=True, text=True, cwd=str(ROOT))
live = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else {"error": res.stderr[-300:]}
print("live compile, production kernel with STAGES=3:", {k: live.get(k) for k in ("registers", "shared_bytes", "LDL",
                                                                                  "STL", "HGMMA", "error") if k in live})
if "shared_bytes" in live:
    check_guess(guess, live["shared_bytes"], rel=0.02, what="shared bytes, production kernel, STAGES=3")
    committed = var["pingpong_persistent_stages3"]["shared_bytes"]
    print(f"= {live['shared_bytes'] / 1024:.1f} KiB against the 227 KiB limit: "
          f"{'fits' if live['shared_bytes'] <= 227 * 1024 else 'does not fit (the launch would fail)'}; "
          f"the committed file says {committed}" + ("" if live["shared_bytes"] == committed else
                                                   " (stale: re-run python3 -m benchmarks.course.gluon_aot)"))
    try:
        fg.check_gluon_config(GluonForwardConfig(block_m=128, block_n=128, num_stages=3, num_warps=4), 128)
    except ValueError as e:
        print("check_gluon_config:", e)

# %% [markdown]
# So three stages of 128-key tiles fit only the one-CTA-per-tile ablation (one Q buffer); the persistent kernel
# spends that room on its second Q buffer, which hides the next tile's Q load, and keeps two K/V stages.

# %% [markdown]
# **Where ptxas puts the wait for $P_{j-1}V_{j-1}$.** Section 10a's loop writes the softmax of $S_j$ *before*
# `warpgroup_mma_wait(0, ...)`, and the PTX keeps that order. The SASS does not: `warpgroup_mma_wait` becomes
# `WARPGROUP.DEPBAR.LE gsb0, 0x0`, an instruction with no register operands (Gluon's `deps` only constrain LLVM,
# one level up), so ptxas's scheduler is free to place it anywhere in its basic block, and it places it early.
# A basic block ends at every branch, and the loop has one: `online_softmax` masks only the blocks
# `j >= full_end` (the causal diagonal, the ragged end), a run-time `if`. The softmax therefore sits in the block
# after that `if` joins, and the wait lands at the top of that block, *above* the 64 exps: the tensor cores
# finish $P_{j-1}V_{j-1}$ while the warpgroup waits instead of computing, and Algorithm 2's overlap is lost (only
# the other warpgroup's GEMMs run under this softmax). `_aot.wgmma_wait_order` reads the SASS and counts the
# `MUFU.EX2` (exps) between each key loop's two waits; `gluon_aot` recorded it for the production kernel and for
# two ways to move the wait (`key_loop=` of `flash_attention_forward_gluon`, `attend_overlapped`'s `PEELED` /
# `FENCE`):
#
# * `peeled`: the loop split at `full_end` into an unmasked and a masked loop, no branch in either body (FA3
#   peels its masked iterations this way). Alone it does not help here: without a block boundary, ptxas
#   hoists the wait right up to the last barrier instruction before it, the K slot's release after $S_j$;
# * `fence`: that release moved after the softmax, inside `if N_K > 0:` (always true once there is a key
#   block). The branch is the point: it *ends* the softmax's block, so the wait starts the next one, below
#   all the exps. A branch in the wrong place hoisted the wait; one in the right place keeps it down.
#
# The production kernel pins `fence` at d = 128 and both options off at d = 64
# (`configs.GLUON_FWD_KEY_LOOP`); the cell prints what the H100 measured for each option in one process
# (`benchmarks/course/bench_key_loop.py`, medians of rotated rounds; notes/hopper.md has the noise, which is of the
# same order as the gains). **Predict:** in each of the two consumers' key loops, how many exps come before the
# wait with both options off, and how many with `fence` (64 scores per thread and row block, plus the two of
# `alpha`)?

# %%
guess = None  # your answer: exps before the P V wait in one key loop with fence
check_guess(guess, var["pingpong_persistent_fence"]["pv_waits"][0], rel=0, what="exps before the wait, fence")
print(f"{'variant (d = 128)':40s} {'exps before the P V wait, per key loop':>40s} {'HGMMA':>6} {'spills':>6}")
for name, u in var.items():
    if "pv_waits" in u:
        print(f"{name:40s} {str(u['pv_waits']):>40s} {u['HGMMA']:6d} {u['LDL'] + u['STL']:6d}")
for path, r in load_results("*-gluon-key-loop.json"):
    print(f"\n{path.name} ({r['meta']['gpu']}): forward TFLOP/s, x both options off")
    for row in r["bf16"]:
        t = {n: row[n]["tflops"] for n in ("cudnn", "off", "fence", "peeled_fence")}
        print(f"  d={row['d']:3d} N={row['N']:5d} {'causal' if row['causal'] else '      '}  cuDNN {t['cudnn']:4.0f}  "
              + "  ".join(f"{n} {t[n]:4.0f} ({t[n] / t['off']:.2f})" for n in ("off", "fence", "peeled_fence")))

# %% [markdown]
# ### 10d. Measured: each idea with and without persistence
#
# Each of FA3's ideas can be added to the previous one and measured alone. What each should buy, from sections
# 1, 2 and 10c: **overlap** within a warpgroup hides the softmax behind its own P·V matmul, if the registers hold
# one more live tile; **warp specialisation** takes the loads off the consumers and moves registers to them;
# **ping-pong** turns hide one warpgroup's softmax behind the other's matmuls, which pays only when the two would
# otherwise run in step; **persistence** hides each tile's prologue and epilogue behind the previous tile's work.
# **Predict** the order before the table: which idea pays most, and can one of them make the kernel *slower*
# than plain Triton?
#
# `benchmarks/course/bench_gluon.py` timed every variant in one process per GPU (each checked against float64
# first), as a fraction of cuDNN's TFLOP/s, next to the plain-Triton kernel of lecture 5. `overlap` has no
# persistent version (it is one partition that loads its own tiles). The summary lines count over the rows with
# N >= 2k (d = 64 and 128, causal and not: 16 rows per GPU):

# %%
runs = load_results("*-gluon.json", exclude=("smoke", "-fp8-"))  # <gpu>-gluon.json, not <gpu>-fp8-gluon.json
if not runs:
    print("benchmarks/results/<gpu>-gluon.json is not there yet: run `python3 -m benchmarks.course.bench_gluon` on a "
          "Hopper GPU.")
COLS = ("triton", "gluon_overlap", "gluon_specialized", "gluon_specialized_persistent", "gluon_pingpong",
        "gluon_pingpong_persistent")
for path, r in runs:
    checks = {k[6:]: f"{sum(c.get('ok', False) for c in v)}/{len(v)}" for k, v in r.items()
              if k.startswith("check:") and isinstance(v, list)}
    print(f"== {path.name}: {r.get('gpu')}; float64 checks passed: {checks}")
    print(f"  {'':19s} {'cuDNN':>5}  " + " ".join(f"{c.replace('gluon_', '').replace('_persistent', '+pers'):>13s}"
                                                   for c in COLS))
    main = r.get("bench", {}).get("main", [])
    for row in main:
        base = row["cudnn"]["tflops"]
        cells = " ".join(f"{row[c]['tflops'] / base:13.2f}" if "tflops" in row.get(c, {}) else f"{'-':>13s}"
                         for c in COLS)
        print(f"  d={row['d']:3d} {'causal' if row['causal'] else 'non-causal':10s} N={row['N']:5d} {base:5.0f}  {cells}")
    long = [x for x in main if x["N"] >= 2048 and all("tflops" in x.get(c, {}) for c in COLS)]
    if long:
        t = lambda x, c: x[c]["tflops"]
        gain = lambda xs, a, b: f"{min(t(x, a) / t(x, b) - 1 for x in xs):+.1%} to {max(t(x, a) / t(x, b) - 1 for x in xs):+.1%}"
        print(f"  N >= 2k: overlap slower than plain Triton in {sum(t(x, 'gluon_overlap') < t(x, 'triton') for x in long)}"
              f" of {len(long)} rows; pingpong vs specialized, one CTA per tile: "
              f"{gain(long, 'gluon_pingpong', 'gluon_specialized')}; both persistent: non-causal "
              f"{gain([x for x in long if not x['causal']], 'gluon_pingpong_persistent', 'gluon_specialized_persistent')}"
              f", causal {gain([x for x in long if x['causal']], 'gluon_pingpong_persistent', 'gluon_specialized_persistent')}")

# %% [markdown]
# What the table says, idea by idea:
#
# * **Overlap alone is slower than plain Triton**, not "a little faster": in 13 of 16 rows on the H100 and 15 of
#   16 on the H200 (causal d = 128, N = 2k on the H100: 0.69x cuDNN against Triton's 0.78x). One partition of
#   two warpgroups (8 warps, 128 rows) holds the $S$ accumulator, the $P$ operand and $O$ at once (217 registers
#   per thread, section 10c) and issues its own TMA copies; Triton's compiler-pipelined loop with 64-row tiles
#   hides latency as well without that pressure. The FA3 paper's ablation (its Table 2) points the same way:
#   without warp specialisation its pipelined kernel drops from 661 to 570 TFLOP/s.
# * **Warp specialisation is the step that pays**: a producer warp and two consumers with the registers moved
#   to them closes most of the gap to cuDNN (`specialized`, 0.79-1.04x at N >= 2k on the H100).
# * **Ping-pong, one CTA per tile, buys nothing**: it trails `specialized` in 13 of 16 rows on the H100 and 12
#   of 16 on the H200, by -4.2% to +6.6% (H100) and -5.2% to +1.0% (H200). With a CTA that lives for one tile, the
#   two consumers start together and the warp schedulers already interleave them; the turn barriers add
#   waits.
# * **The fair comparison is with persistence on both**: then ping-pong gains -0.1% to +10.6% (H100) and +3.1%
#   to +7.8% (H200) non-causal, and -2.0% to +6.5% (H100), -2.2% to +1.9% (H200) causal. That is the talk's
#   direction (580 -> 640 TFLOPS in FA3's CUDA kernel, about +10%), mostly smaller. An earlier H100 run had one
#   outlier, the persistent `specialized` at less than half cuDNN's speed at one shape; re-run, that row reads
#   `specialized` at causal d = 128, N = 1k (0.90x): a single do_bench median can be that far off, which is why
#   the ratios that decide a default are taken over rotated rounds (section 10c).
#
# Persistence itself: with one 164 KB CTA per SM, a CTA per tile pays its start (Q and the first K/V tile from
# memory) and its epilogue with the tensor cores idle; at N = 2k a tile has only 16 key blocks, and on the H100
# ncu shows the tensor pipe busy 64% of the time against cuDNN's 74%. The persistent kernel hides both (71%; causal 55%
# -> 62%) and lifts ping-pong at d = 128, N = 2k from 0.84-0.86x to 0.92-0.97x cuDNN
# (`benchmarks/results/*-gluon-ncu.csv`). Order matters as much as persistence: an earlier version that ran the
# tiles head-minor (neighbouring CTAs on different heads) read every head's K/V from memory once per query tile
# and fell to 0.59x (non-causal) and 0.65x (causal) at d = 128, N = 2k on the H100
# (`h100-gluon-headminor.json`). `reference.simulators.scheduling.kv_traffic` counts it with a coarse model (waves of 132
# tiles, an LRU L2 holding whole heads' K/V) for that shape: B = 8, H = 16, N = 2k, d = 128, sixteen 128-row
# query tiles per head:

# %%
tiles_head_major = [sched.Tile(0, h, i, 16) for h in range(128) for i in range(16)]
tiles_head_minor = sorted(tiles_head_major, key=lambda t: (t.q_block, t.head))
flops = 4 * 128 * 2048 * 2048 * 128  # forward FLOPs, all heads
for name, tiles in (("head-major", tiles_head_major), ("head-minor", tiles_head_minor)):
    hbm, ratio = sched.kv_traffic(tiles, n_sms=132, l2_bytes=50e6, kv_bytes=2 * 2048 * 128 * 2)
    print(f"{name}: K/V from HBM {hbm / 2**30:.2f} GiB ({ratio:.1f}x one read per head) = "
          f"{hbm / 3.35e12 * 1e3:.2f} ms at 3.35 TB/s, against {flops / 650e12 * 1e3:.2f} ms of matmuls at "
          f"650 TFLOP/s")

# %% [markdown]
# Head-minor order turns a compute-bound kernel memory-bound; the GPU's own launch order of a 2-D grid
# (query blocks fastest) had been head-major all along, which is why only the persistent loop showed it.
#
# The backward repeated the lesson. One fused Gluon kernel (FA2 Algorithm 2 with $dQ$ added by atomics, $10N^2d$
# FLOPs instead of the two Triton kernels' $14N^2d$) in a single partition was *slower* than plain Triton: each
# step waits for its own matmuls (it is gone from the code; its numbers are in `notes/experiments_removed.md`). The warp-specialised version
# (`flash_attention_backward_gluon_ws`) gives it the forward's structure: one CTA per 128-key block, a producer
# warp streaming $Q_i, dO_i$ (and $L_i, D_i$) by TMA, two consumer warpgroups of 64 keys each holding their own
# $dK, dV$ in registers, and $dQ_i$ written to shared memory and added into global memory by the copy engine
# (a TMA reduce-add), so no consumer ever waits on an atomic. `flash_attention_gluon` wraps both kernels as
# one autograd op. Ratios to cuDNN from the committed runs (notes/hopper.md, section 1e):

# %%
from reference.triton.configs import GLUON_BACKWARD

key = "gluon_ws_split_" + "_".join(str(int(x)) for x in GLUON_BACKWARD[128].as_tuple())  # the d = 128 default's column
for path, r in load_results("*-gluon-wsbwd.json"):
    print(f"== {path.name}: {r.get('gpu')}; float64 gradient checks passed: "
          f"{sum(c.get('ok', False) for c in r['check'])}/{len(r['check'])}")
    for row in r["bench"]["main"]:
        if row["d"] == 128 and key in row:
            base = row["cudnn"]["tflops"]
            heads = f"H={row['H']}/{row.get('H_kv', row['H'])}"
            print(f"  backward {'causal' if row['causal'] else 'non-causal':10s} N={row['N']:5d} {heads:8s}: cuDNN "
                  f"{base:4.0f} TFLOP/s;  triton {row['triton']['tflops'] / base:.2f}x  gluon ws "
                  f"{row[key]['tflops'] / base:.2f}x")
for path, r in load_results("*-gluon-train.json"):
    # the median over rotated rounds where the run has them (one do_bench median per implementation otherwise)
    tf = lambda x: x.get("tflops_rounds_median", x["tflops"])  # noqa: E731
    print(f"== {path.name}: {r.get('gpu')}: forward + backward through autograd")
    for row in r["bench"]:
        base = tf(row["cudnn"])
        heads = f"H={row['H']}/{row.get('H_kv', row['H'])}"
        print(f"  step {'causal' if row['causal'] else 'non-causal':10s} N={row['N']:5d} {heads:8s}: cuDNN {base:4.0f} "
              f"TFLOP/s;"
              f"  flash_attention (Triton) {tf(row['triton']) / base:.2f}x  flash_attention_gluon "
              f"{tf(row['gluon']) / base:.2f}x")

# %% [markdown]
# A short training step can be limited by the CPU, not the GPU. At causal N = 2k, d = 128 (B = 8, H = 16) the H200
# runs the step's kernels in 1.15 ms, and issuing them through Triton's launch path took 1.5-1.6 ms of Python a
# step: the argument binding and specialisation of four launches, and ten TMA descriptor objects. So the GPU sat
# idle for 40% of back-to-back steps, and the step measured 0.69x cuDNN in one run, with kernels at 0.94x
# (ncu). Another run of the same code read 0.95x: when host and GPU times are this close, whether the GPU waits
# depends on how fast the CPU happens to be that minute, so the number jumps between runs. The op now records
# its launches the first time it sees a shape, and repeats them on later calls with the new tensors'
# addresses (`reference/triton/_fastlaunch.py`). That brought the host time to 1.0-1.1 ms a step and the step to
# 0.95x cuDNN. Measure the host time before tuning a kernel: the probe below issues steps while a sleep kernel
# holds the GPU, so the wall clock counts only the CPU (`benchmarks/tuning/probe_train_step.py`; the first file below
# is the op before the change).

# %%
probes = load_results("*-train-step-probe-jit-launch.json") + load_results("*-train-step-probe.json")
for path, r in probes:
    print(f"== {path.name}: {r.get('gpu')}")
    for row in r["rows"]:
        g, c = row["gluon"], row["cudnn"]
        print(f"  d={row['d']} causal N={row['N']} H={row['H']}/{row['H_kv']}: host ms a step: gluon "
              f"{min(g['host_us']) / 1e3:.2f}, cuDNN {min(c['host_us']) / 1e3:.2f}; GPU busy / span per step "
              f"{g['kernels']['busy_us_per_step'] / 1e3:.2f} / {g['kernels']['span_us_per_step'] / 1e3:.2f} ms; "
              f"step {row['ratio']:.2f}x cuDNN")

# %% [markdown]
# With the host out of the way, what is left is the backward kernel itself, and section 3's scheduling lesson
# applies to it too. It launched one CTA per 128-key block: 2048 CTAs at that 2k shape, each paying its own
# prologue (K, V loaded, nothing to compute yet) and epilogue (dK, dV stored), and under the causal mask the
# blocks are unequal (key block $j$ sees $N/64 - 2j$ query steps), so the last wave is ragged. The persistent
# backward (`GluonBackwardConfig(persistent=True)`, the default for causal launches) runs one CTA per SM. Each CTA
# walks a list the host computes once per shape: the same blocks in the same order, dealt by list scheduling (each
# next block to the CTA that frees up first under a cost model of query steps,
# `flash_gluon_bwd_ws.persistent_schedule`). Two things change in the kernel. Its ring slots and barrier phases
# count the CTA's steps across blocks, not one block's. And a `kv_free` barrier lets the producer warp load the
# next block's K and V while the consumers are still storing dK and dV. dK and dV come out bit for bit the same.
# Timed alone on the bar's rows, the backward went from 0.88x to 0.99x cuDNN at d = 64, causal N = 2k, and the
# persistent schedule was ahead in 15 of the 16 causal rows. It was 1%-5% slower on long non-causal MHA rows,
# where every block is the same length: there a static list cannot route around an SM that runs slow, and the
# hardware's own dealing can. So non-causal launches keep one CTA per block. A list sorted longest-first over all
# heads (LPT) balanced best on paper and lost in practice, because it keeps Q, dO and dQ of every head in flight
# at once, far more than the L2 holds (`notes/hopper.md`, "A persistent backward").

# %%
for path, r in load_results("*-bwd-persistent-probe.json"):
    print(f"== {path.name}: {r.get('gpu')}: the backward alone, x cuDNN's backward (one CTA per block -> persistent)")
    for row in r["rows"]:
        heads = f"H={row['H']}/{row['H_kv']}"
        x = row["x_cudnn"]
        print(f"  d={row['d']:3d} {'causal' if row['causal'] else 'non-causal':10s} N={row['N']:5d} {heads:8s}: "
              f"{x['blocks']:.2f}x -> {x['persistent']:.2f}x  (dK, dV bitwise equal: {row['dkdv_bitwise_equal']})")

# %% [markdown]
# ### FP8 in the same ping-pong: the exponential's turn
#
# Section 1's cycle model said what FP8 does to this schedule: the matmuls take half the cycles, the
# exponentials do not shrink, so the two warpgroups' ping-pong has half as much matmul time to hide one
# warpgroup's softmax behind. `flash_attention_forward_fp8_gluon` (`reference/triton/hopper/flash_fp8_gluon.py`)
# is the production ping-pong with section 3's FP8 recipe (e4m3 with per-block scales, V stored transposed because
# FP8 WGMMA reads its B operand K-major, P scaled by 256 before rounding). **Predict, then read:** if the softmax
# of a 64 x 128 block costs as much in both kernels, how much faster than the bf16 kernel can FP8 be — twice as fast, as
# the tensor cores promise, or less? And which unit should Nsight Compute show busier than the tensor pipe?
# `python3 -m benchmarks.course.bench_fp8_gluon` timed both in one process (checked against float64 first):

# %%
for path, r in load_results("*-fp8-gluon.json"):
    pred = r["bench"]["predicted"]
    print(f"== {path.name}: {r.get('gpu')}; float64 checks passed: "
          f"{sum(c.get('ok', False) for c in r['check'])}/{len(r['check'])}")
    print(f"  cycle model, one 128 x 128 tile: bf16 MMA {pred['bf16']['mma_cycles']:.0f} vs exp "
          f"{pred['bf16']['exp_cycles']:.0f} cycles; fp8 MMA {pred['fp8']['mma_cycles']:.0f} vs exp "
          f"{pred['fp8']['exp_cycles']:.0f} (exp / MMA {pred['fp8']['exp_over_mma']:.1f})")
    for row in r["bench"]["main"]:
        print(f"  {'causal' if row['causal'] else 'non-causal':10s} N={row['N']:5d}: x the bf16 Gluon forward: "
              f"FP8 Gluon {row['fp8_gluon']['x_gluon_bf16']:.2f}x, FP8 Triton {row['fp8_triton']['x_gluon_bf16']:.2f}x, "
              f"FP8 Gluon with the torch quantisation {row['fp8_gluon_with_quant']['x_gluon_bf16']:.2f}x")
    ncu = r.get("ncu") or {}
    for k in ncu.get("kernels", []):
        if k["kernel"].startswith(("fwd_", "_attn_fwd_fp8", "cudnn")):
            print(f"  ncu N={ncu['N']} {k['kernel'][:40]:40s}: tensor pipe "
                  f"{k['sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active']:4.1f}%  "
                  f"exp unit (XU) {k['sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active']:4.1f}%  "
                  f"warpgroup-barrier stalls per issue "
                  f"{k['smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio']:.2f}")

# %% [markdown]
# The FP8 kernel's tensor pipe sits far below the bf16 kernel's while the exponential unit is busier: the
# softmax, not the matmul, now sets the pace, and the other warpgroup's (now shorter) matmuls no longer hide it.
# (Barrier stalls alone do not tell the two kernels apart: the bf16 kernel has as many.) The gap to twice the speed is the lesson of section 1 in a real kernel.
# FlashAttention-3 closes more of it by overlapping a warpgroup's softmax with *its own* P·V matmul (the
# intra-warpgroup pipelining of its Algorithm 2). §10c showed why our compiled code first lost that overlap (ptxas
# hoisted the wait for that matmul above the exponentials) and how the bf16 kernel at d = 128 gets it back; the FP8
# kernel's `peeled` and `fence` schedules keep the wait down too (its SASS shows all the exponentials before the
# wait), but timed within the noise of its default once the rounds ran in both orders, so they stay off
# (`notes/hopper.md`, "The peeled key loop" and "FP8 end to end"). Two more levers aimed at the softmax's
# latency: every consumer thread releasing a ring slot itself (`schedule={"thread_arrive": True}`), which takes two
# of the three warpgroup barriers per key block out of the loop, moved it by a few percent, within the noise of the
# rounds; and issuing the next score tile before the softmax (`prefetch`, FlashAttention-3's overlap) needs more
# registers than a 64-row consumer has, so ptxas spills and it runs several times slower (`notes/hopper.md`, "FP8
# softmax latency"). What is left is a larger restructuring: longer key blocks or a third consumer
# warpgroup, both of which need the probabilities carried as packed e4m3 to fit the registers.
#
# ### FP8 end to end: the quantisation is a memory-bound kernel of its own
#
# The timings above start from e4m3 tensors. A model hands the kernel bf16 Q, K and V, so something must compute
# each block's scale and round: `quantize_qkv_fp8` (`reference/triton/hopper/fp8_quant.py`) does it in one launch
# that reads each bf16 element once (2 bytes) and writes it as e4m3 (1 byte) plus one scale per block, V already
# transposed for the FP8 WGMMA. It does almost no arithmetic, so its speed is set by memory. **Predict, then
# read:** with B · N = 16k tokens, H = 16 and d = 128 at every N (the benchmark's convention), how long should it
# take at the copy bandwidth, and how does that compare with the attention itself at N = 2k and at N = 16k?
# `python3 -m benchmarks.course.bench_fp8_gluon --stages quant` timed it beside the attention (checked first:
# without the Hadamard option its bytes and scales equal the torch recipe's bit for bit):

# %%
for path, r in load_results("*-fp8-quant.json"):
    q = r["quant"]
    bw = q["copy_bw_bytes_per_s"]
    print(f"== {path.name}: {r.get('gpu')}; checks passed: {q['checks_ok']}; copy bandwidth {bw / 1e12:.2f} TB/s")
    first = q["main"][0]
    print(f"  bytes moved by the quantisation: {first['bytes'] / 1e6:.0f} MB -> {first['bytes'] / bw * 1e6:.0f} us "
          f"at the copy bandwidth (the model)")
    for row in q["main"]:
        quant = row.get("quant_fused")  # timed once per N (on the non-causal row): the same inputs
        quant = f"{quant['ms'] * 1e3:4.0f} us ({quant['x_copy_bw']:.2f} of copy)" if quant else "(as above)        "
        print(f"  {'causal' if row['causal'] else 'non-causal':10s} N={row['N']:5d}: bf16 attention "
              f"{row['gluon_bf16']['ms'] * 1e3:5.0f} us | quantisation {quant} | x bf16: FP8 kernel "
              f"{row['fp8_gluon_kernel']['x_gluon_bf16']:.2f}x, end to end {row['fp8_gluon_e2e']['x_gluon_bf16']:.2f}x"
              f" (torch quantisation {row['fp8_gluon_e2e_torch_quant']['x_gluon_bf16']:.2f}x)")

# %% [markdown]
# The quantisation moves the same bytes at every N here (the token count is fixed), while the attention's work
# grows with N: at short sequences the quantisation, with the entry point's check and launch work around it, eats
# what the FP8 matmuls saved, and FP8 pays off end to end only where the attention is long. Fusing it into one
# pass made it an order of magnitude cheaper than the torch recipe, which is what moved FP8 from losing everywhere
# to winning at the longest non-causal length.
#
# One more cost sits between the two launches: the host. The quantisation also flags NaN and inf inputs, and
# the entry point must read that flag on the host to raise an error; a host read waits for the GPU. Read before
# the attention's launch, it leaves the GPU idle while the host launches the attention; read after it (the
# default), the GPU stays busy, but the next call's host work still waits for the read. The results file times
# the same two launches with the flag never read (`fp8_gluon_e2e_flag_unread`), and that column is the fastest
# at every N: at short N the sync, not the GPU work, is the rest of the gap (`notes/hopper.md`, "FP8 end to
# end"). A caller that validated its inputs passes `check_finite=False` and skips the read. In serving the
# balance is different again: K and V are quantised once, when they are written into the cache, and read by every
# later decoding step.
