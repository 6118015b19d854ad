# %% [markdown]
# # Lecture 8 — PagedAttention: virtual memory for the KV cache
#
# **Learning objectives.** After this lecture you can:
#
# 1. Quantify the memory a static KV cache wastes with the fragmentation simulator.
# 2. Map a sequence's logical blocks to physical blocks with a block table.
# 3. Fork a sequence with copy-on-write and say when a block is copied.
# 4. Compute attention over a paged KV cache and check it against contiguous attention.
#
# Lecture 7 made each decode step fast. This lecture is about *memory*: how many sequences fit on a GPU at once,
# which sets the batch size and therefore the serving throughput. A static KV cache wastes most of its memory;
# vLLM's PagedAttention (Kwon et al., SOSP 2023) manages the cache the way an operating system manages RAM —
# in fixed-size pages, through a table — and attends through the table.
#
# Code: `reference.numpy.paged` (`BlockAllocator`, `PagedKVCache`, `paged_attention`) and the simulator
# `reference.simulators.fragmentation`.
#
# **Reading path:** lecture 7 → this lecture → assignment `a5_paged`.

# %%
import numpy as np

from lectures._exercise import check_guess
from lectures._plots import load_results, setup
from reference.simulators import fragmentation as fr
from reference.numpy.attention import attention
from reference.numpy.paged import BlockAllocator, PagedKVCache, paged_attention

plt = setup()
rng = np.random.default_rng(8)

# %% [markdown]
# ## 1. Static KV cache management wastes memory
#
# A static cache **pre-allocates contiguous space** for each request's **maximum** length, because the output
# length is unknown when the request arrives. That causes
#
# * **reservation** — slots reserved for tokens the request *will* produce but has not generated yet (they will
#   be filled, but they are idle until then);
# * **internal fragmentation** — reserved slots the request will **never** use (it stops before its maximum);
# * **external fragmentation** — free memory split into holes too small for the next request, because
#   reservations have different sizes.
#
# The vLLM paper (Kwon et al., SOSP 2023, Figure 3) draws the same three kinds of waste; the simulator keeps
# them as separate categories (`reference.simulators.fragmentation.CATEGORIES`), and the bar chart below shows each. Some
# texts count reservations as internal fragmentation; here "internal" means never used.
#
# The seeds (vLLM slides): *"only 20–40% of KV cache is utilized to store actual token states."* The simulator
# serves a ShareGPT-like stream of requests (mean prompt 161, mean output 338 tokens, lengths up to 2048) from a
# fixed pool, and classifies every slot at every step (its docstring has the exact rules):

# %%
reqs = fr.make_requests(300, seed=0)
policies = (("static", None), ("pow2", None), ("oracle", None), ("paged", 16))
reports = {p: fr.simulate(reqs, p, pool_tokens=12000, block_size=bs, record_trace=True) for p, bs in policies}
cats = fr.CATEGORIES
fig, ax = plt.subplots(figsize=(7.5, 3))
left = np.zeros(len(reports))
for c, col in zip(cats, ("tab:green", "tab:olive", "tab:red", "tab:orange", "lightgray")):
    vals = np.array([r.breakdown[c] for r in reports.values()])
    ax.barh(list(reports), vals, left=left, color=col, label=c.replace("_", " "))
    left += vals
ax.invert_yaxis(); ax.set_xlabel("fraction of the KV pool (steps with requests waiting)")
ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25))
plt.tight_layout()
for name, r in reports.items():
    print(f"{name:7s}: {r.utilisation:5.1%} of the pool holds token states; mean concurrency "
          f"{r.mean_concurrency:5.1f} sequences; {r.throughput:5.1f} tokens/step; waste per sequence: mean "
          f"{r.mean_waste_per_seq:7.1f}, max {r.max_waste_per_seq} slots")

# %% [markdown]
# The static policy stores real tokens in about a fifth of the pool — the bottom of the seeds' 20–40% range;
# reserving the next power of two ("pow2") or even the exact final length ("oracle", impossible in practice)
# still wastes half or more, because a reservation is held while the output is generated and variable-sized
# holes fragment the pool. The committed full-size run (`benchmarks/course/fragmentation.py`: 1000 requests, an
# OPT-13B cache of 800 KiB per token in a 40 GB pool, 3 seeds) gives:

