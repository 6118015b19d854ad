# %% [markdown]
# # Assignment 2 -- FlashAttention-2 in NumPy: tiles, `lse`, and a backward pass by recomputation
#
# Standard attention writes the $N \times N$ matrices $S = QK^T$ and $P = \mathrm{softmax}(S)$ to memory and
# reads them back: $O(N^2)$ memory and, on a GPU, $O(N^2)$ slow HBM traffic. FlashAttention never
# materialises them. It loads a block of queries and streams blocks of keys/values past it, keeping the
# online-softmax statistics of assignment 1 -- a running max $m$ and sum $\ell$ per row -- and a running,
# un-normalised output. The backward pass does not store $P$ either: it **recomputes** each tile of $P$ from
# $Q$, $K$ and the saved log-sum-exp $L$ (one number per row, $O(N)$ memory).
#
# You will write
# 1. `flash_attention_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64) -> (o, lse)`,
# 2. `flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, block_q=64, block_k=64)
#    -> (dq, dk, dv)`,
# 3. `forward_hbm_bytes(nq, nk, d, block_q=64, block_k=64, element_bytes=4, causal=False, order="fa2")
#    -> (2, 5)` int array: the HBM bytes your forward reads and writes per tensor, counted tile by tile.
#
# **Graded:** correctness against a float64 oracle on hidden cases (ragged `N` that is no multiple of the
# block sizes, `N = 1`, GQA, causal with `Nq != Nk` and fully masked rows, float16/32/64, large logits)
# **and memory**: the grader traces peak allocation and a solution that builds an `Nq x Nk` array loses the
# tiling points even when its numbers are right. At most one `block_q x block_k` tile of $S$/$P$ (per head)
# may exist at a time. Part 3's byte counts are graded exactly (integers). Points (110): forward 55 (5 of them
# for its CPU speed against the course's tiled forward), backward 45, byte counts 10. Do not use deep-learning frameworks, `scipy` or the course's `reference` package.
#
# Conventions are those of assignment 1: `q (..., Hq, Nq, d)`, `k, v (..., Hkv, Nk, d)`, bottom-right causal
# mask (row $i$ sees key $j$ iff $j \le i + N_k - N_q$), query head `h` reads kv head `h // (Hq // Hkv)`,
# outputs in the input dtype, `lse` float32 (float64 for float64 inputs), masked rows give `0` / `-inf`.

# %% given="numpy_helpers"

# %% given="check_qkv"

