# %% [markdown]
# # Lecture 9 — The serving path: packing, chunked prefill, prefix sharing, eager calls
#
# Lectures 7 and 8 made one decode step fast and the KV cache compact. A serving engine (vLLM, SGLang,
# FlashInfer-based engines) needs four more things, and this lecture builds each one and measures it:
#
# 1. **Packing** many prompts of different lengths into one batch without padding (*varlen* attention);
# 2. **chunked prefill** — prefilling a prompt in pieces that attend to keys already sitting in cache pages
#    (also what *prefix caching* needs);
# 3. **prefix sharing** — many requests with one long system prompt read its keys once (*cascade* attention,
#    built on `merge_states` from lecture 7);
# 4. **eager calls** that cost no more than the GPU work they launch.
#
# It ends with a mini engine that puts them together and compares it with lecture 8's static allocation.
#
# Code: `reference.numpy.varlen`, `reference.numpy.serving` (readable), `reference.triton.varlen` and
# `reference.triton.serving` (fast), `reference.serving_engine` (the mini engine). GPU numbers come from
# `benchmarks/course/bench_serving.py` (committed JSON under `benchmarks/results/`).
#
# **Reading path:** lecture 8 and assignment `a5_paged` → this lecture.

# %%
import numpy as np

from lectures._exercise import check_guess
from lectures._plots import load_results, not_run, setup
from reference.serving_engine import MiniEngine, ToyModel, reference_generate
from reference.numpy.attention import attention
from reference.numpy.merge import merge_states
from reference.numpy.paged import PagedKVCache
from reference.numpy.serving import cascade_decode, paged_prefill
from reference.numpy.varlen import varlen_attention

plt = setup()
rng = np.random.default_rng(9)
serving = load_results("*-serving.json")


def measured(section):
    """``[(run, that section)]`` for every committed serving benchmark run that has the section."""
    if not serving:
        not_run(section, "*-serving.json")
    return [(res, res[section]) for _, res in serving if section in res]

# %% [markdown]
# ## 1. Packing: varlen attention
#
# Prompts arrive with different lengths. Padding them to the longest wastes memory and — worse — compute:
# every tile that holds only padding is still loaded and multiplied. FlashAttention's *varlen* API instead
# concatenates the sequences along the token axis and passes their boundaries as **cumulative lengths**:
#
# ```
# q (total_q, Hq, d),  k, v (total_k, Hkv, d)
# cu_seqlens = [0, n_0, n_0 + n_1, ..., total]        # B + 1 integers
# ```
#
# Sequence `b` owns rows `cu_seqlens[b] .. cu_seqlens[b+1]-1`; its queries never see another sequence's keys.

# %%
lens = [5, 1, 9]
cu = np.concatenate([[0], np.cumsum(lens)])
q = rng.standard_normal((cu[-1], 4, 8))
k = rng.standard_normal((cu[-1], 2, 8))          # GQA: 4 query heads, 2 kv heads
v = rng.standard_normal((cu[-1], 2, 8))
o, lse = varlen_attention(q, k, v, cu, cu, causal=True)
print("cu_seqlens =", cu, "| o", o.shape, "| lse", lse.shape, "(heads first, as FlashAttention returns it)")
for b in range(len(lens)):
    s = slice(cu[b], cu[b + 1])
    alone = attention(q[s].swapaxes(0, 1), k[s].swapaxes(0, 1), v[s].swapaxes(0, 1), causal=True).swapaxes(0, 1)
    print(f"sequence {b}: max |packed - alone| = {np.abs(o[s] - alone).max():.1e}")

# %% [markdown]
# The mask a packed batch implies is block-diagonal, each block causal. A kernel must not even *visit* the
# off-diagonal blocks — that is the whole gain:

# %%
allowed = np.zeros((cu[-1], cu[-1]), bool)
for b in range(len(lens)):
    s = slice(cu[b], cu[b + 1])
    allowed[s, s] = np.tril(np.ones((lens[b], lens[b]), bool))