# %%
saved = load_results("cpu-fragmentation.json")
if not saved:
    print("benchmarks/results/cpu-fragmentation.json is not there yet (run `python -m benchmarks.course.fragmentation`).")
for path, res in saved:
    print(f"benchmarks/results/{path.name} ({res['pool']['model']}):")
    for pol, s in res["summary"].items():
        print(f"  {pol:12s} utilisation {s['utilisation']:5.1%}   mean concurrency {s['mean_concurrency']:6.1f}"
              f"   max waste per sequence {s['max_waste_per_seq']:6.0f} slots")

# %% [markdown]
# ## 2. Paging the KV cache
#
# An OS gives each process a contiguous *virtual* address space made of fixed-size pages that live anywhere in
# physical memory, found through a page table. PagedAttention does the same at the application level:
#
# * the cache is split into **KV blocks** — fixed-size contiguous chunks that store the K/V states of
#   `block_size` tokens, filled left to right;
# * each sequence has a **block table** mapping its logical blocks (token $t$ is in logical block
#   $t \,//\, \text{block\_size}$, slot $t \bmod \text{block\_size}$) to physical blocks;
# * blocks are allocated **on demand** from a free list as tokens are appended. Any free block will do, so there
#   is **no external fragmentation**, and only the **last block** of a sequence can be partly empty, so the waste
#   per sequence is **below one block**.

# %%
cache = PagedKVCache(num_blocks=12, block_size=4, n_kv_heads=2, head_dim=8, dtype=np.float64)
for seq, n in (("alan", 10), ("bob", 3), ("carol", 6)):
    cache.add_sequence(seq)
    cache.append(seq, rng.standard_normal((n, 2, 8)), rng.standard_normal((n, 2, 8)))
cache.append("alan", rng.standard_normal((3, 2, 8)), rng.standard_normal((3, 2, 8)))   # alan grows later
for seq in ("alan", "bob", "carol"):
    n = cache.seq_len(seq)
    print(f"{seq:6s} {n:2d} tokens -> block table {cache.block_table(seq).tolist()}  "
          f"(wasted slots {len(cache.block_table(seq)) * 4 - n} < block size 4)")
print(cache)

owner = np.full(cache.num_blocks, -1)
for i, seq in enumerate(("alan", "bob", "carol")):
    owner[cache.block_table(seq)] = i
fig, ax = plt.subplots(figsize=(7, 1.4))
ax.imshow(owner[None, :], cmap=plt.matplotlib.colors.ListedColormap(["white", "tab:blue", "tab:orange", "tab:green"]),
          vmin=-1.5, vmax=2.5, aspect="auto")
ax.set_yticks([]); ax.set_xticks(range(cache.num_blocks)); ax.grid(False)
ax.set_title("physical blocks: alan (blue), bob (orange), carol (green), free (white) — not contiguous")
plt.tight_layout()

# %% [markdown]
# ## 3. Sharing blocks: fork with copy-on-write
#
# Parallel sampling and beam search produce several continuations of the same prompt. `fork` gives the child
# the parent's block table and increments each block's **reference count** — no data is copied. Full blocks are
# never written again, so they stay shared; the partly filled last block is **copied on the first write** while
# it is shared (copy-on-write), exactly like `fork()` in an OS. The `BlockAllocator` keeps the reference counts
# and returns a block to the free list when its count reaches zero:

# %%
cache.fork("carol", "carol_2")
shared = cache.block_table("carol").tolist()
print("after fork: carol", shared, "carol_2", cache.block_table("carol_2").tolist(),
      "refcounts", [cache.allocator.refcount(b) for b in shared])
cache.append("carol_2", rng.standard_normal((1, 2, 8)), rng.standard_normal((1, 2, 8)))
print("carol_2 appends one token -> its last block is copied:", cache.block_table("carol_2").tolist(),
      "| carol keeps", cache.block_table("carol").tolist())