# %%
def gqa_views(x, group):
    """Given: a query-side array ``(..., Hq, N, e)`` viewed as ``(..., Hkv, group, N, e)``, no copy.

    A kv-side array ``(..., Hkv, N, e)`` is made to broadcast against it with ``kv[..., None, :, :]``.
    Rank-2 (single head) arrays are returned unchanged.
    """
    if x.ndim < 3:
        return x
    return x.reshape(x.shape[:-3] + (x.shape[-3] // group, group) + x.shape[-2:])


def kv_view(x):
    """Given: ``(..., Hkv, N, d)`` -> ``(..., Hkv, 1, N, d)`` so it broadcasts over the query group axis."""
    return x if x.ndim < 3 else x[..., None, :, :]


# %% [markdown]
# ## Part 1 -- the tiled forward pass (FlashAttention-2, Algorithm 1)
#
# For every query block $Q_i$ ($B_r$ = `block_q` rows), initialise $O_i = 0$, $\ell_i = 0$, $m_i = -\infty$
# (line 5), then for every key block $K_j, V_j$ ($B_c$ = `block_k` rows):
#
# | line | on chip |
# |---|---|
# | 8 | $S_i^{(j)} = \mathrm{scale}\cdot Q_i K_j^T$ (a $B_r \times B_c$ tile; apply the causal mask here) |
# | 9 | $m_i^{(j)} = \max(m_i^{(j-1)}, \mathrm{rowmax}(S_i^{(j)}))$, $\tilde P = e^{S_i^{(j)} - m_i^{(j)}}$, $\ell_i^{(j)} = e^{m_i^{(j-1)} - m_i^{(j)}}\ell_i^{(j-1)} + \mathrm{rowsum}(\tilde P)$ |
# | 10 | $O_i^{(j)} = \mathrm{diag}(e^{m_i^{(j-1)} - m_i^{(j)}})\, O_i^{(j-1)} + \tilde P V_j$ |
#
# and after the last key block: $O_i = \mathrm{diag}(\ell_i)^{-1} O_i$ (line 12), $L_i = m_i + \log \ell_i$
# (line 13). FA2's trick over FA1 is visible at line 10: the division by $\ell$ happens **once**, at the end.
#
# Details that the hidden tests probe:
# * The last query/key block is shorter when `N` is not a multiple of the block size.
# * With `causal=True`, key blocks entirely to the right of a query block's last allowed key can be
#   *skipped* (that is where causal attention saves half the work). Only tiles that straddle the
#   diagonal need the element-wise mask.
# * While a row has seen only masked keys, $m = -\infty$ and $e^{m - m} = e^{-\infty + \infty}$ is NaN:
#   subtract $0$ instead of $-\infty$ for such rows. A row that never sees a key ends with $\ell = 0$:
#   output `0`, `lse = -inf`.
# * GQA: use `gqa_views(q, group)` and `kv_view(k)` so each kv head is read once by its `group` query heads
#   (no `np.repeat` needed).

# %%
def flash_attention_forward(q, k, v, causal=False, scale=None, block_q=64, block_k=64):
    """FlashAttention-2 forward (Algorithm 1): tile by tile, never more than one block_q x block_k tile of S/P.

    Returns ``(o, lse)`` with ``o`` like ``q`` and ``lse`` of shape ``q.shape[:-1]`` (natural log).
    """
    q, k, v, group = check_qkv(q, k, v)
    block_q, block_k = positive_int(block_q, "block_q"), positive_int(block_k, "block_k")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    nq, nk = q.shape[-2], k.shape[-2]
    acc = acc_dtype(q, k, v)
    qg, kg, vg = gqa_views(q, group), kv_view(k), kv_view(v)
    o = np.zeros(qg.shape, dtype=acc)
    lse = np.full(qg.shape[:-1], -np.inf, dtype=acc)
    ### BEGIN SOLUTION
    offset = nk - nq  # bottom-right causal alignment: row i sees keys j <= i + offset
    for i0 in range(0, nq, block_q):  # line 3
        i1 = min(i0 + block_q, nq)
        q_i = qg[..., i0:i1, :].astype(acc)  # line 4
        m = np.full(q_i.shape[:-1], -np.inf, dtype=acc)  # line 5
        l = np.zeros(q_i.shape[:-1], dtype=acc)
        o_i = np.zeros(q_i.shape, dtype=acc)
        k_end = min(nk, i1 + offset) if causal else nk  # keys past the tile's last allowed key are skipped
        for j0 in range(0, max(k_end, 0), block_k):  # line 6
            j1 = min(j0 + block_k, nk)
            k_j, v_j = kg[..., j0:j1, :].astype(acc), vg[..., j0:j1, :].astype(acc)  # line 7
            s = scale * (q_i @ np.swapaxes(k_j, -1, -2))  # line 8
            if causal and j1 - 1 > i0 + offset:  # tile straddles the diagonal
                allowed = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None] + offset
                s = np.where(allowed, s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))  # line 9
            shift = np.where(np.isneginf(m_new), 0.0, m_new)
            p = np.exp(s - shift[..., None])
            alpha = np.exp(m - shift)
            l = alpha * l + p.sum(axis=-1)
            o_i = alpha[..., None] * o_i + p @ v_j  # line 10
            m = m_new
        seen = l > 0  # rows that attended at least one key
        o[..., i0:i1, :] = o_i / np.where(seen, l, 1.0)[..., None]  # line 12
        lse[..., i0:i1] = np.where(seen, m + np.log(np.where(seen, l, 1.0)), -np.inf)  # line 13
    ### END SOLUTION
    return o.reshape(q.shape).astype(q.dtype), lse.reshape(q.shape[:-1]).astype(lse_dtype(q, k, v))


