# %% [markdown]
# # Assignment 4 -- the KV cache and Flash-Decoding
#
# A language model generates text in two phases.
#
# * **Prefill** (iteration 0) processes all prompt tokens at once: `Nq = Nk = prompt length`, a big matrix
#   multiply per head -- FlashAttention's home ground (one program per block of queries).
# * **Decode** (every later iteration) processes **one** new token: `Nq = 1`, attending to the keys and values
#   of all previous tokens. Recomputing those from scratch every step would cost $O(N^2)$ per step, so they are
#   kept in a **KV cache** and the step only appends one row to it.
#
# A decode step reads the whole cache to produce one output row per head: it is memory-bound, and
# FlashAttention's parallelisation over *queries* has nothing to split (one query). With batch 1 and 8 kv
# heads, that is 8 programs for a GPU with 132 SMs. **Flash-Decoding** splits the *keys/values* instead:
#
# 1. split the cached keys/values into chunks,
# 2. attend the query to each chunk independently (in parallel), keeping each chunk's `(o, lse)`,
# 3. reduce over the chunks with the merge rule of assignment 1 (attention is associative and commutative).
#
# You will write `flash_decoding(q, k, v, num_splits=4, seq_lens=None, scale=None) -> (o, lse)` in NumPy and
# `flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None) -> o` in Triton.
#
# **Layout.** `q (B, Hq, d)` -- one new token per sequence; `k, v (B, Hkv, Nmax, d)` -- a batch of caches padded
# to `Nmax`; `seq_lens (B,)` integers (sequence `b` uses keys `[0, seq_lens[b])`, `None` = all `Nmax`; a length
# of 0 gives `o = 0`, `lse = -inf`). GQA: query head `h` reads kv head `h // (Hq // Hkv)`. With `Nq = 1` the
# bottom-right causal mask lets the query see every key, so there is no `causal` argument.
# Forbidden: `scipy`, `scaled_dot_product_attention`, softmax library calls, `flash_attn`, the `reference`
# package; the NumPy function must not use deep-learning frameworks at all.

# %% given="numpy_helpers"

# %%
def check_decode_inputs(q, k, v, seq_lens):
    """Given: validate ``q (B, Hq, d)``, ``k, v (B, Hkv, Nmax, d)``, ``seq_lens``; return ``(group, lens)``.

    ``lens`` is a ``(B,)`` int64 array (all ``Nmax`` when ``seq_lens`` is None).
    """
    if q.ndim != 3 or k.ndim != 4 or k.shape != v.shape:
        raise ValueError(f"expected q (B, Hq, d) and k, v (B, Hkv, Nmax, d), got q {q.shape}, k {k.shape}, "
                         f"v {v.shape}")
    (B, Hq, d), (Bk, Hkv, nmax, dk) = q.shape, k.shape
    if Bk != B or dk != d or Hkv == 0 or Hq % Hkv or nmax == 0:
        raise ValueError(f"q {q.shape} and k {k.shape} must share B and d, with Hq % Hkv == 0 and Nmax >= 1")
    if seq_lens is None:
        return Hq // Hkv, np.full(B, nmax, dtype=np.int64)
    lens = np.asarray(seq_lens)
    if lens.dtype.kind not in "iu" or lens.shape != (B,) or (lens < 0).any() or (lens > nmax).any():
        raise ValueError(f"seq_lens must be {B} integers in [0, {nmax}], got {seq_lens!r}")
    return Hq // Hkv, lens.astype(np.int64)


# %% [markdown]
# ## Warm-up (ungraded) -- a KV cache and the cost of a decode step
#
# The cache is pre-allocated for the maximum length and filled left to right; a decode step appends one key
# and value per head and attends over the filled part. Count what a step costs: it reads
# `2 * Hkv * N * d` cached numbers to do about `4 * Hq * N * d` FLOPs -- `2 * Hq / Hkv` FLOPs per cached number,
# so `Hq / Hkv` FLOPs per byte of a 2-byte (fp16/bf16) cache: 1 without GQA, 4 at Hq = 32, Hkv = 8 -- far below
# the ~300 FLOPs/byte an H100 needs to be compute-bound. Prefill does the same reads for `N` queries
# at once. Run the cell to see the arithmetic intensity of both phases.

# %% tags=["skip"]
class KVCache:
    """A pre-allocated contiguous cache for one sequence: ``(Hkv, max_len, d)`` keys and values."""

    def __init__(self, n_kv_heads, max_len, d, dtype=np.float32):
        self.k = np.zeros((n_kv_heads, max_len, d), dtype)
        self.v = np.zeros((n_kv_heads, max_len, d), dtype)
        self.len = 0

    def append(self, k, v):  # k, v: (Hkv, T, d)
        t = k.shape[1]
        self.k[:, self.len:self.len + t], self.v[:, self.len:self.len + t] = k, v
        self.len += t
        return self.k[:, :self.len], self.v[:, :self.len]