fig, ax = plt.subplots(1, 2, figsize=(7, 3))
ax[0].imshow(allowed, cmap="Greens")
ax[0].set_title("packed: block-diagonal causal", fontsize=9)
pad = np.zeros((len(lens) * max(lens),) * 2, bool)
for b, n in enumerate(lens):
    o0 = b * max(lens)
    pad[o0:o0 + max(lens), o0:o0 + max(lens)] = True   # what a padded batch computes (then masks)
ax[1].imshow(pad, cmap="Reds")
ax[1].set_title("padded to the longest: computed tiles", fontsize=9)
for a in ax:
    a.set_xlabel("key"), a.set_ylabel("query")
plt.tight_layout()

# %% [markdown]
# **Predict, then run.** The benchmark packs 32 prompts whose lengths follow a log-normal mix (median 600
# tokens, clipped to 16..4096 — long-tailed like real chat prompts). What fraction of a batch padded to the
# longest prompt holds real tokens?

# %%
mix = np.clip(np.round(np.random.default_rng(0).lognormal(np.log(600), 0.9, 32)), 16, 4096)
guess = None  # a fraction between 0 and 1
check_guess(guess, mix.sum() / (len(mix) * mix.max()), rel=0.15, what="real tokens / padded tokens")
print(f"causal work (sum n^2) vs padded causal work (B * max^2): {np.sum(mix ** 2) / (len(mix) * mix.max() ** 2):.1%}")

# %% [markdown]
# The *work* ratio is smaller still, because attention cost grows with the square of the length and one long
# prompt sets the padded size for all. On the GPU (`flash_attention_varlen`, the course's FA2 kernels with a
# `VARLEN` switch: each program reads its sequence's bounds from `cu_seqlens` and skips query blocks past its
# end):

# %%
for res, vl in measured("varlen"):
    ms = dict(vl["ms"], **res.get("flex", {}).get("ms", {}))
    print(f"{res['meta']['gpu']}: {len(vl['lengths'])} prompts, {vl['total_tokens']} tokens, "
          f"longest {vl['max_len']}, {vl['useful_fraction']:.0%} of padded tokens real")
    for name in ("ours_varlen", "ours_padded", "sdpa_padded", "sdpa_nested", "flex_block_mask"):
        if name in ms:
            print(f"  {name:16s} {ms[name] * 1e3:8.0f} us   ({ms[name] / ms['ours_varlen']:.2f}x ours packed)")
    print(f"  forward + backward: packed {vl['ms']['ours_varlen_fwd_bwd'] * 1e3:.0f} us vs padded "
          f"{vl['ms']['ours_padded_fwd_bwd'] * 1e3:.0f} us ({vl['speedup_vs_padded_fwd_bwd']:.1f}x)")

# %% [markdown]
# Packing beats the same kernel on the padded batch by about the work ratio, beats SDPA on padded or nested
# (jagged) tensors, and FlexAttention with a document + causal block mask — which also skips the empty
# blocks, but through a general mask machinery.
#
# ## 2. Chunked prefill over a paged cache
#
# A long prompt is prefilled in **chunks** (so one request cannot stall everybody's decode steps for seconds),
# and a prompt whose beginning is cached already (**prefix caching**) computes only its new tokens. Either way
# a chunk's queries must see *all earlier tokens* — which sit in `PagedKVCache` blocks — and, causally, each
# other. Append the chunk's K/V first, then attend through the block table with **bottom-right** alignment:
# chunk row `i` of `n_q` sees key `j` of `seq_len` iff `j <= i + seq_len - n_q` (the convention of lecture 0).

# %%
hq, hkv, d, bs = 4, 2, 8, 4
n = 23
qa, ka, va = rng.standard_normal((n, hq, d)), rng.standard_normal((n, hkv, d)), rng.standard_normal((n, hkv, d))
cache = PagedKVCache(16, bs, hkv, d, dtype=np.float64)
cache.add_sequence("s")
outs = []
for lo, hi in ((0, 10), (10, 17), (17, 23)):   # three chunks
    cache.append("s", ka[lo:hi], va[lo:hi])
    tables, seq_lens = cache.block_tables(["s"])
    o_chunk, _ = paged_prefill(qa[lo:hi], cache.k_cache, cache.v_cache, tables, [0, hi - lo], seq_lens)
    outs.append(o_chunk)
    print(f"chunk {lo:2d}..{hi - 1:2d}: attends {seq_lens[0]:2d} cached keys through blocks {tables[0].tolist()}")