# %% tags=["check"]
from autograder.check import check

check("a2.flash_attention_forward", flash_attention_forward)

# %% [markdown]
# ### How much memory did that save? (ungraded)
#
# `tracemalloc` sees NumPy's allocations. Standard attention needs $N^2$ floats for $S$ alone; the tiled
# forward needs $O(Nd)$ for inputs and outputs plus one tile.

# %% tags=["skip"]
import tracemalloc

try:
    rng = np.random.default_rng(0)
    n, d = 2048, 64
    q, k, v = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(3))
    tracemalloc.start()
    flash_attention_forward(q, k, v)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"N={n}: tiled forward peak {peak / 2**20:.1f} MiB; one N x N float32 matrix is "
          f"{n * n * 4 / 2**20:.0f} MiB")
except NotImplementedError as e:
    tracemalloc.stop()
    print("not implemented yet:", e)

# %% [markdown]
# ## Part 2 -- the backward pass with recomputation (FlashAttention-2, Algorithm 2)
#
# With $S = \mathrm{scale}\cdot QK^T$, $P = \mathrm{softmax}(S)$, $O = PV$ and the upstream gradient
# $dO$, the chain rule gives
#
# $$dV = P^T dO,\qquad dP = dO\, V^T,\qquad dS = P \circ (dP - D),\qquad
# dQ = \mathrm{scale}\cdot dS\, K,\qquad dK = \mathrm{scale}\cdot dS^T Q,$$
#
# where $D_i = \sum_j P_{ij}\, dP_{ij} = \mathrm{rowsum}(dO \circ O)_i$ -- the second form needs only $O$ and
# $dO$, so compute $D$ once, before the loops. The forward saved $L = m + \log \ell$, so any tile of $P$ is
# recomputed exactly as $P_{ij} = e^{S_{ij} - L_i}$ without another max/sum pass ($S$ includes the scale;
# $\ell$ vs $L$, natural log vs base 2: the conventions box of
# [lecture 4](../../lectures/04_backward_recomputation.ipynb#conventions)).
#
# FA2 loops over **key blocks outside** and query blocks inside: $dK_j$ and $dV_j$ accumulate in registers
# for one key block, while $dQ_i$ is accumulated across key blocks (here simply `dq[..., rows, :] += ...`; GPU
# kernels use atomic adds or a separate dQ pass, lecture 4 section 3). With causal masking, skip the query
# blocks that cannot see the key block.
# Rows with $L = -\infty$ saw no key: their $P$ row is 0. For GQA, the gradient of a kv head is the **sum**
# over the query heads that read it.
#
# Memory is graded here too: $O(Nd)$, one tile of $P$/$dS$ at a time.