cache = KVCache(n_kv_heads=8, max_len=4096, d=128)
rng = np.random.default_rng(0)
cache.append(rng.standard_normal((8, 1000, 128)), rng.standard_normal((8, 1000, 128)))  # prefill
k_all, v_all = cache.append(rng.standard_normal((8, 1, 128)), rng.standard_normal((8, 1, 128)))  # one step
print("filled:", cache.len, "tokens; cache view", k_all.shape)
for phase, nq in (("prefill", 1000), ("decode", 1)):
    flops = 4 * 32 * nq * cache.len * 128  # Hq = 32 query heads share the 8 kv heads
    bytes_ = 2 * (2 * 8 * cache.len * 128 + 2 * 32 * nq * 128)  # fp16 K, V read + Q read, O write
    print(f"{phase:8s}: {flops / bytes_:7.1f} FLOPs per byte")

# %% [markdown]
# ## Part 1 -- Flash-Decoding in NumPy
#
# Cut the key axis `[0, Nmax)` into `num_splits` chunks of `ceil(Nmax / num_splits)` keys (the last ones may be
# shorter or **empty** when `num_splits > Nmax`). For each chunk, in a loop (on a GPU these run in parallel):
# scores `scale * q k^T` for all batches and heads at once, keys at positions `>= seq_lens[b]` masked to
# `-inf`, and the chunk's partial `(o_s, lse_s)` -- `o_s` normalised by the chunk's own sum. Then reduce:
#
# $$\mathrm{lse} = \log \sum_s e^{\mathrm{lse}_s},\qquad o = \sum_s e^{\mathrm{lse}_s - \mathrm{lse}}\, o_s .$$
#
# An empty chunk has `lse_s = -inf` and weight 0. Keep partials in float32 or wider. GQA: reshape `q` to
# `(B, Hkv, group, d)` so one kv head serves its `group` query heads. Return `o (B, Hq, d)` in `q`'s dtype and
# `lse (B, Hq)` float32 (float64 for float64 inputs).

