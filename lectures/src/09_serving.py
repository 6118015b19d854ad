# %% [markdown]
# # Lecture 9 — The serving path: packing, chunked prefill, prefix sharing, eager calls
#
# **Learning objectives.** After this lecture you can:
#
# 1. Pack variable-length sequences with `cu_seqlens` and compute how much padding it saves.
# 2. Explain chunked prefill over a paged cache and the chunk-size trade-off.
# 3. Share a prompt prefix with cascade attention and merge the prefix and suffix parts.
# 4. Separate a small kernel's host (launch) time from its GPU time and say what removes the former.
#
# Lectures 7 and 8 made one decode step fast and the KV cache compact. A serving engine (vLLM, SGLang,
# FlashInfer-based engines) needs four more things, and this lecture builds each one and measures it:
#
# 1. **Packing** many prompts of different lengths into one batch without padding (*varlen* attention);
# 2. **chunked prefill** — prefilling a prompt in pieces that attend to keys already sitting in cache pages
#    (also what *prefix caching* needs);
# 3. **prefix sharing** — many requests with one long system prompt read its keys once (*cascade* attention,
#    built on `merge_states` from lecture 7);
# 4. **eager calls** that cost no more than the GPU work they launch;
# 5. **mixed batches** — prefill chunks and decode rows in one launch, and the chunk size that trades time to
#    first token against time per output token.
#
# It ends with a mini engine that puts them together, compares it with lecture 8's static allocation, and
# sweeps its chunk size.
#
# Code: `reference.numpy.varlen`, `reference.numpy.serving`, `reference.numpy.mixed` (readable),
# `reference.triton.varlen`, `reference.triton.serving`, `reference.triton.cascade` and `reference.triton.mixed`
# (fast), `reference.serving_engine` (the mini engine). GPU numbers come from
# `python3 -m benchmarks.course.bench_serving` and `python3 -m benchmarks.course.bench_mixed_batch` (committed JSON
# under `benchmarks/results/`; `notes/serving_perf.md` has the predictions, sweeps and ncu profiles behind them).
#
# **Reading path:** lecture 8 and assignment `a5_paged` → this lecture.

# %%
import numpy as np

from lectures._exercise import check_guess
from lectures._plots import load_results, not_run, setup
from reference.serving_engine import MiniEngine, ToyModel, reference_generate
from reference.numpy.attention import attention
from reference.numpy.merge import merge_states
from reference.numpy.mixed import ITEM_COLUMNS, mixed_attention, mixed_attention_by_plan, mixed_plan
from reference.numpy.paged import PagedKVCache
from reference.numpy.serving import cascade_decode, paged_prefill
from reference.numpy.varlen import varlen_attention

plt = setup()
rng = np.random.default_rng(9)
serving = load_results("*-serving.json")
mixed_runs = load_results("*-mixed-batch.json")
paged_prefill_runs = load_results("*-paged-prefill.json")  # bench_mixed_batch --sections prefill
cascade_runs = load_results("*-cascade.json")              # bench_mixed_batch --sections cascade


def measured(section, runs=serving, pattern="*-serving.json"):
    """``[(run, that section)]`` for every committed benchmark run (``bench_serving`` by default) with the section."""
    if not runs:
        not_run(section, pattern)
    return [(res, res[section]) for _, res in runs if section in res]


def measured_mixed(section):
    """The same for ``bench_mixed_batch`` (mixed step, paged prefill page sizes, one-launch cascade)."""
    return measured(section, mixed_runs, "*-mixed-batch.json")

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
    ms = vl["ms"]                     # one run: every ratio below is against this run's own packed time
    print(f"{res['meta']['gpu']}: {len(vl['lengths'])} prompts, {vl['total_tokens']} tokens, "
          f"longest {vl['max_len']}, {vl['useful_fraction']:.0%} of padded tokens real")
    for name in ("ours_varlen", "ours_padded", "sdpa_padded", "sdpa_nested"):
        if name in ms:
            print(f"  {name:16s} {ms[name] * 1e3:8.0f} us   ({ms[name] / ms['ours_varlen']:.2f}x ours packed)")
    print(f"  forward + backward: packed {ms['ours_varlen_fwd_bwd'] * 1e3:.0f} us vs padded "
          f"{ms['ours_padded_fwd_bwd'] * 1e3:.0f} us ({vl['speedup_vs_padded_fwd_bwd']:.2f}x)")
    fx = res.get("flex", {}).get("ms", {})
    if "flex_block_mask" in fx:      # a separate run (torch.compile'd FlexAttention): compared with its own packed time
        print(f"  flex run: flex_block_mask {fx['flex_block_mask'] * 1e3:.0f} us vs ours packed "
              f"{fx['ours_varlen'] * 1e3:.0f} us in the same run ({fx['flex_block_mask'] / fx['ours_varlen']:.2f}x)")

# %% [markdown]
# Packing beats SDPA on padded or nested (jagged) tensors and FlexAttention with a document + causal block
# mask — which also skips the empty blocks, but through a general mask machinery. Against the same kernel on
# the padded batch it wins 3.61x. Which ratio predicts that? Not the work ratio: the causal work of the packed
# batch is 16.4% of the padded batch's, which predicts 6.1x. The measured gain sits near the **token** ratio
# (3.06x), but that is a coincidence of this mix, not a law. Counting what the kernel does per second explains it:

