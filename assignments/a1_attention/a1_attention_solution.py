# %% [markdown]
# # Assignment 1 -- attention from scratch, and the softmax tricks that make it fast
#
# You will write, in plain NumPy:
#
# 1. `safe_softmax` -- the max trick that keeps `exp` from overflowing,
# 2. `online_softmax` -- softmax in **one streaming pass** over blocks, keeping a running max and sum,
# 3. `merge_states` -- combine two partial attention results `(o, lse)` over disjoint key sets,
# 4. `attention` -- naive attention with a bottom-right causal mask and grouped-query attention (GQA).
#
# Parts 2 and 3 are the two ideas FlashAttention (assignment 2), Flash-Decoding (assignment 4) and
# PagedAttention (assignment 5) are built from.
#
# **How to work.** Fill in every `raise NotImplementedError(...)`. Run the cell tagged `check` under each
# function: it runs the visible test cases and prints a table (case, pass, relative error vs tolerance).
# The grader runs the same kind of cases plus hidden ones (ragged shapes, `N = 1`, GQA, causal with
# `Nq != Nk`, fully masked rows, large logits, float16). Do not use `scipy`, deep-learning frameworks, or
# the course's `reference` package: the grader flags them.
#
# **Conventions (used in every assignment).**
# * Shapes: single head `q (Nq, d)`, `k, v (Nk, d)`; multi-head `(B, H, N, d)`.
# * `scale` defaults to `1/sqrt(d)`; scores are `S = scale * q @ k^T`.
# * Outputs keep the input dtype; accumulate in at least float32. `lse` (log-sum-exp of a row of `S`, natural
#   log) is float32, or float64 for float64 inputs.
# * A row that may attend no key has output `0` and `lse = -inf`, **never NaN**.

# %% given="numpy_helpers"