# %%
def flash_decoding(q, k, v, num_splits=4, seq_lens=None, scale=None):
    """Flash-Decoding: attend one query per sequence to ``num_splits`` key chunks, then merge the (o, lse)."""
    q, k, v = as_float(q, "q"), as_float(k, "k"), as_float(v, "v")
    group, lens = check_decode_inputs(q, k, v, seq_lens)
    num_splits = positive_int(num_splits, "num_splits")
    B, Hq, d = q.shape
    Hkv, nmax = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    acc = np.result_type(np.float32, q.dtype, k.dtype, v.dtype)
    qg = q.astype(acc).reshape(B, Hkv, group, 1, d)  # one query row per head of the group
    ### BEGIN SOLUTION
    chunk = -(-nmax // num_splits)
    o_parts = np.zeros((num_splits, B, Hkv, group, d), dtype=acc)
    lse_parts = np.full((num_splits, B, Hkv, group), -np.inf, dtype=acc)
    for s in range(num_splits):  # stage 1: one chunk each (parallel on a GPU)
        j0, j1 = s * chunk, min((s + 1) * chunk, nmax)
        if j0 >= j1:
            continue  # empty chunk: o = 0, lse = -inf
        k_c = k[:, :, None, j0:j1].astype(acc)  # (B, Hkv, 1, c, d)
        v_c = v[:, :, None, j0:j1].astype(acc)
        scores = scale * (qg @ np.swapaxes(k_c, -1, -2))[..., 0, :]  # (B, Hkv, group, c)
        valid = np.arange(j0, j1)[None, :] < lens[:, None]  # (B, c)
        scores = np.where(valid[:, None, None, :], scores, -np.inf)
        m = scores.max(axis=-1)
        shift = np.where(np.isneginf(m), 0.0, m)
        p = np.exp(scores - shift[..., None])
        l = p.sum(axis=-1)
        seen = l > 0
        o_parts[s] = (p[..., None, :] @ v_c)[..., 0, :] / np.where(seen, l, 1.0)[..., None]
        lse_parts[s] = np.where(seen, shift + np.log(np.where(seen, l, 1.0)), -np.inf)
    # stage 2: reduce the partial states (assignment 1's merge, over all splits at once)
    m = lse_parts.max(axis=0)
    shift = np.where(np.isneginf(m), 0.0, m)
    w = np.exp(lse_parts - shift)  # (S, B, Hkv, group); 0 for empty chunks
    total = w.sum(axis=0)
    seen = total > 0
    o = (w[..., None] * o_parts).sum(axis=0) / np.where(seen, total, 1.0)[..., None]
    lse = np.where(seen, shift + np.log(np.where(seen, total, 1.0)), -np.inf)
    ### END SOLUTION
    lse_type = np.float64 if np.float64 in (q.dtype, k.dtype, v.dtype) else np.float32
    return o.reshape(B, Hq, d).astype(q.dtype), lse.reshape(B, Hq).astype(lse_type)


# %% tags=["check"]
from autograder.check import check

check("a4.flash_decoding", flash_decoding)

# %% [markdown]
# ## Part 2 -- Flash-Decoding in Triton
#
# Two kernels, as in the original Flash-Decoding:
#
# * `_decode_split_kernel`, grid `(B * Hkv, num_splits)`: program `(b*Hkv + hk, s)` loads the **whole GQA
#   group** of query heads of kv head `hk` as one `(BLOCK_G, d)` tile (`BLOCK_G >= 16` rows, padded and masked:
#   `tl.dot` needs at least 16 rows, and each K/V tile is then read once for the whole group), streams the
#   split's keys `[s*chunk, min((s+1)*chunk, seq_len))` in `BLOCK_N` tiles with the online softmax, and writes
#   `o_s` (normalised) and `lse_s` (base 2 is fine; `-inf` for an empty split) to float32 scratch buffers.
# * `merge_splits_kernel`, grid `(B * Hq,)`, **given** (the cell after the setup cell): merges the `num_splits`
#   partial states of one query head, the merge you wrote in NumPy in Part 1. Launch it with
#   `BLOCK_S >= num_splits` (a power of two, at least 2) after your split kernel.
#
# `flash_decode` picks `num_splits` when it is `None`: enough programs to fill the GPU (a few per SM), but no
# more splits than key tiles. The setup cell below is the same as in assignment 3 (interpreter switch, the
# `range()` fix and the `dot` helper).

# %% given="triton_setup"

# %% given="merge_splits"

# %% given="split_program"

# %%
def check_decode_tensors(q, k, v, seq_lens):
    """Given: validate torch inputs (same rules as ``check_decode_inputs``); return ``(B, Hq, Hkv, nmax, d)``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise TypeError(f"{name} must be a float16/bfloat16/float32 torch.Tensor, got {type(x).__name__}")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"expected q (B, Hq, d), k, v (B, Hkv, Nmax, d), got {tuple(q.shape)}, {tuple(k.shape)}")
    (B, Hq, d), (Bk, Hkv, nmax, dk) = q.shape, k.shape
    if Bk != B or dk != d or Hkv == 0 or Hq % Hkv or nmax == 0 or d not in (16, 32, 64, 128):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share B and d in (16, 32, 64, 128), "
                         "with Hq % Hkv == 0 and Nmax >= 1")
    if seq_lens is not None:
        if not isinstance(seq_lens, torch.Tensor) or seq_lens.dtype not in (torch.int32, torch.int64) \
                or tuple(seq_lens.shape) != (B,):
            raise TypeError(f"seq_lens must be an int32/int64 torch.Tensor of shape ({B},)")
        if seq_lens.numel() and (int(seq_lens.min()) < 0 or int(seq_lens.max()) > nmax):
            raise ValueError(f"seq_lens must lie in [0, {nmax}]")
    return B, Hq, Hkv, nmax, d


# %%
@triton.jit
def _decode_split_kernel(q_ptr, k_ptr, v_ptr, lens_ptr, o_part_ptr, lse_part_ptr,
                         sqb, sqh, skb, skh, skn, svb, svh, svn,
                         Hkv, group, nmax, num_splits, chunk, qk_scale,
                         HAS_LENS: tl.constexpr, D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stage 1: one (sequence, kv head, split); all query heads of the GQA group in one tile."""
    b, hk, split, heads, row_ok = split_program(Hkv, group, BLOCK_G)  # heads: the query heads of this kv head
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    ### BEGIN SOLUTION
    seq_len = nmax
    if HAS_LENS:
        seq_len = tl.load(lens_ptr + b).to(tl.int32)
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + heads[:, None] * sqh + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    k_base = k_ptr + b.to(tl.int64) * skb + hk * skh
    v_base = v_ptr + b.to(tl.int64) * svb + hk * svh
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + cols[:, None] * skn + offs_d[None, :], mask=cols[:, None] < end, other=0.0)
        v = tl.load(v_base + cols[:, None] * svn + offs_d[None, :], mask=cols[:, None] < end, other=0.0)
        s = tl.where(cols[None, :] < end, dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v)
        m_i = m_new
    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse2 = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))  # base 2
    row = (b.to(tl.int64) * Hkv * group + heads) * num_splits + split  # o_part (B, Hq, S, D)
    tl.store(o_part_ptr + row[:, None] * D + offs_d[None, :], o, mask=row_ok[:, None])
    tl.store(lse_part_ptr + row, lse2, mask=row_ok)
    ### END SOLUTION


