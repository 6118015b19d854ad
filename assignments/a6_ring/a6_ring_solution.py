# %% [markdown]
# # Assignment 6 (optional) -- the merge step of ring attention
#
# Lecture 10 splits one long sequence across W devices. Each rank keeps the queries of its positions and a
# running attention state `(o, lse)`; at every ring step a chunk of keys and values from another rank visits,
# the rank attends its queries to it and **merges** the result into its state. After W steps every query has
# seen every key, and the state is exactly the attention over the whole sequence.
#
# You will write that step in NumPy:
#
# `ring_step(o, lse, q, k, v, q_pos, k_pos, causal=True, scale=None) -> (o, lse)`
#
# * `o (..., Hq, nq, d)`, `lse (..., Hq, nq)`: the rank's running state (float32, or float64). A row whose keys
#   so far were all invisible has `o = 0`, `lse = -inf` (the state before the first step is all such rows).
# * `q (..., Hq, nq, d)`: the rank's queries; `k, v (..., Hkv, nk, d)`: the visiting chunk (GQA: query head
#   `h` reads kv head `h // (Hq // Hkv)`), float16/32/64.
# * `q_pos (nq,)`, `k_pos (nk,)`: integer **global positions** of the queries and keys. With a zig-zag layout
#   a rank holds two separate pieces of the sequence, so positions are not one contiguous range.
# * `causal=True`: key at position `t` is visible to the query at position `p` iff `t <= p`.
#
# Return the merged state in the dtypes of `o` and `lse` (accumulate in at least float32). Watch the rows that
# see **none** of the visiting chunk: their state must come back unchanged (and stay `o = 0`, `lse = -inf` if
# it was empty) -- never NaN.
#
# **How to work.** Fill in the `raise NotImplementedError(...)` and run the `check` cell. Do not use `torch`,
# `scipy` or the course's `reference` package: the grader flags them. This assignment builds on `merge_states`
# from assignment 1 and on lecture 10.

# %%
import math

import numpy as np


def floats(**named):
    """Given: the named arguments as float16/32/64 ndarrays, in order; a TypeError names any other one."""
    out = []
    for name, x in named.items():
        x = np.asarray(x)
        if x.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError(f"{name} must be a float16/float32/float64 array, got dtype {x.dtype}")
        out.append(x)
    return out