# %%
def flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, block_q=64, block_k=64):
    """FlashAttention-2 backward (Algorithm 2): recompute P = exp(S - L) tile by tile, D = rowsum(dO * O).

    Returns ``(dq, dk, dv)`` with the shapes and dtypes of ``q``, ``k``, ``v``.
    """
    q, k, v, group = check_qkv(q, k, v)
    o, lse, do = as_float(o, "o"), as_float(lse, "lse"), as_float(do, "do")
    if o.shape != q.shape or do.shape != q.shape or lse.shape != q.shape[:-1]:
        raise ValueError(f"o and do must have q's shape {q.shape} and lse {q.shape[:-1]}, got o {o.shape}, "
                         f"do {do.shape}, lse {lse.shape}")
    block_q, block_k = positive_int(block_q, "block_q"), positive_int(block_k, "block_k")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    nq, nk = q.shape[-2], k.shape[-2]
    acc = acc_dtype(q, k, v, o, do)
    qg, dog, kg, vg = gqa_views(q, group), gqa_views(do, group), kv_view(k), kv_view(v)
    dq = np.zeros(qg.shape, dtype=acc)
    dk = np.zeros(qg.shape[:-2] + (nk, q.shape[-1]), dtype=acc)  # per query head; summed over the group below
    dv = np.zeros(qg.shape[:-2] + (nk, v.shape[-1]), dtype=acc)
    ### BEGIN SOLUTION
    d_row = gqa_views(np.sum(do.astype(acc) * o.astype(acc), axis=-1, keepdims=True), group)  # D = rowsum(dO * O)
    # A row that saw no key has L = -inf; using +inf makes exp(S - L) = 0 there instead of inf.
    lse_g = gqa_views(np.where(np.isneginf(lse), np.inf, lse).astype(acc)[..., None], group)
    offset = nk - nq
    for j0 in range(0, nk, block_k):  # outer loop over key blocks
        j1 = min(j0 + block_k, nk)
        k_j, v_j = kg[..., j0:j1, :].astype(acc), vg[..., j0:j1, :].astype(acc)
        dk_j = np.zeros(dk[..., j0:j1, :].shape, dtype=acc)
        dv_j = np.zeros(dv[..., j0:j1, :].shape, dtype=acc)
        i_start = max(0, j0 - offset) // block_q * block_q if causal else 0  # earlier rows cannot see key j0
        for i0 in range(i_start, nq, block_q):
            i1 = min(i0 + block_q, nq)
            q_i, do_i = qg[..., i0:i1, :].astype(acc), dog[..., i0:i1, :].astype(acc)
            s = scale * (q_i @ np.swapaxes(k_j, -1, -2))
            if causal and j1 - 1 > i0 + offset:
                allowed = np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None] + offset
                s = np.where(allowed, s, -np.inf)
            p = np.exp(s - lse_g[..., i0:i1, :])  # recomputed from L, no max/sum pass
            dv_j += np.swapaxes(p, -1, -2) @ do_i  # dV = P^T dO
            dp = do_i @ np.swapaxes(v_j, -1, -2)  # dP = dO V^T
            ds = p * (dp - d_row[..., i0:i1, :])  # dS = P o (dP - D)
            dq[..., i0:i1, :] += scale * (ds @ k_j)  # dQ = scale dS K
            dk_j += scale * (np.swapaxes(ds, -1, -2) @ q_i)  # dK = scale dS^T Q
        dk[..., j0:j1, :] = dk_j
        dv[..., j0:j1, :] = dv_j
    ### END SOLUTION
    if q.ndim >= 3:  # GQA: a kv head's gradient sums over the query heads of its group
        dk, dv = dk.sum(axis=-3), dv.sum(axis=-3)
    return dq.reshape(q.shape).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# %% tags=["check"]
from autograder.check import check

check("a2.flash_attention_backward", flash_attention_backward)