def pick_num_splits(batch_kv_heads, nmax, block_n, device):
    """Heuristic: about two programs per SM, no more splits than key tiles (and at most 128)."""
    ### BEGIN SOLUTION
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(triton.cdiv(2 * sms, batch_kv_heads), triton.cdiv(nmax, block_n), 128))
    ### END SOLUTION


def flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None):
    """Flash-Decoding in Triton: split-KV attention of one query token per sequence, then a merge kernel."""
    B, Hq, Hkv, nmax, d = check_decode_tensors(q, k, v, seq_lens)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    BLOCK_N = 64
    if num_splits is None:
        num_splits = pick_num_splits(B * Hkv, nmax, BLOCK_N, q.device)
    num_splits = positive_int(num_splits, "num_splits")
    o = torch.empty((B, Hq, d), device=q.device, dtype=q.dtype)
    ### BEGIN SOLUTION
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    group = Hq // Hkv
    chunk = triton.cdiv(triton.cdiv(nmax, num_splits), BLOCK_N) * BLOCK_N  # splits start on tile boundaries
    o_part = torch.empty((B, Hq, num_splits, d), device=q.device, dtype=torch.float32)
    lse_part = torch.empty((B, Hq, num_splits), device=q.device, dtype=torch.float32)
    lens = seq_lens if seq_lens is not None else o_part  # any tensor: unused when HAS_LENS is False
    _decode_split_kernel[(B * Hkv, num_splits)](
        q, k, v, lens, o_part, lse_part, q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), Hkv, group, nmax, num_splits, chunk, scale * LOG2E.value,
        HAS_LENS=seq_lens is not None, D=d, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=BLOCK_N)
    merge_splits_kernel[(B * Hq,)](o_part, lse_part, o, num_splits, D=d,
                                   BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
    ### END SOLUTION
    return o


# %% tags=["check"]
from autograder.check import check

check("a4.flash_decode", flash_decode)

# %% [markdown]
# ## Part 3 (optional, 5 points) -- FlashAttention-3's LPT tile schedule
#
# Lecture 6: with a causal mask, query block `i` visits `i + 1` key blocks, so the tiles of a prefill have
# unequal costs. A persistent kernel (one resident program per SM) hands tiles to whichever SM frees up first;
# FlashAttention-3 first sorts them **longest processing time first** (LPT, Graham 1969), which keeps the long
# tiles from landing at the end. Write the schedule:
#
# `lpt_schedule(costs, n_workers) -> worker`: `costs` is a 1-D integer array (one cost per tile, in launch
# order); return an integer array `worker` of the same length, `worker[i]` = the worker (SM) that runs tile `i`.
# Rules, so that the answer is unique: take the tiles by cost, **longest first, equal costs in launch order**;
# give each to the worker that becomes **free first** (all are free at time 0), the **lowest-numbered** among
# workers free at the same time. `n_workers` must be a positive integer (else `ValueError`).
#
# Check it by hand on the lecture's example: 2 batches x 4 query blocks, costs `[1, 2, 3, 4, 1, 2, 3, 4]` on 3
# workers give per-worker work `[7, 7, 6]` (launch order would give `[9, 5, 6]`). A heap (`heapq`) of
# `(free time, worker)` pairs does the "free first, lowest index" rule in one line per tile.

# %%
import heapq


def lpt_schedule(costs, n_workers):
    """Longest-processing-time-first list schedule: the worker of every tile (ties: launch order, lowest worker)."""
    if isinstance(n_workers, bool) or not isinstance(n_workers, numbers.Integral) or n_workers < 1:
        raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
    costs = np.asarray(costs)
    ### BEGIN SOLUTION
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    free = [(0, w) for w in range(int(n_workers))]
    worker = np.zeros(len(costs), dtype=np.int64)
    for i in order:
        t, w = heapq.heappop(free)
        worker[i] = w
        heapq.heappush(free, (t + costs[i], w))
    return worker
    ### END SOLUTION


# %% tags=["check"]
check("a4.lpt_schedule", lpt_schedule)

# %% [markdown]
# ## Going further (ungraded, needs a GPU)
#
# * Time `flash_decode` for `B = 1`, `Hq = 32`, `Hkv = 8`, `d = 128`, `N = 64k` with `num_splits = 1` and with
#   your heuristic. Without splits only 8 programs run; the lecture reports up to 8x from splitting.
# * Compute the achieved bandwidth `(K and V bytes) / time` and compare it with a device-to-device copy.