# %%
def as_float_source(x, name):
    """Given: ``x`` itself when it has ``shape`` and ``dtype`` (an ndarray, or a read-only source that is read
    in slices ``x[..., s:e]``), else ``np.asarray(x)``; a TypeError naming the argument unless float16/32/64."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        x = np.asarray(x)
    if np.dtype(x.dtype) not in (np.float16, np.float32, np.float64):
        raise TypeError(f"{name} must be a float16/float32/float64 array, got dtype {x.dtype}")
    return x


# %% [markdown]
# ## Part 1 -- safe softmax
#
# $\mathrm{softmax}(x)_i = e^{x_i} / \sum_j e^{x_j}$ is fine on paper and broken in float16: the largest
# float16 is 65504, which is less than $e^{12} \approx 162755$, so any logit above ~11.09 turns into `inf`
# and the row into `inf / inf = nan`. The fix (from the lecture) subtracts the row maximum first:
#
# $$m(x) = \max_i x_i,\qquad f(x) = e^{x - m(x)},\qquad \ell(x) = \sum_i f(x)_i,\qquad
# \mathrm{softmax}(x) = f(x) / \ell(x).$$
#
# Every exponent is now $\le 0$. Softmax is shift-invariant, so the answer is unchanged.
#
# Implement `safe_softmax(x, axis=-1)`: accumulate in at least float32 and return `x.dtype`. A row that is
# entirely `-inf` (a fully masked attention row) must give zeros, not `nan` -- careful with `-inf - (-inf)`.

# %% tags=["skip"]
# Exploration (ungraded): watch float16 overflow.
print("e^11 in float16:", np.exp(np.float16(11.0)), "  e^12 in float16:", np.exp(np.float16(12.0)))
row = np.array([1.0, 12.0, 3.0], dtype=np.float16)
with np.errstate(over="ignore", invalid="ignore"):
    print("naive softmax of", row, "->", np.exp(row) / np.exp(row).sum())


# %%
def safe_softmax(x, axis=-1):
    """Softmax along ``axis`` with the max trick: f = exp(x - max x), softmax = f / sum f.

    Returns ``x.dtype``; all ``-inf`` rows give zeros.
    """
    x = as_float(x, "x")
    ### BEGIN SOLUTION
    xc = x.astype(acc_dtype(x))
    m = np.max(xc, axis=axis, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)  # all -inf row: exp(-inf - 0) = 0 instead of nan
    f = np.exp(xc - m)
    l = np.sum(f, axis=axis, keepdims=True)
    return (f / np.where(l == 0, 1.0, l)).astype(x.dtype)
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a1.safe_softmax", safe_softmax)

# %% [markdown]
# ## Part 2 -- online softmax: one pass, block by block
#
# The safe softmax reads the row three times (max, sum, normalise). A GPU kernel that sees the row one
# *block* at a time cannot know the global max in advance. The online softmax keeps a running max $m$ and a
# running sum $\ell$ **relative to that max**; when a new block raises the max, the old sum is rescaled:
#
# $$m^{new} = \max(m, \max_i x^{(b)}_i),\qquad
# \ell^{new} = e^{m - m^{new}}\,\ell + \sum_i e^{x^{(b)}_i - m^{new}}.$$
#
# This is the lecture's rule for the softmax of $[x^{(1)}\; x^{(2)}]$, applied block after block. After the
# pass, one more sweep writes $e^{x_i - m} / \ell$.
#
# Implement `online_softmax(x, block_size=128)` over the **last axis**: a loop over blocks of `block_size`
# columns (the last block may be shorter) that touches each block once to update `(m, l)`, then a second loop
# over the blocks that writes the normalised values into the output. Read `x` **only** as slices
# `x[..., s:s + block_size]`: the grader also hands you a read-only `x` (with `shape`, `dtype` and slicing, like
# a memory-mapped file too large for memory) that records every read, and a read of more than `block_size`
# columns at once, or `np.asarray(x)`, fails that test. Same dtype and `-inf` rules as Part 1; `block_size`
# must be a positive integer.

# %%
def online_softmax(x, block_size=128):
    """Softmax over the last axis in one streaming pass of blocks (running max m and sum l), then a second
    pass of blocks that normalises; ``x`` is read only as slices ``x[..., s:s + block_size]``.

    Update per block b (online normaliser): m' = max(m, max x_b), l' = exp(m - m') l + sum exp(x_b - m').
    """
    x = as_float_source(x, "x")
    block_size = positive_int(block_size, "block_size")
    ### BEGIN SOLUTION
    ct = acc_dtype(x)
    *rows, n = x.shape
    m = np.full(rows, -np.inf, dtype=ct)  # running max of each row
    l = np.zeros(rows, dtype=ct)          # running sum of exp(x - m) of each row
    for start in range(0, n, block_size):
        block = np.asarray(x[..., start:start + block_size], dtype=ct)
        m_new = np.maximum(m, block.max(axis=-1))
        shift = np.where(np.isneginf(m_new), 0.0, m_new)  # keep -inf - (-inf) out of exp
        l = np.exp(m - shift) * l + np.exp(block - shift[..., None]).sum(axis=-1)
        m = m_new
    shift = np.where(np.isneginf(m), 0.0, m)[..., None]
    denom = np.where(l == 0, 1.0, l)[..., None]
    out = np.empty(x.shape, dtype=x.dtype)
    for start in range(0, n, block_size):
        block = np.asarray(x[..., start:start + block_size], dtype=ct)
        out[..., start:start + block_size] = np.exp(block - shift) / denom
    return out
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a1.online_softmax", online_softmax)

# %% [markdown]
# ## Part 3 -- merging partial attention states (recursive attention)
#
# For a set $I$ of keys define the attention *state* of a query: its log-sum-exp
# $s(I) = \log \sum_{i\in I} e^{s_i}$ and its output $v(I) = \sum_{i \in I} e^{s_i - s(I)} v_i$. For two
# disjoint key sets $A$ and $B$ (lecture: "recursive attention", FlashInfer):
#
# $$s(A \cup B) = \log\left(e^{s(A)} + e^{s(B)}\right),\qquad
# v(A\cup B) = e^{s(A) - s(A\cup B)}\, v(A) + e^{s(B) - s(A \cup B)}\, v(B).$$
#
# So attention over *all* keys can be computed piece by piece, in any order, and combined -- the reason a
# long sequence can be split across thread blocks (Flash-Decoding) or stored in scattered pages
# (PagedAttention).
#
# Implement `merge_states(o_a, lse_a, o_b, lse_b) -> (o, lse)` with `o_* (..., N, d)` and `lse_* (..., N)`.
# Use the max trick again (never exponentiate a large `lse` directly). An empty key set has `lse = -inf`
# and contributes nothing; if **both** are empty the result is `o = 0`, `lse = -inf` (no NaN). Return `o` in
# the dtype of `o_a` and `lse` as float32 (float64 if any input is float64).

# %%
def merge_states(o_a, lse_a, o_b, lse_b):
    """Attention state of a union of two disjoint key sets from the states of the parts (recursive attention).

    lse = log(e^lse_a + e^lse_b);  o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b.
    """
    o_a, lse_a, o_b, lse_b = (as_float(a, n) for a, n in ((o_a, "o_a"), (lse_a, "lse_a"),
                                                          (o_b, "o_b"), (lse_b, "lse_b")))
    if o_a.shape != o_b.shape or lse_a.shape != o_a.shape[:-1] or lse_b.shape != o_a.shape[:-1]:
        raise ValueError(f"expected o_a, o_b (..., N, d) and lse_a, lse_b (..., N) of matching shapes, got "
                         f"{o_a.shape}, {lse_a.shape}, {o_b.shape}, {lse_b.shape}")
    ### BEGIN SOLUTION
    acc = acc_dtype(o_a, lse_a, o_b, lse_b)
    la, lb = lse_a.astype(acc), lse_b.astype(acc)
    m = np.maximum(la, lb)
    m = np.where(np.isneginf(m), 0.0, m)  # both empty: weights become exp(-inf) = 0
    wa, wb = np.exp(la - m), np.exp(lb - m)
    total = wa + wb
    with np.errstate(divide="ignore"):
        lse = m + np.log(total)  # log(0) = -inf for two empty sets
    total = np.where(total == 0, 1.0, total)
    o = (wa / total)[..., None] * o_a.astype(acc) + (wb / total)[..., None] * o_b.astype(acc)
    return o.astype(o_a.dtype), lse.astype(lse_dtype(o_a, lse_a, o_b, lse_b))
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a1.merge_states", merge_states)

# %% [markdown]
# ## Part 4 -- naive attention: causal mask and GQA
#
# $$O = \mathrm{softmax}\!\left(\mathrm{scale}\cdot QK^T\right) V$$
#
# **Causal mask, bottom-right aligned.** Query row $i$ of $N_q$ may attend key $j$ iff
# $j \le i + (N_k - N_q)$. With $N_q = N_k$ this is the usual lower triangle. With $N_q < N_k$ the queries
# are the *last* $N_q$ positions of the sequence (e.g. one decode step: $N_q = 1$ sees every key). With
# $N_q > N_k$ the first $N_q - N_k$ rows may attend nothing: their output is `0` and their `lse` is `-inf`.
#
# **GQA / MQA.** `q (..., Hq, Nq, d)` and `k, v (..., Hkv, Nk, d)` with `Hq % Hkv == 0`: query head `h` reads
# kv head `h // (Hq // Hkv)`. Rank-2 inputs are a single head.
#
# Implement `causal_mask(nq, nk)` (boolean, True where attending is allowed) and
# `attention(q, k, v, causal=False, scale=None, return_lse=False)`, returning `o` or `(o, lse)` with
# `lse (..., Hq, Nq)`. Bad shapes must raise `ValueError` naming the argument -- `check_qkv` below does that.

# %% given="check_qkv"

# %%
def causal_mask(nq, nk):
    """Boolean (nq, nk): True where query i may attend key j, i.e. j <= i + (nk - nq) (bottom-right)."""
    ### BEGIN SOLUTION
    return np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)
    ### END SOLUTION


def attention(q, k, v, causal=False, scale=None, return_lse=False):
    """softmax(scale * q k^T [masked]) v, materialising S and P. GQA: query head h reads kv head h // group."""
    q, k, v, group = check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ### BEGIN SOLUTION
    acc = acc_dtype(q, k, v)
    if group > 1:  # (..., Hkv, Nk, d) -> (..., Hq, Nk, d)
        k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    s = scale * (q.astype(acc) @ np.swapaxes(k.astype(acc), -1, -2))
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)  # fully masked row
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    o = (p / np.where(l == 0, 1.0, l)) @ v.astype(acc)
    with np.errstate(divide="ignore"):
        lse = (m + np.log(l))[..., 0]
    if return_lse:
        return o.astype(q.dtype), lse.astype(lse_dtype(q, k, v))
    return o.astype(q.dtype)
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a1.attention", attention)

# %% [markdown]
# ## Putting it together (ungraded)
#
# Attention over all keys equals the merge of attention over the first half and over the second half.
# This is the identity every later assignment relies on.

# %% tags=["skip"]
try:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 5, 16)) for _ in range(3))
    o_full = attention(q, k, v)
    o_a, lse_a = attention(q, k[:, :3], v[:, :3], return_lse=True)
    o_b, lse_b = attention(q, k[:, 3:], v[:, 3:], return_lse=True)
    o_merged, _ = merge_states(o_a, lse_a, o_b, lse_b)
    print("max |full - merged| =", np.abs(o_full - o_merged).max())
except NotImplementedError as e:
    print("not implemented yet:", e)