# %% [markdown]
# ## Part 3 -- how many HBM bytes does your forward move?
#
# Lecture 2 modelled a GPU as a small on-chip SRAM next to a large, slow HBM and counted, for the GPT-2 medium
# configuration, **40.3 GB** of HBM traffic for standard attention against **4.6 GB** for FlashAttention
# (the FlashAttention paper's table says 40.3 vs 4.4), and a traffic of $\Theta(N^2 d^2 / M)$ for an SRAM of
# $M$ bytes. Here you count the bytes of *your* forward, one tile at a time, and recover both.
#
# Your NumPy forward has no SRAM, but its loop is a GPU kernel's: every slice `q[..., i0:i1, :]`,
# `k[..., j0:j1, :]` is a load from HBM into SRAM, every `o[..., i0:i1, :] = ...` a store, and everything
# else (the $S$ tile, $\tilde P$, the running $m$, $\ell$, $O_i$) lives on chip. Write a **counting twin** of
# your forward: the same loops, with the arithmetic replaced by byte counts.
#
# `forward_hbm_bytes(nq, nk, d, block_q=64, block_k=64, element_bytes=4, causal=False, order="fa2")` returns an
# integer array of shape `(2, 5)`: row 0 the bytes **read** from HBM, row 1 the bytes **written**; columns
# `Q, K, V, O, stats` (`HBM_TENSORS`). $Q, K, V, O$ elements take `element_bytes` each; the row statistics
# (FA2's $L$; FA1's $\ell$ and $m$) are fp32: **4 bytes** per row and statistic whatever the element size.
# One head; `d` is the head dimension of $Q$, $K$, $V$ and $O$.
#
# | `order` | loop | what moves (algorithm lines) |
# |---|---|---|
# | `"fa2"` (your Part 1 forward, FA2 Algorithm 1) | query blocks outer, key blocks inner | $Q_i$ loaded once per query block (line 4, even if the block then sees no key); $K_j$, $V_j$ loaded once per **visited** tile $(i, j)$ (line 7); $O_i$ and $L_i$ written once per query block (lines 14-15, also for a block that saw no key) |
# | `"fa1"` (FlashAttention-1, Algorithm 1) | key blocks outer, query blocks inner | $O = 0$, $\ell = 0$, $m = -\infty$ written to HBM first (line 2); $K_j$, $V_j$ loaded once per key block (line 6); per visited tile: $Q_i$, $O_i$, $\ell_i$, $m_i$ read (line 8) and $O_i$, $\ell_i$, $m_i$ written back (lines 12-13) |
#
# With `causal=True` a tile is visited iff it has at least one allowed key: its first key $j_0 \le$ the last
# allowed key of its last row, $i_1 - 1 + N_k - N_q$ (your Part 1 skipping rule). Skipped tiles move nothing.
# Blocks are ragged at the end as in Part 1. Graded exactly (integers), in both orders.

# %%
HBM_TENSORS = ("Q", "K", "V", "O", "stats")
STATS_BYTES = 4  # l, m, L: fp32


def forward_hbm_bytes(nq, nk, d, block_q=64, block_k=64, element_bytes=4, causal=False, order="fa2"):
    """HBM bytes of the tiled forward for one head: ``(2, 5)`` int64, rows (read, written), columns
    ``HBM_TENSORS``. ``order="fa2"``: FA2 Algorithm 1 (lines 4, 7, 14-15); ``"fa1"``: FA1 Algorithm 1
    (lines 2, 6, 8, 12-13)."""
    nq, nk, d = positive_int(nq, "nq"), positive_int(nk, "nk"), positive_int(d, "d")
    block_q, block_k = positive_int(block_q, "block_q"), positive_int(block_k, "block_k")
    element_bytes = positive_int(element_bytes, "element_bytes")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if order not in ("fa2", "fa1"):
        raise ValueError(f"order must be 'fa2' or 'fa1', got {order!r}")
    moved = np.zeros((2, len(HBM_TENSORS)), dtype=np.int64)
    READ, WRITE = 0, 1
    Q, K, V, O, STATS = range(len(HBM_TENSORS))
    row = d * element_bytes  # bytes of one row of Q, K, V or O
    ### BEGIN SOLUTION
    offset = nk - nq
    if order == "fa2":
        for i0 in range(0, nq, block_q):
            i1 = min(i0 + block_q, nq)
            moved[READ, Q] += (i1 - i0) * row  # line 4
            k_end = min(nk, i1 + offset) if causal else nk  # the same skipping rule as the forward
            for j0 in range(0, max(k_end, 0), block_k):
                j1 = min(j0 + block_k, nk)
                moved[READ, K] += (j1 - j0) * row  # line 7: K_j and V_j again for every query block
                moved[READ, V] += (j1 - j0) * row
            moved[WRITE, O] += (i1 - i0) * row  # line 14
            moved[WRITE, STATS] += (i1 - i0) * STATS_BYTES  # line 15: L_i
    else:
        moved[WRITE, O] += nq * row  # line 2: O = 0, l = 0, m = -inf in HBM
        moved[WRITE, STATS] += 2 * nq * STATS_BYTES
        for j0 in range(0, nk, block_k):
            j1 = min(j0 + block_k, nk)
            moved[READ, K] += (j1 - j0) * row  # line 6: K_j, V_j once
            moved[READ, V] += (j1 - j0) * row
            for i0 in range(0, nq, block_q):
                i1 = min(i0 + block_q, nq)
                if causal and j0 > i1 - 1 + offset:
                    continue
                moved[READ, Q] += (i1 - i0) * row  # line 8: Q_i, O_i, l_i, m_i
                moved[READ, O] += (i1 - i0) * row
                moved[READ, STATS] += 2 * (i1 - i0) * STATS_BYTES
                moved[WRITE, O] += (i1 - i0) * row  # lines 12-13: O_i, l_i, m_i back to HBM
                moved[WRITE, STATS] += 2 * (i1 - i0) * STATS_BYTES
    ### END SOLUTION
    return moved