one_shot = attention(qa.swapaxes(0, 1), ka.swapaxes(0, 1), va.swapaxes(0, 1), causal=True).swapaxes(0, 1)
print(f"max |chunked - one-shot causal prefill| = {np.abs(np.concatenate(outs) - one_shot).max():.1e}")

# %% [markdown]
# The Triton version (`reference.triton.paged_prefill`) is the varlen kernel with one more switch, `PAGE`:
# each key tile's rows are found through the block table slot by slot. What reading through 16-token pages
# costs, measured:

# %%
for res, p in measured("prefill"):
    if p:
        print(f"{res['meta']['gpu']}: {p['batch']} sequences, chunk {p['chunk']} after {p['cached']} cached tokens, "
              f"{p['block_size']}-token blocks: paged {p['ms_paged'] * 1e3:.0f} us vs contiguous "
              f"{p['ms_contiguous'] * 1e3:.0f} us ({p['paged_vs_contiguous']:.2f}x)")

# %% [markdown]
# Paging is not free here: a key tile of 64 rows spans four 16-token pages, so the kernel gathers rows one by
# one instead of streaming a contiguous tile (decode, which is bandwidth-bound anyway, hides this better —
# lecture 8 measured 0.88–0.96x). Larger pages or a per-page (instead of per-row) address computation would
# recover most of it.
#
# ## 3. Prefix sharing: cascade attention
#
# Many requests start with the same system prompt. Paging already lets them *store* it once (lecture 8's
# `fork`); **cascade attention** also *reads* it once. Attention over a union of disjoint key sets is the merge
# of the attention states over each set (lecture 7, "recursive attention"):
#
# $$\mathrm{attn}(q, P \cup S_b) = \mathrm{merge}\big(\mathrm{attn}(q, P),\ \mathrm{attn}(q, S_b)\big)$$
#
# For the prefix `P`, stack the queries of **all** requests: the `G` query heads of every request that read kv
# head `h` become `B * G` rows of one attention over `P` — one pass over the prefix's K/V for the whole batch.
# Each suffix `S_b` is attended separately, and `merge_states` combines the two.

# %%
B, P = 5, 32
pk, pv = rng.standard_normal((P, hkv, d)), rng.standard_normal((P, hkv, d))
cache = PagedKVCache(64, bs, hkv, d, dtype=np.float64)
suffix = {}
for b in range(B):
    cache.add_sequence(b)
    sl = int(rng.integers(1, 12))
    suffix[b] = (rng.standard_normal((sl, hkv, d)), rng.standard_normal((sl, hkv, d)))
    cache.append(b, *suffix[b])
tables, seq_lens = cache.block_tables(range(B))
qd = rng.standard_normal((B, hq, d))
o_casc, lse_casc = cascade_decode(qd, pk, pv, cache.k_cache, cache.v_cache, tables, seq_lens)
worst = 0.0
for b in range(B):
    kk = np.concatenate([pk, suffix[b][0]]).swapaxes(0, 1)
    vv = np.concatenate([pv, suffix[b][1]]).swapaxes(0, 1)
    worst = max(worst, np.abs(attention(qd[b][:, None], kk, vv)[:, 0] - o_casc[b]).max())
print(f"cascade vs attention over [prefix; suffix], {B} requests: max difference {worst:.1e}")
o1, l1 = attention(qd[0][:, None], pk.swapaxes(0, 1), pv.swapaxes(0, 1), return_lse=True)
o2, l2 = attention(qd[0][:, None], suffix[0][0].swapaxes(0, 1), suffix[0][1].swapaxes(0, 1), return_lse=True)
print("merge_states of the two parts for request 0 matches too:",
      np.allclose(merge_states(o1, l1, o2, l2)[0][:, 0], o_casc[0]))

# %% [markdown]
# **Predict, then run.** 64 requests share a 32k-token prefix and each has 1k tokens of its own. Plain paged
# decode reads every request's full sequence; cascade reads the prefix once plus the 64 suffixes. What is the
# ratio of bytes read?