k_parent, _ = cache.gather("carol")
k_child, _ = cache.gather("carol_2")
print("shared prefix identical:", np.array_equal(k_parent, k_child[:6]), "| parent unchanged length:", len(k_parent))
free_before = cache.num_free_blocks
cache.free("carol")
print(f"free carol: {cache.num_free_blocks - free_before} block(s) returned (the shared one is still used by carol_2)")

alloc = BlockAllocator(4)
b = alloc.allocate(); alloc.incref(b)
alloc.free(b); print("allocator: refcount after one free:", alloc.refcount(b), "| free blocks:", alloc.num_free)
alloc.free(b); print("after the second free:", alloc.num_free, "free blocks")

# %% [markdown]
# **Predict, then run.** A sequence of 35 tokens in blocks of 16 is forked into 4 children, and every child
# appends 20 tokens. How many **copies** of an existing block does that take in total? (Count blocks that get
# a new physical home with old data in them, not fresh blocks for new tokens.)

# %%
guess = None  # your answer, a number of block copies
demo = PagedKVCache(num_blocks=64, block_size=16, n_kv_heads=1, head_dim=4)
demo.add_sequence("p")
ex_rng = np.random.default_rng(8)                         # its own generator: later cells draw as before
demo.append("p", ex_rng.standard_normal((35, 1, 4)), ex_rng.standard_normal((35, 1, 4)))
parent_blocks = set(demo.block_table("p").tolist())
copies = 0
for c in range(4):
    demo.fork("p", f"c{c}")
    demo.append(f"c{c}", ex_rng.standard_normal((20, 1, 4)), ex_rng.standard_normal((20, 1, 4)))
    k_child, _ = demo.gather(f"c{c}")
    new = [b for b in demo.block_table(f"c{c}").tolist()[:3] if b not in parent_blocks]
    copies += len(new)                                    # the child's own copy of a shared block
    assert np.array_equal(k_child[:35], demo.gather("p")[0])
check_guess(guess, copies, rel=0, what="block copies for 4 forks x 20 appended tokens")

# %% [markdown]
# ## 4. Attention with a virtualised KV cache
#
# `paged_attention` computes one decode step for a batch of sequences: (1) fetch the non-contiguous KV blocks
# using the block table, (2) apply attention on the fly. Because attention is associative and commutative
# (lecture 7), the blocks can be attended in any order and grouping — a GPU kernel processes them block by block
# with the online-softmax merge, never assembling a contiguous copy. The result equals attention over the
# gathered, contiguous K/V:

# %%
seqs = ["alan", "bob", "carol_2"]
tables, lens = cache.block_tables(seqs)
q = rng.standard_normal((3, 4, 8))                       # 4 query heads over 2 kv heads (GQA)
o = paged_attention(q, cache.k_cache, cache.v_cache, tables, lens)
print("block tables (padded with -1):\n", tables, "\nseq_lens:", lens)
for i, s in enumerate(seqs):
    k, v = cache.gather(s)                               # (T, Hkv, d) contiguous copies
    ref = attention(q[i][:, None, :], k.transpose(1, 0, 2), v.transpose(1, 0, 2))[:, 0]
    print(f"{s:8s}: max |paged - contiguous| = {np.abs(o[i] - ref).max():.1e}")

# %% [markdown]
# ## 5. What paging buys
#
# With paging the waste per sequence stays below one block (here 16 slots) at every step of the simulation —
# against hundreds to thousands of slots for the contiguous policies — so far more sequences run concurrently:

# %%
fig, ax = plt.subplots(1, 2, figsize=(9, 3))
for name, r in reports.items():
    t = r.trace
    ax[0].plot(t["running"], label=name, lw=1)
    ax[1].semilogy(np.maximum(t["max_waste"], 0.5), label=name, lw=1)
ax[0].set_xlabel("step"); ax[0].set_ylabel("running sequences"); ax[0].legend(fontsize=7)
ax[1].axhline(16, color="k", ls=":", label="block size 16")
ax[1].set_xlabel("step"); ax[1].set_ylabel("max waste per sequence (slots)"); ax[1].legend(fontsize=7)
for a in ax:
    a.xaxis.set_major_locator(plt.MaxNLocator(4))