# %% tags=["check"]
from autograder.check import check

check("a2.forward_hbm_bytes", forward_hbm_bytes)

# %% [markdown]
# ### Recover the lecture's numbers (ungraded)
#
# The cell below compares your counts with the course's IO model, `reference.simulators.iosim` (lecture 2; it ships with
# the course repository, not with the student release), in three steps:
#
# 1. **Same bytes.** One head, $N = 4096$, $d = 64$, fp16: your count and the model's, in both orders, each with
#    its own block sizes (`iosim.flash_block_sizes`: FA1's $B_c = \lceil M / 4d \rceil$, $B_r = \min(B_c, d)$;
#    FA2's $128 \times 128$).
# 2. **40 vs 4.6 GB.** GPT-2 medium (batch 64, 16 heads, $N = 1024$, $d = 64$, fp16, A100's 192 KiB SRAM): your
#    FA1-order forward for one head times $64 \cdot 16$ heads, plus the model's backward, against the model's
#    standard attention (forward + backward). Your FA2-order forward is shown next to it.
# 3. **The slope in $M$.** $N = 8192$, $d = 64$, fp16, $M$ from 8 to 128 KiB: your bytes vs $M$ on log-log axes.
#    **Predict first**: what slope does $\Theta(N^2 d^2 / M)$ give? And for your own (FA2) loop order, which
#    block must grow with $M$ for the law to hold: `block_q` or `block_k`?

# %% tags=["skip"]
try:
    from reference.simulators import iosim  # noqa: E402 -- the course's IO model (lecture 2)
except ImportError:
    iosim = None
    print("reference.simulators.iosim is not here (student release): run this cell in the course repository.")