def expand_kv(x, hq):
    """Given: (..., Hkv, N, d) -> (..., Hq, N, d), query head h reading kv head h // (Hq // Hkv)."""
    return x if x.shape[-3] == hq else np.repeat(x, hq // x.shape[-3], axis=-3)


def positions(n, world, rank, layout="zigzag"):
    """Given: the global positions rank ``rank`` of ``world`` holds in a length-``n`` sequence.

    ``contiguous``: chunk ``rank`` of ``world`` chunks; ``zigzag``: chunks ``rank`` and ``2 world - 1 - rank`` of
    ``2 world`` chunks (balanced causal work, lecture 10). Chunks are ``np.array_split`` pieces (ragged n).
    """
    if layout == "contiguous":
        return np.array_split(np.arange(n), world)[rank]
    chunks = np.array_split(np.arange(n), 2 * world)
    return np.concatenate([chunks[rank], chunks[2 * world - 1 - rank]])


# %% [markdown]
# ## The ring step
#
# 1. Scores of the visiting chunk: $S = \mathrm{scale}\cdot q k^T$ (scale defaults to $1/\sqrt d$), with
#    $S_{ij} = -\infty$ where `causal` and `k_pos[j] > q_pos[i]`.
# 2. The chunk's state, with the max trick: $m_i = \max_j S_{ij}$,
#    $\mathrm{lse}^{(b)}_i = m_i + \log\sum_j e^{S_{ij} - m_i}$, $o^{(b)}_i = \sum_j e^{S_{ij} - \mathrm{lse}^{(b)}_i} v_j$.
#    A row that sees no key has $\mathrm{lse}^{(b)} = -\infty$ and $o^{(b)} = 0$.
# 3. Merge (assignment 1): $\mathrm{lse}' = \log(e^{\mathrm{lse}} + e^{\mathrm{lse}^{(b)}})$,
#    $o' = e^{\mathrm{lse} - \mathrm{lse}'}\, o + e^{\mathrm{lse}^{(b)} - \mathrm{lse}'}\, o^{(b)}$ -- again with the
#    max trick, and with both sides empty giving $o' = 0$, $\mathrm{lse}' = -\infty$.

# %%
def ring_step(o, lse, q, k, v, q_pos, k_pos, causal=True, scale=None):
    """One ring step: fold the attention of ``q`` to the visiting chunk ``k, v`` into the state ``(o, lse)``.

    Chunk state: S = scale q k^T (masked where k_pos > q_pos), lse_b = logsumexp(S), o_b = softmax(S) v;
    merge: lse' = log(e^lse + e^lse_b), o' = e^(lse - lse') o + e^(lse_b - lse') o_b.
    """
    o, lse, q, k, v = floats(o=o, lse=lse, q=q, k=k, v=v)
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    if o.shape != q.shape or lse.shape != q.shape[:-1] or k.shape != v.shape or q_pos.shape != q.shape[-2:-1] \
            or k_pos.shape != k.shape[-2:-1] or q.shape[-3] % k.shape[-3]:
        raise ValueError(f"expected o, q (..., Hq, nq, d), lse (..., Hq, nq), k, v (..., Hkv, nk, d), q_pos (nq,), "
                         f"k_pos (nk,); got o {o.shape}, lse {lse.shape}, q {q.shape}, k {k.shape}, v {v.shape}, "
                         f"q_pos {q_pos.shape}, k_pos {k_pos.shape}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    ### BEGIN SOLUTION
    acc = np.result_type(np.float32, o, lse, q, k, v)     # accumulate in at least float32
    hq = q.shape[-3]
    s = (q.astype(acc) @ np.swapaxes(expand_kv(k, hq).astype(acc), -1, -2)) * scale
    if causal:
        s = np.where(k_pos[None, :] <= q_pos[:, None], s, -np.inf)
    m = s.max(axis=-1)
    m = np.where(np.isneginf(m), 0.0, m)           # a row that sees nothing: exp(-inf - 0) = 0, not NaN
    e = np.exp(s - m[..., None])
    total = e.sum(axis=-1)
    with np.errstate(divide="ignore"):
        lse_b = np.where(total > 0, m + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    o_b = (e @ expand_kv(v, hq).astype(acc)) / np.where(total > 0, total, 1.0)[..., None]
    la = lse.astype(acc)
    mm = np.maximum(la, lse_b)
    mm = np.where(np.isneginf(mm), 0.0, mm)        # both empty: both weights 0
    wa, wb = np.exp(la - mm), np.exp(lse_b - mm)
    tot = wa + wb
    with np.errstate(divide="ignore"):
        lse_new = np.where(tot > 0, mm + np.log(np.where(tot > 0, tot, 1.0)), -np.inf)
    tot = np.where(tot > 0, tot, 1.0)
    o_new = (wa / tot)[..., None] * o.astype(acc) + (wb / tot)[..., None] * o_b
    return o_new.astype(o.dtype), lse_new.astype(lse.dtype)
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a6.ring_step", ring_step)

# %% [markdown]
# ## The whole ring, simulated (ungraded)
#
# W ranks, each starting from an empty state; at step s rank r merges the chunk of rank (r - s) mod W. The
# result must equal plain causal attention over the whole sequence -- for either layout.

# %% tags=["skip"]
try:
    rng = np.random.default_rng(0)
    N, W, d = 45, 3, 16
    q, k, v = (rng.standard_normal((2, N, d)) for _ in range(3))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(d)
    s = np.where(np.tril(np.ones((N, N), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    full = (p / p.sum(-1, keepdims=True)) @ v
    for layout in ("contiguous", "zigzag"):
        out = np.zeros_like(q)
        for r in range(W):
            qp = positions(N, W, r, layout)
            o_r, lse_r = np.zeros((2, len(qp), d)), np.full((2, len(qp)), -np.inf)
            for step in range(W):
                kp = positions(N, W, (r - step) % W, layout)
                o_r, lse_r = ring_step(o_r, lse_r, q[:, qp], k[:, kp], v[:, kp], qp, kp)
            out[:, qp] = o_r
        print(f"{layout:>10}: max |ring - full| = {np.abs(out - full).max():.2e}")
except NotImplementedError as e:
    print("not implemented yet:", e)