# %%
guess = None
Bq, Pq, Sq = 64, 32768, 1024
check_guess(guess, Bq * (Pq + Sq) / (Pq + Bq * Sq), rel=0.1, what="bytes read: paged / cascade")

# %% [markdown]
# On the GPU (`reference.triton.cascade_decode`: the prefix pass is the dense FA2 kernel with the prefix's keys
# split into chunks along the batch axis so that ~2 programs per SM run; the suffix pass is the paged varlen
# kernel with each request's `G` heads as `G` rows; one small kernel merges the states):

# %%
for res, rows in measured("cascade"):
    fig, ax = plt.subplots(figsize=(6, 3))
    bsz = [r["batch"] for r in rows]
    ax.plot(bsz, [r["speedup_graph"] for r in rows], "o-", label="measured (GPU time, CUDA graph)")
    ax.plot(bsz, [r["bytes_ratio"] for r in rows], "k--", label="bytes-read ratio")
    ax.set_xscale("log", base=2), ax.set_xlabel("requests sharing a 32k prefix (1k suffix each)")
    ax.set_ylabel("speedup over paged decode"), ax.legend(fontsize=8)
    ax.set_title(res["meta"]["gpu"], fontsize=9)
    plt.tight_layout()
    for r in rows:
        print(f"B={r['batch']:2d}: cascade {r['ms_graph_cascade'] * 1e3:6.0f} us, paged {r['ms_graph_paged'] * 1e3:6.0f} us"
              f" -> {r['speedup_graph']:.2f}x (bytes ratio {r['bytes_ratio']:.1f})")

# %% [markdown]
# The speedup grows with the batch but stays well below the bytes ratio, for two measured reasons:
#
# * the baseline is better than its byte count: the 64 requests read the *same* prefix pages at about the same
#   time, so many of those reads hit the 50 MB L2 cache instead of HBM;
# * the prefix pass is no longer memory-bound at large batch: `B * G = 256` query rows against 32k keys is
#   a small prefill (34 GFLOP at B = 64), the same reason prefill is compute-bound (lecture 7).
#
# Eager calls of the cascade (three launches and some tensor reshaping) are host-bound at small batch; the JSON
# keeps those numbers too. An engine captures its decode step in a CUDA graph, which is what the plot shows.
#
# ## 4. Eager calls: host time vs GPU time
#
# At batch 1 and 32k keys a decode step is ~55 µs of GPU work. Called from Python, a Triton kernel first runs
# its launch path — binding ~40 arguments, computing their specialization (dtype, 16-byte alignment, integers
# equal to 1 or divisible by 16), looking up the compiled kernel — plus our own input checks: that used to take
# longer than the kernel. `flash_decode` and `paged_decode` now **record** a launch per key (shapes, strides,
# dtypes, devices, alignment, options, module configuration, CUDA stream: everything that decides the
# specialization and the checks) and repeat it on the next call with new tensors
# (`reference.triton._fastlaunch`). Value checks that need a device sync still run when `validate=True`.

# %%
for res, e in measured("eager"):
    print(f"{res['meta']['gpu']}: B={e['batch']}, {e['context']} keys (us per call)")
    print(f"  {'':44s} {'eager loop':>10s} {'CUDA graph':>10s} {'loop/graph':>10s}")
    for name, c in e["cases"].items():
        print(f"  {name:44s} {c['ms_loop'] * 1e3:10.1f} {c['ms_graph'] * 1e3:10.1f} {c['loop_over_graph']:10.2f}")
    print("  host us/call on a tiny problem:", ", ".join(f"{k} {v:.0f}" for k, v in e["host_us_tiny"].items()))