if iosim is not None:
    import matplotlib.pyplot as plt

    try:
        n, d, e = 4096, 64, 2
        for order in ("fa2", "fa1"):  # 1. same bytes as the model
            bq, bk = iosim.flash_block_sizes(n, d, dtype="fp16", version=order)
            mine = forward_hbm_bytes(n, n, d, bq, bk, e, order=order)
            model = iosim.flash_attention_io(1, 1, n, d, dtype="fp16", version=order, block_q=bq, block_k=bk,
                                             backward=False)
            same = (mine[0].sum(), mine[1].sum()) == (model.bytes_read, model.bytes_written)
            print(f"{order}: blocks {bq}x{bk}: yours read {mine[0].sum() / 1e6:.2f} MB, wrote "
                  f"{mine[1].sum() / 1e6:.2f} MB; model {model.bytes_read / 1e6:.2f} / "
                  f"{model.bytes_written / 1e6:.2f} MB ({'equal' if same else 'DIFFERENT'})")

        cfg = iosim.SEEDS["config"]  # 2. the 40 vs 4.6 GB table
        shape, heads = (cfg["batch"], cfg["heads"], cfg["seq_len"], cfg["head_dim"]), cfg["batch"] * cfg["heads"]
        table = iosim.seeds_table(verbose=False)
        bq, bk = iosim.flash_block_sizes(cfg["seq_len"], cfg["head_dim"], dtype="fp16")
        fwd = heads * forward_hbm_bytes(cfg["seq_len"], cfg["seq_len"], cfg["head_dim"], bq, bk, e,
                                        order="fa1").sum()
        bwd = (iosim.flash_attention_io(*shape, dtype="fp16").hbm_bytes
               - iosim.flash_attention_io(*shape, dtype="fp16", backward=False).hbm_bytes)
        b2 = iosim.flash_block_sizes(cfg["seq_len"], cfg["head_dim"], dtype="fp16", version="fa2")
        fwd2 = heads * forward_hbm_bytes(cfg["seq_len"], cfg["seq_len"], cfg["head_dim"], *b2, e).sum()
        print(f"\nGPT-2 medium, forward + backward: standard attention {table['standard']['hbm_gb']:.1f} GB (model); "
              f"FlashAttention {(fwd + bwd) / 1e9:.2f} GB = your FA1-order forward {fwd / 1e9:.2f} GB "
              f"(blocks {bq}x{bk}) + the model's backward {bwd / 1e9:.2f} GB; the model alone "
              f"{table['flash']['hbm_gb']:.2f} GB; the paper: 40.3 vs 4.4 GB")
        print(f"your own loop order (FA2, {b2[0]}x{b2[1]} blocks) forward: {fwd2 / 1e9:.2f} GB "
              f"(K, V re-read {-(-cfg['seq_len'] // b2[0])} times)")

        sweep = iosim.scaling_sweep(verbose=False)["vs_sram"]  # 3. bytes vs SRAM size
        n, d, ms = sweep["seq_len"], sweep["head_dim"], sweep["sram_bytes"]
        fa1 = [forward_hbm_bytes(n, n, d, *iosim.flash_block_sizes(n, d, dtype="fp16", sram_bytes=m), e,
                                 order="fa1").sum() for m in ms]
        # your order: the query block (kept on chip for a whole inner loop) grows with M, as FA1's key block
        fa2 = [forward_hbm_bytes(n, n, d, iosim.flash_block_sizes(n, d, dtype="fp16", sram_bytes=m)[1], 64, e).sum()
               for m in ms]
        slopes = [np.polyfit(np.log(ms), np.log(np.asarray(b, float)), 1)[0] for b in (fa1, fa2)]
        print(f"\nlog-log slope of bytes vs M: FA1 order {slopes[0]:+.3f} (model {sweep['flash_slope']:+.3f}), "
              f"your order with block_q growing with M {slopes[1]:+.3f}; Theta(N^2 d^2 / M) predicts -1")
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.loglog(ms, np.asarray(fa1) / 1e6, "o-", label=f"yours, FA1 order (slope {slopes[0]:+.2f})")
        ax.loglog(ms, np.asarray(fa2) / 1e6, "s-", label=f"yours, FA2 order (slope {slopes[1]:+.2f})")
        ax.loglog(ms, np.asarray(sweep["flash_bytes"]) / 1e6, "k+", ms=12, label="IO model (lecture 2)")
        ax.set_xlabel("SRAM M (bytes)"); ax.set_ylabel("HBM MB, forward, one head"); ax.legend(fontsize=7)
        plt.tight_layout()
    except NotImplementedError as exc:
        print("not implemented yet:", exc)

# %% [markdown]
# ## Going further (ungraded)
#
# * Count the FLOPs: the backward recomputes $S$ and $P$, so it does more arithmetic than a backward that
#   stored $P$ -- yet on a GPU it is faster, because it moves far fewer bytes (the lecture's table: 75.2 vs
#   66.6 GFLOPs, but 4.4 GB vs 40.3 GB of HBM traffic, 7.3 ms vs 41.7 ms).
# * Time `flash_attention_forward` for `block_q = block_k` in {16, 32, 64, 128, 256} at `N = 4096`. In NumPy
#   small tiles lose to Python loop overhead and large tiles to cache misses; on a GPU the tile size is set by
#   the SRAM per streaming multiprocessor.