plt.tight_layout()
print("paged: max waste per sequence over the whole run:", reports["paged"].max_waste_per_seq, "< block size 16;",
      f"concurrency {reports['paged'].mean_concurrency / reports['static'].mean_concurrency:.1f}x the static policy")
print("steps to serve the same 300 requests:", {name: r.steps for name, r in reports.items()})

# %% [markdown]
# Smaller blocks waste less but make the attention kernel gather more, smaller pieces (and longer block tables);
# vLLM uses 16 tokens. The course's GPU kernel `reference.triton.paged_decode` reads K/V through the block table
# inside the split-KV decode kernel of lecture 7; the course's bar (docs/design.md §7) asks it to stay within 0.9x
# the contiguous kernel's speed at block size 16. The simulator first, then the GPU
# measurement if `benchmarks/results/<gpu>-decode.json` exists.
#
# **Predict, then run.** With block size 64, what is the most slots one sequence can waste at any moment?

# %%
guess = None  # your answer, a number of slots
check_guess(guess, fr.simulate(reqs, "paged", pool_tokens=12000, block_size=64).max_waste_per_seq, rel=0,
            what="max waste per sequence at block size 64")
for bs in (1, 4, 16, 64, 256):
    r = fr.simulate(reqs, "paged", pool_tokens=12000, block_size=bs)
    print(f"block size {bs:3d}: utilisation {r.utilisation:5.1%}, internal fragmentation "
          f"{r.breakdown['internal_fragmentation']:5.1%}, max waste/seq {r.max_waste_per_seq:3d}, "
          f"preemptions {r.preemptions}")

# %%
decode = load_results("*-decode.json")
if not decode:
    print("GPU decode benchmark: benchmarks/results/<gpu>-decode.json is not there yet -- not run on this checkout, "
          "so no GPU numbers are shown (none are invented).")
for path, r in decode:
    rows = [x for x in r.get("paged", []) if x.get("ms_graph")]
    gpu_name = r.get("meta", {}).get("gpu", path.stem)
    configs = sorted({(x["batch"], x["context"]) for x in rows})
    sizes = sorted({x["block_size"] for x in rows if "block_size" in x})
    fig, ax = plt.subplots(figsize=(7, 3))
    width = 0.8 / max(1, len(sizes))
    for i, bs in enumerate(sizes):
        vals = [next((x["vs_contiguous_graph"] for x in rows if x.get("block_size") == bs
                      and (x["batch"], x["context"]) == c), np.nan) for c in configs]
        ax.bar(np.arange(len(configs)) + i * width, vals, width, label=f"block size {bs}")
    ax.axhline(0.9, color="k", ls=":", label="docs/design.md §7 bar (block size 16)")
    ax.set_xticks(np.arange(len(configs)) + width * (len(sizes) - 1) / 2)
    ax.set_xticklabels([f"B={b}\nN={n // 1024}k" for b, n in configs])
    ax.set_ylabel("speed vs contiguous"); ax.set_ylim(0, 1.15); ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"benchmarks/results/{path.name}: paged decode on {gpu_name} (CUDA-graph GPU time)")
    plt.tight_layout()
    for x in rows:
        if x.get("block_size") == 16:
            print(f"{gpu_name}: B={x['batch']:2d} N={x['context']:6d} block size 16: {x['vs_contiguous_graph']:.2f}x the "
                  f"contiguous kernel's speed, {x['frac_copy_bw_graph']:.0%} of copy bandwidth")

# %% [markdown]
# ## Summary of the course's attention optimisations (seeds)
#
# * **FlashInfer / recursive attention**: incremental, divide-and-conquer attention (lecture 7);
# * **FlashAttention**: tiling to reduce GPU global memory access (lectures 2–6);
# * **Autoregressive decoding**: prefill and decode phases, KV cache (lecture 7);
# * **Flash-Decoding**: more parallelism by splitting keys/values (lecture 7);
# * **PagedAttention**: paging and virtualisation to cut the KV cache's memory waste (this lecture).