# %% [markdown]
# With the recorded launch, an eager decode call costs its GPU time (loop/graph ≈ 1, the bar was 1.2). It is as
# fast as SDPA's default backend (cuDNN) called eagerly, within the few percent by which the kernels
# themselves differ. Validation with a sync is the expensive part: a serving loop validates its inputs once,
# where they are built, and passes `validate=False` in the hot path.
#
# ## 5. A mini engine
#
# `reference.serving_engine.MiniEngine` strings it together (NumPy, a one-layer toy model so that it runs here):
# requests of random lengths wait in a queue; each step **admits** requests while the pool has room, **decodes**
# one token for every request past its prompt and spends a **token budget** on **prefill chunks**; finished
# requests free their blocks. When memory runs out, the youngest request is preempted and recomputed later. The
# same request stream is served three ways:
#
# * `static` — each admitted request reserves its maximum length up front (lecture 8's static allocation);
# * `paged` — blocks on demand;
# * `paged + shared prefix` — every prompt starts with the same 64-token system prompt, prefilled once and
#   `fork`ed (shared blocks), decoded with cascade attention.

# %%
model = ToyModel(vocab=97, n_heads=4, n_kv_heads=2, head_dim=16, seed=0)
gen = np.random.default_rng(1)
system = [int(t) for t in gen.integers(0, 97, 64)]
stream = [(i, [int(t) for t in gen.integers(0, 97, int(gen.integers(8, 160)))], int(gen.integers(4, 64)))
          for i in range(48)]
runs = {}
for label, policy, prefix in (("static", "static", None), ("paged", "paged", None),
                              ("paged + shared prefix", "paged", system)):
    eng = MiniEngine(model, pool_tokens=2048, block_size=16, chunk=64, max_running=32, policy=policy,
                     shared_prefix=prefix)
    for rid, prompt, n_new in stream:
        eng.add(rid, (prefix or []) + prompt, n_new)
    stats = eng.run()
    runs[label] = (eng, stats)
    print(f"{label:22s}: {stats['steps']:4d} steps, {stats['tokens_per_step']:5.2f} tokens/step, "
          f"{stats['tokens_per_s']:6.0f} tokens/s (NumPy), mean {stats['mean_running']:5.1f} running, "
          f"KV slots held {stats['mean_kv_slots_held']:6.0f}, tokens per slot {stats['kv_utilisation']:.2f}, "
          f"{stats['preempted']} preemptions")
eng = runs["paged + shared prefix"][0]
same = all(r.output == reference_generate(model, r.prompt, r.max_new) for r in eng.done[:6])
print("engine tokens == plain full-sequence decoding (first 6 requests):", same)

# %%
fig, ax = plt.subplots(1, 2, figsize=(10, 3.2))
for label, (eng, _) in runs.items():
    h = eng.history
    ax[0].plot([x["kv_slots_held"] for x in h], label=label)
    ax[1].plot(np.cumsum([x["decoded"] + 0 for x in h]), label=label)
ax[0].axhline(2048, color="k", lw=0.8, ls=":")
ax[0].set_xlabel("engine step"), ax[0].set_ylabel("KV slots held (pool 2048)")
ax[1].set_xlabel("engine step"), ax[1].set_ylabel("tokens decoded so far")
ax[0].legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# The static policy fills its pool with *reservations*: fewer requests run at once, so it needs more steps for
# the same stream. Paging holds only what is written (tokens per slot near 1) and runs more requests per step.
# The shared-prefix run serves prompts that are each 64 tokens *longer* from the same pool and keeps the same
# concurrency and throughput, because the system prompt is stored once: the logical tokens per physical slot
# exceed 1. Tokens per step is the model-independent throughput; on a GPU a step's time is nearly
# flat in the batch size while decode is memory-bound (lecture 7), so tokens per step is what turns into tokens
# per second there. (The NumPy tokens/s above mostly measure Python.)
#
# ## Exercises
#
# 1. In the mini engine, halve `pool_tokens`. Predict which policy loses more throughput, then run it.
# 2. Why must the chunk's own K/V be appended to the cache *before* its queries attend? What would break for
#    the first chunk row if it were appended after?
# 3. Cascade at B = 1 reads exactly the bytes of paged decode. Why can it still be slower? (Count the launches
#    and the partial states written and read by the merge.)
# 4. In the varlen kernel a query block past its sequence's end returns immediately. With 32 sequences whose
#    longest has 4096 tokens and `BLOCK_M = 128`, how many programs does the grid launch, and how many do work?