# %%
for res, vl in measured("varlen"):
    L, ms, cfg = np.array(vl["lengths"]), vl["ms"], res["meta"]["fwd_config"]
    work = np.sum(L.astype(float) ** 2) / (len(L) * L.max() ** 2.0)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    tiles = lambda n: sum(-(-min(n, (i + 1) * bm) // bn) for i in range(-(-n // bm)))  # noqa: E731 (causal tiles)
    tile_ratio = len(L) * tiles(L.max()) / sum(tiles(int(n)) for n in L)
    gain = ms["ours_padded"] / ms["ours_varlen"]
    rate_packed = vl["useful_flops"] / ms["ours_varlen"] / 1e9
    rate_padded = vl["useful_flops"] / work / ms["ours_padded"] / 1e9      # the padded kernel's causal work
    print(f"token ratio (padded / real)           {1 / vl['useful_fraction']:.2f}x")
    print(f"causal work ratio (B max^2 / sum n^2)  {1 / work:.2f}x   (packed work = {work:.1%} of padded)")
    print(f"causal {bm}x{bn} tiles visited ratio    {tile_ratio:.2f}x")
    print(f"measured speed-up                      {gain:.2f}x")
    print(f"work per second: packed {rate_packed:.0f} TFLOP/s, padded {rate_padded:.0f} TFLOP/s "
          f"-> {1 / work:.2f} x {rate_packed / rate_padded:.2f} = {gain:.2f}x")

# %% [markdown]
# The padded kernel does 6.1 times the work but does it at 349 TFLOP/s; the packed one runs at 206 TFLOP/s. Two
# things cost the packed batch throughput. Tiles: a 192-token prompt is two query blocks of 128 whose key tiles
# are mostly on the causal diagonal (computed whole, half masked) or ragged, so counted in 128 x 64 tiles the
# work ratio is 5.76x, not 6.1x. Shape: the padded batch is 32 equal, long programs per head; the packed one is
# many short programs (per-program set-up, the `cu_seqlens` look-up and the output write are amortised over few
# key tiles) and one long sequence whose query blocks finish last. The second part is our reading of the
# numbers, not a separate measurement.
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
# lecture 8 measured 0.89–0.95x for paged decode with 16-token blocks, on an H200).
#
# Where did the row gather lose its time? Not in the bytes (the same rows are read) and not mainly in the
# address arithmetic: compiled for the H100 (`triton.compile` for sm_90a runs on a CPU), the contiguous kernel
# keeps **three** K and V buffers in flight (115 KB of shared memory for 64 x 64 tiles), the paged one only **two**
# (83 KB). Each K/V address depends on a block-table load *of the same loop iteration*, and Triton's software
# pipeliner gives that load a pipeline stage of its own, taken from K and V. Two changes give the contiguous
# kernel's pipeline back:
#
# * **Look the table up one key block ahead.** The entries of block `j + 1` are loaded while block `j` is
#   computed and carried through the loop; the K/V loads of an iteration then depend on no load of that
#   iteration, and the pipeliner keeps three buffers again.
# * **Load whole pages.** A 64-key block of 16-token pages is 4 whole pages: one table entry per page, the block
#   loaded as a `(4, 16, d)` tile and *reshaped after the load*. Triton copies each page's rows into a slice of
#   one shared-memory buffer and hands the reshaped buffer to the tensor cores. (Reshaping the row *offsets*
#   instead, as the mixed kernel first did, loses the asynchronous copy.)
#
# `bench_mixed_batch` times the same prefill (8 chunks of 512 tokens after 4k cached) with 16- and 64-token
# pages and several ways of reading a key tile, each against the contiguous varlen forward *of the same run*:
# `paged_prefill_row_gather` is the row gather above (the function of that name in `experiments/serving_baselines.py`),
# `paged_prefill_page_tiles` has both changes (`reference.triton.paged_tiles`, the default off Hopper), and
# `mixed_*` is the mixed launch of §5 on a prefill-only batch: 64-key tiles with both changes (`block64`), the
# same with the table looked up in place, one entry per key row (`block64_first_version` in the results file),
# one tile per page (`block_per_page`) and TMA boxes (`tma`, Hopper, 64-token pages). **Predict** before
# running: which page size should the two changes help more?

# %%
for res, p in measured_mixed("prefill"):
    print(f"{res['meta']['gpu']}: {p['batch']} chunks of {p['chunk']} after {p['cached']} cached tokens "
          f"(speed / contiguous varlen of the same run)")
    for page, r in p["pages"].items():
        print(f"  {page:>2s}-token pages: contiguous {r['ms']['contiguous_varlen'] * 1e3:4.0f} us | " + ", ".join(
            f"{name} {r['vs_contiguous'][name]:.2f}x" for name in r["vs_contiguous"] if name != "contiguous_varlen"))

# %% [markdown]
# Measured on the H100, both page sizes: 64-token pages **0.96x** of contiguous (the course's bar, 0.9x,
# met), 16-token pages **0.87x** (missed; with the same tile pinned on both sides 0.86x-0.90x, and the best tile
# of a separate sweep at 0.94x of the autotuned contiguous time, `h100-paged-prefill-sweep.json`: the run-to-run
# noise is about as large as what is left). The mixed kernel gains as much from the same two changes (16-token pages
# 0.58x → 0.81x). What remains on 16-token pages, by Nsight Compute (`h100-prefill-ncu.csv`, 64 x 64 tiles): the
# page-tile kernel executes the contiguous kernel's instruction count (233 million each; the row gather 287)
# with the same shared memory, but at 5.28 cycles per issued instruction instead of 4.51: the table entries
# of a block are still loaded and used in the iteration that issues its copy (the pipeliner moves the
# look-ahead load there), a dependent load on the issue path. Looking two blocks ahead makes Triton give up
# pipelining the loop altogether; a Hopper kernel with a producer warp issuing one TMA box per page takes the
# table off the consumers' path. That kernel is next.
#
# ### Paged prefill on Hopper: a producer warp that reads the block table
#
# Lecture 6's warp-specialised forward already separates *who loads* from *who computes*: one producer warp
# issues TMA copies into a ring of shared-memory stages, two consumer warpgroups compute. A paged cache changes
# only the producer's job. For a 128-key tile of 16-token pages it reads the tile's 8 table entries (one vector
# load, issued *before* it waits for a free stage, so the wait hides it) and issues **one TMA box per page**:
# eight `(16, d)` copies into row slices of the same stage, all counted on one mbarrier that expects the whole
# tile's bytes. The pool `(num_blocks, page, Hkv, d)` is one 2-D descriptor `(num_blocks · page, Hkv · d)` and a
# box starts at row `block · page`, column `h · d`. The consumers run lecture 6's `attend_overlapped` unchanged:
# they never see a page. (`reference/triton/hopper/paged_prefill_gluon.py`; `paged_prefill` uses it on Hopper,
# `gather="tma"`, and the Triton page tiles everywhere else.)
#
# **Predict** before reading the run: the bytes are the same as contiguous, the producer issues 32 copies per
# key block instead of 4. How close to the *contiguous Gluon* forward should it get with 16-token pages, and with
# 64-token pages?

# %%
for res in [r for _, r in paged_prefill_runs] or not_run("paged prefill on Hopper", "*-paged-prefill.json") or []:
    print(f"{res['meta']['gpu']}: {res['prefill']['batch']} chunks of {res['prefill']['chunk']} after "
          f"{res['prefill']['cached']} cached keys")
    for page, r in res["prefill"]["pages"].items():
        ms = r["ms"]
        print(f"  {page:>2s}-token pages: Triton contiguous {ms['contiguous_varlen'] * 1e3:4.0f} us, Gluon contiguous "
              f"{ms['contiguous_gluon'] * 1e3:4.0f} us, Gluon paged {ms['paged_prefill_gluon_tma'] * 1e3:4.0f} us = "
              f"{r['vs_contiguous']['paged_prefill_gluon_tma']:.2f}x the Triton contiguous (the bar's baseline), "
              f"{r['vs_contiguous_gluon']['paged_prefill_gluon_tma']:.2f}x the Gluon contiguous")

# %% [markdown]
# Measured on the H100: **1.20x** (16-token pages) and **1.27x** (64-token pages) the contiguous Triton varlen
# forward the bar is defined on, and 0.96x / 1.01x of the *contiguous Gluon* forward: with the copies issued
# by a warp that does nothing else, paging costs a few percent at most. The 4% left on 16-token pages is, by the
# compiled code (not yet by a profiler), the producer's own instructions: 336 per key block against 55 for
# contiguous tiles (32 TMA copies with their address arithmetic), issued from an SM sub-partition it shares with
# consumer warps. One contract the Triton kernels do not have: the unused slots of a sequence's last page are
# copied with the page and weighted 0, so they must hold finite values (`0 · NaN` is NaN). A zero-initialised
# cache keeps it; `paged_prefill` checks it when it validates its inputs and runs the Triton kernel where a
# cache from `torch.empty` breaks it.
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
# On the GPU the course's first cascade was three launches, one after the other
# (`cascade_decode_separate` in `experiments/serving_baselines.py`, kept as the benchmark's before-state): the prefix pass (the
# dense FA2 kernel, the prefix's keys split into chunks so that ~2 programs per SM run), the suffix pass (the paged
# varlen kernel with each request's `G` heads as `G` rows), and a small kernel that merges the states. Its run in
# `bench_serving`:

# %%
for res, rows in measured("cascade"):
    fig, ax = plt.subplots(figsize=(6, 3))
    bsz = [r["batch"] for r in rows]
    ax.plot(bsz, [r["speedup_graph"] for r in rows], "o-", label="three launches (GPU time, CUDA graph)")
    # the one-launch run on the same GPU as this three-launch run
    one = [c for r2, cs in measured_mixed("cascade") if r2["meta"]["gpu"] == res["meta"]["gpu"] for c in cs]
    if one:
        ax.plot([c["batch"] for c in one], [c["speedup_graph_vs_paged"] for c in one], "s-",
                label="one launch (bench_mixed_batch, its own run)")
    ax.plot(bsz, [r["bytes_ratio"] for r in rows], "k--", label="bytes-read ratio")
    ax.set_xscale("log", base=2), ax.set_xlabel("requests sharing a 32k prefix (1k suffix each)")
    ax.set_ylabel("speedup over paged decode"), ax.legend(fontsize=8)
    ax.set_title(res["meta"]["gpu"], fontsize=9)
    plt.tight_layout()
    for r in rows:
        print(f"B={r['batch']:2d}: cascade {r['ms_graph_cascade'] * 1e3:6.0f} us, paged {r['ms_graph_paged'] * 1e3:6.0f} us"
              f" -> {r['speedup_graph']:.2f}x (bytes ratio {r['bytes_ratio']:.1f}); cascade reads "
              f"{r['bytes_cascade'] / 1e6:.0f} MB; called eagerly: {r['speedup_eager']:.2f}x of eager paged decode")

# %% [markdown]
# The three-launch speed-up grows with the batch but stays well below the bytes ratio, for two reasons:
#
# * **Small batches were far from their byte floor.** At B = 8 that cascade took 119 µs of GPU time for 168 MB,
#   which at the H100's datasheet HBM bandwidth (3.35 TB/s) would take about 50 µs. Its time was nearly flat
#   from B = 8 to B = 32 (119 → 131 µs) while its bytes grew 1.6x: a fixed cost of three launches run one after
#   the other, each too small at B = 8 to fill the GPU, not a bandwidth limit.
# * **Called eagerly, it lost at small batch**: 0.22x of eager paged decode at B = 8 — *slower than not sharing
#   at all* — winning only from B = 32. Its host path (three launches plus tensor reshaping, without the
#   recorded-launch fast path of §4) cost more than the GPU work.
#
# ### Cascade in one launch
#
# `reference.triton.cascade_decode` now does the whole cascade in **one launch**, as FlashInfer's cascade
# kernels do. The grid holds two kinds of work items: *prefix items* — a tile of up to 64 rows (the `G` query
# heads of `64 / G` requests) times one of `S` chunks of the prefix's keys — and *suffix items*, one request's
# `G` rows over its own pages. Every item writes a partial state `(o, lse)` into its tile's slots and takes a
# ticket from an atomic counter; the tile's last program merges the slots with the lse rule of lecture 7, so no
# merge launch is needed. `S` aims at one prefix program per SM with at most 2048 keys each. Eager calls repeat
# a recorded launch (§4). Measured by `python3 -m benchmarks.course.bench_mixed_batch` (one H100 run: the
# one-launch and three-launch versions, paged decode, each pass alone, and the copy bandwidth, all in the same
# process; the table is the one-launch Triton kernel, `cascade_triton`. It is `cascade_decode`'s path on every GPU
# but Hopper; on Hopper it runs calls made eagerly below 256 packed rows `B · G` per kv head (B < 64 at G = 4,
# `CascadeConfig.eager_gluon_min_rows`) and calls captured into a CUDA graph below 32 rows (B < 8,
# `CascadeConfig.gluon_min_rows`), so on Hopper a captured B = 8 call takes the Gluon path — the next sections
# say why):

# %%
for res, rows in measured_mixed("cascade"):
    bw = res["meta"]["copy_bw_bytes_per_s"]
    print(f"{res['meta']['gpu']}: copy bandwidth {bw / 1e12:.2f} TB/s (read + write, measured in this run)")
    print(" B  | graph us (3 launches) | eager/graph | vs paged: graph  eager | fraction of copy: call  prefix  suffix")
    for c in rows:
        g, f = c["ms_graph"], c["fraction_of_copy_bw"]
        one = "cascade_triton" if "cascade_triton" in g else "cascade"  # runs off Hopper time only the Triton kernel
        prefix = "prefix_pass_triton" if one == "cascade_triton" else "prefix_pass"
        loop = c.get("ms_loop_paths", {}).get(one, c["ms_loop"]["cascade"])
        print(f"{c['batch']:3d} | {g[one] * 1e3:5.0f} ({g['cascade_separate'] * 1e3:5.0f})        |"
              f" {loop / g[one]:11.2f} | {g['paged'] / g[one]:13.2f}x {c['ms_loop']['paged'] / loop:5.2f}x"
              f" | {f[one]:22.2f} {f[prefix]:7.2f} {f['suffix_pass']:7.2f}")

# %% [markdown]
# * **Small batches.** At B = 8 one launch takes 74 µs against 117 µs for the three launches in the same run,
#   2.75x paged decode (3.70x, 6.69x, 8.50x at B = 16, 32, 64). Its own 168 MB move at 0.76 of the copy
#   bandwidth measured in the same run — above the course's bar (0.7), which no L2 hit on a shared page can
#   flatter. (Paged decode, the baseline, "reads" its bytes at 1.83 times the copy bandwidth at B = 8: the
#   requests read the *same* prefix pages at about the same time and many reads hit L2, so the bytes ratio
#   overstates what sharing can win.) At B = 32 and 64 the one launch is no faster than the three (134 vs
#   131 µs, 207 vs 211 µs): there the prefix pass, not the launches, sets the time (below).
# * **Called eagerly it costs its GPU time**: eager loop / graph 0.91–0.98 and 2.74x eager paged decode at B = 8
#   (bar 1.5), where the three-launch version lost — as long as the Python side of a call is shorter than its
#   GPU time (§4 measures where that time goes).
# * **Larger batches miss the bar** on this kernel: 0.64 / 0.67 / 0.65 of copy at B = 16 / 32 / 64. The column
#   that explains it is the prefix pass alone: the same 134 MB at every batch, yet its time grows from 63 µs
#   (B = 8) to 146 µs (B = 64), falling to 0.31 of copy. It is
#   limited by its tile work (`B · G = 256` rows against 32k keys at B = 64 is a small prefill: 34 GFLOP), not by
#   bytes. Nsight Compute on the prefix pass alone at B = 64: DRAM throughput 33% of peak, SM throughput 27%, L2
#   hit rate 62% (the four 64-row tiles of a kv head each read the prefix, partly from L2), SMs busy for 67% of
#   the elapsed cycles (the long prefix programs are the launch's tail). The whole call overlaps that work with
#   the suffixes' reads, which is why it still reaches 0.65. Wider tiles (128 rows, 8 warps) and narrower ones
#   (32 rows) were both slower. The 64-row tiles already run on Hopper's wgmma (the sm_90a compile holds HGMMA
#   instructions); loading the prefix keys as TMA boxes moved the whole call by a few percent either way, and running
#   every prefix program first made the prefix pass faster but the call slower at B = 32 and 64 (the suffixes'
#   reads no longer overlapped it): `notes/serving_perf.md`, "Decode at 32k and the one-launch cascade".

#
# ### The prefix pass on Hopper's warp-specialised kernel
#
# The prefix pass *is* a small prefill: per kv head, the `B · G` query rows of all requests (packed) against the
# prefix's keys, non-causal, returning `(o, lse)`. So on Hopper it can run on lecture 6's kernel: one CTA per (kv
# head, 128 packed rows, chunk of the prefix), a producer warp streaming the prefix through TMA, two ping-pong
# consumer warpgroups (`reference/triton/hopper/cascade_prefix_gluon.py`). The price is a second launch: a Gluon
# kernel and a Triton kernel cannot share one, so the Triton kernel runs after it with suffix items only, each
# request merging its own rows: two launches in one CUDA graph, one after the other (`CascadeConfig.overlap="off"`).
# Measured (`bench_mixed_batch --sections cascade --results-name cascade`, every path in one process):

# %%
for res in [r for _, r in cascade_runs] or not_run("the Gluon prefix pass", "*-cascade.json") or []:
    print(f"{res['meta']['gpu']}: copy bandwidth {res['meta']['copy_bw_bytes_per_s'] / 1e12:.2f} TB/s")
    print(" B  | graph us: Triton (1 launch)  Gluon, off (2) | own bytes / copy: Triton  Gluon | Gluon prefix kernel us")
    for c in res["cascade"]:
        g, f = c["ms_graph"], c["fraction_of_copy_bw"]
        print(f"{c['batch']:3d} | {g['cascade_triton'] * 1e3:26.0f} {g['cascade_gluon'] * 1e3:16.0f} |"
              f" {f['cascade_triton']:24.2f} {f['cascade_gluon']:6.2f} |"
              f" {c['kernel_us']['cascade_gluon']['cascade_prefix_kernel']:10.0f}")

# %% [markdown]
# * The Gluon prefix kernel takes about 48-55 µs at every batch: the 134 MB prefix at 0.81-0.93 of the copy
#   bandwidth, and at B = 64 its 34 GFLOP at lecture 6's rate. The Triton prefix pass fell to 0.31 of copy there.
# * One after the other, the Gluon call meets the bar at B = 32 and 64 (0.72 and 0.77 of copy: 124 and 174 µs
#   against 134 and 212 µs for the one-launch Triton kernel), and loses at B = 8 and 16 (96 and 103 µs against
#   75 and 99): there the prefix was never the problem, and two launches pay prefix plus suffixes in full (plus
#   the gap between the launches), where one launch overlapped them.
# * **B = 8 depends on where the prefix programs land** (the Triton kernel): 128 of them (16 chunks x 8 kv heads)
#   for 132 SMs. In the (item, kv head) launch order some SMs got two compute-bound prefix programs while others
#   got none (ncu: SMs busy for 54% of the elapsed cycles). Launching the prefix items first when they fit one
#   per SM (the default) gives each its own SM: the prefix pass alone reads at 0.73 of copy. The whole call's
#   CUDA-graph time at B = 8 still spreads by several percent between runs (`notes/serving_perf.md`).
#
# ### Both passes at once: a programmatically dependent launch
#
# At B = 16 the sequential Gluon call is a ~48 µs prefix kernel, a ~48 µs suffix launch and the gap between them.
# The two passes share nothing until the merge, so they could run side by side — if each left the other room.
# The prefix kernel at B ≤ 32 executes its padded tiles far faster than it can stream the 134 MB prefix, so it
# is bandwidth-bound: it may not need all 132 SMs.
#
# **Predict** before running the next cell: with the prefix kernel on half the SMs (64 CTAs, each twice the keys)
# and the suffix programs on the other half, (a) how long does the prefix kernel take at B = 16, and at B = 64,
# where its 34 GFLOP now share half the tensor cores? (b) What is the floor of the whole call (its own 201 MB at
# B = 16 at the copy bandwidth)? (c) Where should the overlap stop paying?
#
# How it is launched matters. Two kernels on two streams of a graph (`overlap="streams"`: fork, join, then a merge
# launch) leave the GPU free to place either grid first; if the suffix grid spread over every SM first, the prefix
# CTAs (a whole SM's registers each) would wait. Hopper's **programmatic dependent launch** fixes the order
# (`overlap="pdl"`): every prefix CTA starts with `griddepcontrol.launch_dependents`, and the suffix grid,
# launched on the same stream with the programmatic-serialization attribute, is placed only once *every* prefix
# CTA has issued it — so only on the SMs the prefix left free. Each suffix program computes its requests' suffix
# states, then executes `griddepcontrol.wait`, which returns when the prefix grid has completed and its writes
# are visible, and merges. That wait is not a spin on another kernel's memory (which could hang if the other
# kernel never got an SM): every prefix CTA was resident before any suffix CTA started, so the prefix always
# finishes.

# %%
pdl_runs = [r for _, r in cascade_runs if "cascade_gluon_pdl" in r["cascade"][0]["ms_graph"]]
for res in pdl_runs[:1]:
    by_b = {c["batch"]: c for c in res["cascade"]}
    guess = None  # (a) your answer: the prefix kernel on half the SMs at B = 16, in µs
    check_guess(guess, by_b[16]["kernel_us"]["cascade_gluon_pdl"]["cascade_prefix_kernel"], rel=0.2,
                what="prefix kernel on 64 CTAs, B = 16, us (profiler)")
    guess = None  # (a) ... and at B = 64
    check_guess(guess, by_b[64]["kernel_us"]["cascade_gluon_pdl"]["cascade_prefix_kernel"], rel=0.2,
                what="prefix kernel on 64 CTAs, B = 64, us (profiler)")
    guess = None  # (b) your answer: the floor at B = 16, own bytes at the copy bandwidth of the run, in µs
    check_guess(guess, by_b[16]["bytes"]["cascade"] / res["meta"]["copy_bw_bytes_per_s"] * 1e6, rel=0.15,
                what="B = 16 own bytes at copy bandwidth, us")

# %%
for res in pdl_runs:
    print(f"{res['meta']['gpu']}: graph us (own bytes / copy)")
    print(" B  |  pdl            streams        off            Triton 1 launch | pdl kernels us: prefix  suffix+merge")
    for c in res["cascade"]:
        g, f, k = c["ms_graph"], c["fraction_of_copy_bw"], c["kernel_us"]["cascade_gluon_pdl"]
        cell = lambda p: f"{g[p] * 1e3:6.1f} ({f[p]:.2f})"  # noqa: E731
        print(f"{c['batch']:3d} | {cell('cascade_gluon_pdl')}  {cell('cascade_gluon_streams')}  {cell('cascade_gluon')}"
              f"  {cell('cascade_triton')}   | {k['cascade_prefix_kernel']:24.0f} {k['_cascade_kernel']:12.0f}")

# %% [markdown]
# * **Half the SMs stream the prefix almost as fast as all of them**: the prefix kernel on 64 CTAs takes 53 /
#   55 / 55 µs at B = 8 / 16 / 32, against 48-55 µs on all SMs — it was bandwidth-bound. At B = 64 it takes 106
#   µs: its 34 GFLOP on half the tensor cores make it compute-bound.
# * "pdl" is 67.1 / 81.3 / 121.5 / 189.2 µs (0.83 / 0.83 / 0.74 / 0.71 of copy): **B = 16 meets the bar** with
#   room, where both one-pass-after-the-other designs missed. The two kernels' profiler durations add up to more
#   than the graph time by about 30 µs, so they overlap, though not fully; at B = 32 the suffix programs (82 µs
#   for 256 requests' items) are the tail, and at B = 64 (166 µs) overlapping loses to "off".
# * "streams" is a few µs slower (72.3 / 86.7 / 122.0 / 185.2): the merge launch and the fork/join.
#
# So `cascade_decode` picks per batch (`CascadeConfig`), for a call captured into a CUDA graph: "pdl" from 32
# packed rows up to 128 (B = 8, 16, 32), "off" above, the one-launch Triton kernel below 32 rows
# (`gluon_min_rows`). A call made eagerly takes the Gluon path only from 256 rows (`eager_gluon_min_rows`):
# `cascade_decode` asks whether the stream is being captured (`torch.cuda.is_current_stream_capturing()`), and
# the recorded launches are keyed on the capture state too. Why two thresholds? **Host time.** The Gluon paths
# launch two kernels from Python with TMA descriptors (cached per prefix address); called eagerly, the "pdl"
# path at B = 8 ran at 2.52x its graph time in the overlap run, the Triton kernel at 0.98x: the Python side of
# the two launches took longer than their GPU time. A graph replay has no Python side, so there the faster GPU
# path wins. The full run of `bench_mixed_batch` (`h100-mixed-batch.json`, its `cascade` columns: the default
# path at each B): 68 / 87 / 121 / 170 µs, 0.82 / 0.78 / 0.74 / 0.79 of copy — the bar met at every batch.
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
# With the recorded launch, an eager decode call at B = 1 and 32k keys costs its GPU time (loop/graph 1.04 for
# `flash_decode`, 0.96 for `paged_decode`; the bar was 1.2), as fast as SDPA's default backend (cuDNN) called
# eagerly, within the few percent by which the kernels themselves differ. But that is *at 32k*, where the GPU
# time (55–57 µs) is about as long as the host path. The host time per call does not shrink with the context:
# measured on a tiny problem, `flash_decode` spends 30 µs of host time per call and `paged_decode` 57 µs. The
# GPU time does shrink (decode reads the KV cache: at B = 1 its time is roughly proportional to the context), so
# below a crossover context the eager loop waits on Python, not on the GPU: Validation with a sync is the expensive part: a serving loop validates its inputs once,
# where they are built, and passes `validate=False` in the hot path.

# %%
for res, e in measured("eager"):
    for name in ("flash_decode", "paged_decode"):
        gpu_us, host_us = e["cases"][name]["ms_graph"] * 1e3, e["host_us_tiny"][name]
        cross = e["context"] * host_us / gpu_us    # GPU time ~ context (bandwidth-bound), host time constant
        print(f"{res['meta']['gpu']} {name}: GPU {gpu_us:.0f} us at {e['context'] // 1024}k keys, host {host_us:.0f} us "
              f"per call -> host-bound below about {cross / 1024:.0f}k keys (B = 1, linear model)")

# %% [markdown]
# So `paged_decode` called eagerly is host-bound below about 32k keys at B = 1, `flash_decode` below about 18k
# (a linear model through one measured point: decode at short context also has a fixed GPU cost, which moves the
# crossover lower; the crossover itself is not measured). Larger batches push it down too, since the GPU time
# grows with the batch and the host time barely does. This is why engines capture the decode step in a CUDA
# graph: the graph replays every launch of the step for one host call.
#
# ### Where a recorded launch's host time goes
#
# A recorded launch still runs Python on every call: it builds the key from the call's tensors, allocates the
# outputs, finds the CUDA stream and hands the arguments to Triton's launcher. For the one-launch cascade at
# B = 8 (about 75 µs of GPU time) that path once took longer than the kernel on a slow host, and the eager loop
# measured Python. **Predict** before running the next cell: of the steps of the recorded path before the cut
# this section measures (the *uncut* path), which costs the most: building the key (`"key"`), finding the stream (`"stream"`), allocating the `lse` output (`"alloc"`)
# or the launch call itself (`"launch"`)? And would handing the launcher raw addresses instead of tensors save a
# lot?

# %%
guess = None  # your answer: "key", "stream", "alloc" or "launch"
host_runs = load_results("*-cascade-host-probe.json")  # python3 -m benchmarks.tuning.profile_cascade_host
if not host_runs:
    not_run("the recorded launch's host time", "<gpu>-cascade-host-probe.json")
for path, r in host_runs:
    row = next(x for x in r["rows"] if x["batch"] == 8)
    h, b = row["host_us"], row["breakdown_us"]
    print(f"{path.name}: {r['meta']['gpu']}, cascade B = 8, GPU time {row['graph_us']:.0f} us a call (graph)")
    print(f"  host us a call, median of 7: uncut recorded path {h['uncut']['median']:.1f}, "
          f"now {h['current']['median']:.1f}")
    for step, us in b.items():
        print(f"  {step:62s} {us:6.2f} us")
    steps = {"key": b["key_uncut (7 tensor keys, current_stream, capture, hash)"],
             "stream": b["torch.cuda.current_stream().cuda_stream"],
             "alloc": b["torch.empty(q.shape[:2], dtype, device)"],
             "launch": b["launch: uncut RecordedLaunch.__call__ (dict, metadata, hooks)"]}
    check_guess(guess, max(steps, key=steps.get), what="the costliest step of the uncut recorded path")

# %% [markdown]
# The launch call was the largest step, about 20 µs, but not because of the driver: Triton's own launch path
# (`run()` with the tensors, the launch metadata and the two hook chains, empty unless a profiler installs hooks)
# takes 9 µs, and the launcher's C entry point alone 7 µs. The rest was our Python around it: the CUDA stream
# looked up through `torch.cuda.current_stream()` (4.4 µs, against 0.13 µs through Triton's own getter) and the
# argument list rebuilt from a dictionary. The key came next (11 µs for seven tensors' shapes, strides, dtypes
# and devices). Raw addresses instead of tensors save under 1 µs for all 14 arguments: the C side was never the
# problem. Cutting the Python took a call from 44.9 to 21.2 µs in the same process. The lesson carries over to any
# eager serving loop: time the host side step by step before guessing, and expect it to move with the machine's
# CPU (one H100 host of this course ran the same path 1.5-2x slower than another).
#
# ## 5. Mixed batches: prefill and decode in one launch
#
# A serving step has two kinds of work: a few requests with prompt tokens left (a chunk each) and many requests
# decoding one token each. Engines do not launch them apart. In vLLM's V1 engine and in FlashInfer-based
# engines every request's new tokens of the step go into **one flat token batch** — a prefill chunk adds `n`
# query rows, a decode request adds **one** — and one varlen attention launch over the paged cache serves all of
# them: a decode row is just a sequence whose query length is 1 and whose keys are its whole cache (bottom-right
# causal alignment makes that row see every key, lecture 0). `reference.numpy.mixed.mixed_attention` is that
# definition: one call with `cu_seqlens_q = [0, 1, 2, ..., B_dec, B_dec + n_1, ...]` over the block tables:

# %%
hq, hkv, d, bs = 4, 2, 8, 4
cache = PagedKVCache(64, bs, hkv, d, dtype=np.float64)
ctx = {"dec0": 9, "dec1": 14, "dec2": 5, "pre0": 6}          # tokens already cached per request
for rid, n0 in ctx.items():
    cache.add_sequence(rid)
    cache.append(rid, rng.standard_normal((n0, hkv, d)), rng.standard_normal((n0, hkv, d)))
n_chunk = 7                                                  # pre0 prefills 7 more prompt tokens this step
new = {rid: 1 for rid in ("dec0", "dec1", "dec2")} | {"pre0": n_chunk}
q_step = {rid: rng.standard_normal((n, hq, d)) for rid, n in new.items()}
for rid, n in new.items():                                   # the step's own K/V enter the cache first (§2)
    cache.append(rid, rng.standard_normal((n, hkv, d)), rng.standard_normal((n, hkv, d)))
order = list(new)
tables, seq_lens = cache.block_tables(order)
cu_q = np.concatenate([[0], np.cumsum([new[r] for r in order])])
q_all = np.concatenate([q_step[r] for r in order])
o_mixed, _ = mixed_attention(q_all, cache.k_cache, cache.v_cache, tables, cu_q, seq_lens)
print("one call: cu_seqlens_q =", cu_q.tolist(), "| seq_lens =", seq_lens.tolist())
dec = order[:3]                                              # the same work as two launches: decode, then prefill
t_dec, l_dec = cache.block_tables(dec)
o_dec, _ = paged_prefill(np.stack([q_step[r][0] for r in dec]), cache.k_cache, cache.v_cache, t_dec,
                         np.arange(len(dec) + 1), l_dec)
t_pre, l_pre = cache.block_tables(["pre0"])
o_pre, _ = paged_prefill(q_step["pre0"], cache.k_cache, cache.v_cache, t_pre, [0, n_chunk], l_pre)
print(f"max |mixed call - (decode launch, prefill launch)| = "
      f"{np.abs(o_mixed - np.concatenate([o_dec, o_pre])).max():.1e}")

# %% [markdown]
# One call is the easy part; a GPU kernel must also divide the step's very uneven work (a 7-token chunk, decode
# rows over 6 to 15 keys here; 512-token chunks and decode rows over 1k to 32k keys in a real step) among
# programs. `mixed_plan` is that division, made on the host from the lengths alone:
#
# * **Tiles, GQA-packed.** A request's new tokens are cut into tiles, and the `G = Hq / Hkv` query heads that
#   read one kv head become the tile's rows (row `r`: token `r // G`, head `h·G + r % G`), so each key block is
#   loaded once for all `G` heads. A decode row is then `G` rows, not one row of a 128-row tile: requests with
#   few tokens get a *small* tile, prefill chunks a *large* one.
# * **Key splits.** A tile that sees more than `split_keys` keys becomes several work items (Flash-Decoding,
#   lecture 7), each giving a partial state that `merge_states` folds. A long decode is then several programs,
#   not one program streaming 32k keys while the rest of the GPU idles.
# * **Heaviest first.** Items are sorted by work (keys x rows), so the long ones do not start last.
#
# The plan of the step above, with tiny tiles so that it splits (the GPU defaults are 16 and 64 rows and 4096
# keys per split):

# %%
G = hq // hkv
plan = mixed_plan(np.diff(cu_q), seq_lens, group=G, small_rows=2 * G, large_rows=4 * G, split_keys=8, align=4)
print(" ".join(f"{c:>8s}" for c in ITEM_COLUMNS), "  <- plan.items, one row per work item")
for item in plan.items:
    b, t0, n_tok, k_lo, k_hi, large, n_splits, _, split = item.tolist()
    print(" ".join(f"{x:8d}" for x in item.tolist()), f"  {order[b]}: tokens {t0}..{t0 + n_tok - 1} = "
          f"{n_tok * G} rows ({'large' if large else 'small'} tile), keys {k_lo}..{k_hi - 1}, "
          f"split {split + 1}/{n_splits}")
o_plan, _ = mixed_attention_by_plan(q_all, cache.k_cache, cache.v_cache, tables, cu_q, seq_lens, plan)
print(f"{len(plan.items)} work items, {plan.n_slots} partial-state slots; "
      f"max |by plan - mixed_attention| = {np.abs(o_plan - o_mixed).max():.1e}")

# %% [markdown]
# The chunk's tiles see different key ranges (bottom-right causal: its first four tokens see keys 0..9, the
# last three 0..12), and every tile that sees more than 8 keys is cut into splits.
# `reference.triton.mixed_attention` runs such a plan (`make_mixed_plan`, made on the host with no device sync
# when the engine passes host lengths) in **one launch**: one program per (work item, kv head), the two tile
# shapes as two branches of one kernel, and the program that takes the last ticket of a split tile's atomic
# counter merges its partial states, so no merge launch follows.
#
# What a GPU engine adds around that one launch:
#
# * **Plan once, run per layer** (FlashInfer's `plan()` / `run()`). The plan depends only on the step's lengths
#   and page tables, not on the layer, so the host computes it once per step and every layer's attention reuses
#   it: the per-layer launch does no host-side work.
# * **Fixed shapes for CUDA graphs.** A CUDA graph replays launches with fixed shapes and addresses. Decode
#   batches change size every step, so engines capture graphs for a ladder of batch sizes (vLLM: 1, 2, 4, 8,
#   then multiples of 8) and **pad** the batch up to the next captured size (padded rows are masked out or
#   thrown away). Mixed steps with prefill chunks have too many shapes to capture; vLLM V1 captures the rest of
#   the model piecewise and runs attention outside the graph. §4 measured why graphs matter: at short contexts
#   an eager decode call is host-bound.
# * **The chunk size: Sarathi-Serve's trade-off** (Agrawal et al., OSDI 2024). Each step has a **token
#   budget**. Decode rows go in first (they are latency-critical), and prefill chunks fill what is left
#   ("stall-free batching"). A small budget keeps every step short, so running requests get their next token
#   quickly (low **time per output token**, TPOT), but a long prompt needs many steps, each paying the step's
#   fixed cost (reading all the weights once), so its **time to first token** (TTFT) grows. A large budget
#   does the opposite: prompts finish in few steps, and every decode in those steps waits for a big prefill.
#
# `MiniEngine.step` is this policy: a decode row for every request past its prompt goes in first, then prefill
# chunks spend a budget of `chunk` prompt tokens, and the whole batch is **one** `mixed_attention` call (with a
# shared prefix, §6, the decode rows take cascade attention and the chunks alone go through `mixed_attention`).
#
# **On the GPU.** `bench_mixed_batch` times a realistic step — 4 prefill chunks of 512 tokens (after 2k cached
# tokens each) and 60 decode rows at 1k–32k keys, 16-token pages — as one `mixed_attention` launch, as the two
# launches an engine without it would make (`paged_prefill` for the chunks, `paged_decode` for the decode rows),
# and as one `paged_prefill` over the whole batch (the one-call interface without the plan):

# %%
for res, m in measured_mixed("mixed"):
    g, bw = m["ms_graph"], res["meta"]["copy_bw_bytes_per_s"]
    print(f"{res['meta']['gpu']}: {m['chunks']} chunks x {m['chunk']} + {len(m['decode_lens'])} decode rows "
          f"({min(m['decode_lens'])}..{max(m['decode_lens'])} keys), {m['kv_bytes'] / 1e9:.2f} GB of K/V; "
          f"plan: {m['work_items']} work items, {m['split_slots']} split slots")
    for name, ms in g.items():
        print(f"  {name:30s} {ms * 1e3:6.0f} us (CUDA graph)   mixed launch {ms / g['mixed_one_launch']:4.2f}x as fast"
              f"   K/V at {m['kv_bytes'] / (ms * 1e-3) / 1e12:.2f} TB/s"
              f" = {m['kv_bytes'] / (ms * 1e-3) / bw:.2f} of copy")

# %% [markdown]
# One mixed launch takes 886 µs, **1.33x** the speed of the separate prefill and decode launches and 4.79x
# that of `paged_prefill` over the whole batch (the mixed launch with its table entries looked up in place, one per
# key row, took 1037 µs). On Hopper both baselines' `paged_prefill` is now the Gluon paged kernel of §2: faster for the chunks
# than the Triton page tiles, slower still for the decode rows. The last comparison is the plan's worth: without
# it each decode row sits in a 128-row tile of one query head (one useful row of 128, its kv head's keys re-read by each of the
# `G` heads) and is never split: a 32k decode row is one program reading 32k keys. Streamed at the copy bandwidth, the
# step's 2.35 GB of K/V would take about 0.8 ms with the prefill hidden under it (the prediction in
# `notes/serving_perf.md`); measured, the launch moves them at 2.65 TB/s, 0.88 of copy — the prefill chunks run
# at the page-tile speed of §2. Tiles of one page (16 keys, `mixed_one_launch_block16`) cost 1061 µs: the
# per-tile fixed cost of §2 again.
#
# ## 6. A mini engine
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
# ### The chunk size: time to first token against time per output token
#
# The engine counts steps; to turn steps into time we need a step-time model. The one below takes the
# attention costs **measured** in §2 and §4 (the benchmark's shape is Llama-3-8B's attention: 32 query heads,
# 8 kv heads, d = 128) and **assumes** the rest of an 8B model on an H100 (datasheet-level numbers, not
# measured here):
#
# $$t_\text{step} = \max\Big(\frac{\text{weight bytes}}{\text{HBM bandwidth}},\ n_\text{tokens}\cdot\frac{2P}{F}\Big)
#   + L\,\big(n_\text{prefill}\, a_\text{prefill} + n_\text{keys read}\, a_\text{decode}\big)$$
#
# The first term is the linear layers: each step reads all the weights once (16 GB at 3.35 TB/s: 4.8 ms), and
# past a few hundred tokens the matmuls are compute-bound (2 · 8e9 FLOPs per token at an assumed 500 TFLOP/s).
# The second is attention, per layer: `a_prefill` = measured paged-prefill time per token, `a_decode` = measured
# paged-decode GPU time per cached key. All requests arrive at once; TTFT is the time until a request's first
# token, TPOT the mean time between its later tokens.

# %%
LAYERS, WEIGHT_BYTES, HBM, PARAMS, FLOPS = 32, 16e9, 3.35e12, 8e9, 500e12      # assumed, not measured
a_prefill = a_decode = None
for res, p in measured("prefill"):
    a_prefill = p["ms_paged"] * 1e-3 / (p["batch"] * p["chunk"])                # s per prefill token, one layer
for res, e in measured("eager"):
    a_decode = e["cases"]["paged_decode"]["ms_graph"] * 1e-3 / e["context"]    # s per cached key read, one layer
if a_prefill is None or a_decode is None:   # no committed serving run: a stand-in, said loudly
    print("no measured attention costs: using a_prefill = 0.25 us/token, a_decode = 1.7 ns/key (placeholders)")
    a_prefill, a_decode = 0.25e-6, 1.7e-9
print(f"a_prefill = {a_prefill * 1e6:.3f} us per token per layer, a_decode = {a_decode * 1e9:.2f} ns per key per layer")


def step_time(h):
    """Model time (s) of one engine step from its history record (see the formula above)."""
    n_tok = h["decoded"] + h["prefilled"]
    linear = max(WEIGHT_BYTES / HBM, n_tok * 2 * PARAMS / FLOPS) if n_tok else 0.0
    return linear + LAYERS * (h["prefilled"] * a_prefill + h["tokens_held"] * a_decode)


def serve(chunk, seed=2):
    """Serve one fixed request stream with prefill budget ``chunk``; return (mean TTFT, mean TPOT) in ms."""
    g = np.random.default_rng(seed)
    eng = MiniEngine(model, pool_tokens=16384, block_size=16, chunk=chunk, max_running=16)
    for i in range(16):
        n_prompt = int(np.clip(g.lognormal(np.log(200), 0.8), 16, 1024))
        eng.add(i, [int(t) for t in g.integers(0, 97, n_prompt)], 24)
    first = {}
    while eng.waiting or eng.running:
        eng.step()
        for r in eng.running + eng.done:
            if r.output and r.rid not in first:
                first[r.rid] = eng.steps - 1                 # the step that produced its first token
    t_end = np.cumsum([step_time(h) for h in eng.history])  # time at the end of each step
    ttft = [t_end[first[r.rid]] for r in eng.done]
    tpot = [(t_end[r.finished_step] - t_end[first[r.rid]]) / (len(r.output) - 1) for r in eng.done]
    return 1e3 * np.mean(ttft), 1e3 * np.mean(tpot)


# %% [markdown]
# **Predict, then run.** Going from a budget of 16 prompt tokens per step to 1024, does the mean time per
# output token go `"up"` or `"down"`? And the mean time to first token?

# %%
chunks = [16, 32, 64, 128, 256, 512, 1024]
curve = {c: serve(c) for c in chunks}
guess = None  # "up" or "down", for TPOT
check_guess(guess, "up" if curve[1024][1] > curve[16][1] else "down", what="TPOT from chunk 16 to 1024")
for c, (ttft, tpot) in curve.items():
    print(f"chunk {c:5d}: mean TTFT {ttft:7.1f} ms, mean TPOT {tpot:6.2f} ms   (model)")
fig, ax = plt.subplots(figsize=(5.5, 3.4))
ax.plot([curve[c][1] for c in chunks], [curve[c][0] for c in chunks], "o-")
for c in chunks:
    ax.annotate(str(c), (curve[c][1], curve[c][0]), textcoords="offset points", xytext=(4, 4), fontsize=8)
ax.set(xlabel="mean time per output token (ms, model)", ylabel="mean time to first token (ms, model)",
       title="MiniEngine, prefill budget per step (labels)")
plt.tight_layout()

# %% [markdown]
# Small budgets give the lowest TPOT and the highest TTFT: each prompt needs many steps, and every step pays the
# 4.8 ms weight read. Past the knee where a step turns compute-bound (about 150 tokens per step with the
# assumed numbers), a larger budget buys little TTFT and costs TPOT almost linearly: every decode in a step
# waits for its prefill. Serving systems pick the budget from a TPOT target (Sarathi-Serve chooses it from the
# latency SLO); the curve, not one number, is the answer. The model's assumed constants decide where the knee
# sits; the shape does not depend on them.
#
# ## Exercises
#
# 1. In the mini engine, halve `pool_tokens`. Predict which policy loses more throughput, then run it.
# 2. Why must the chunk's own K/V be appended to the cache *before* its queries attend? What would break for
#    the first chunk row if it were appended after?
# 3. Cascade at B = 1 reads exactly the bytes of paged decode. Why can it still be slower, even in one launch?
#    (Count the programs, the rows of a prefix tile that hold a query, and the partial states written and merged.)
# 4. In the varlen kernel a query block past its sequence's end returns immediately. The grid is
#    `cdiv(max_seqlen_q, BLOCK_M)` query blocks for each of the `B * Hq` (sequence, head) pairs. For the
#    benchmark's 32 prompts (their lengths are `vl["lengths"]` in §1's cell; the longest has 2052 tokens),
#    `Hq = 32` and `BLOCK_M = 128`, how many
#    programs does the grid launch, and how many do work? (Compare with the tile ratio printed in §1.)
# 5. In the chunk sweep, set `FLOPS` to 2.5e14 and to 1e15. Predict how the knee of the curve moves, then run.
#    Then replace the weight read by 0 (a model whose weights are free): what is left of the trade-off?
