# %% [markdown]
# # Lecture 0 — Attention, from a weighted sum to multi-head, GQA and masks
#
# **Learning objectives.** After this lecture you can:
#
# 1. Compute single-head attention by hand for a 2 x 2 example and check it against `reference.numpy.attention`.
# 2. Explain why the scores are scaled by $1/\sqrt d$, and what goes wrong in the softmax without it.
# 3. State how many query heads share a key/value head in GQA and MQA, and by how much each shrinks the KV cache.
# 4. Draw the bottom-right causal mask for $N_q \ne N_k$ and count the visible (query, key) pairs.
# 5. Compute the memory of the $N \times N$ score matrix for a given $N$ and say why it is the problem the course solves.
#
# This course is about making one formula fast:
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt d}\right) V .$$
#
# Before any speed, this lecture builds the formula up from the idea it comes from, checks every step against
# the course's reference implementation `reference.numpy.attention`, and ends with the problem the rest of the
# course solves: the $N \times N$ matrix in the middle.
#
# **Reading path:** this lecture → lecture 1 (softmax) → assignment `a1_attention`.

# %%
import math

import numpy as np

from lectures._exercise import check_guess
from lectures._plots import setup
from reference.numpy.attention import attention, causal_mask, multi_head_attention

plt = setup()
rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Attention is a weighted combination of states
#
# A recurrent network squeezes the whole history into one hidden state $h_t$. *Attention* instead combines
# all the individual states directly, with weights:
#
# $$h_t = \sum_{i=1}^{t} s_i\, x_i ,$$
#
# where $s_i$ is an **attention score**: how relevant position $i$'s input is to the output at $t$. There are
# many ways to compute the scores; the Transformer ("Attention is all you need", Vaswani et al. 2017) uses
# scaled dot products. With a *query* $q$ (what position $t$ is looking for), *keys* $k_i$ (what each position
# offers) and *values* $v_i$ (what each position hands over):
#
# $$s_i = \frac{q\,k_i^\top}{\sqrt d}, \qquad h = \sum_i \mathrm{softmax}(s)_i\, v_i = \frac{\sum_i e^{s_i} v_i}{\sum_j e^{s_j}} .$$
#
# Softmax turns relevances into non-negative weights that sum to one, so $h$ is a weighted *average* of the
# values. Here it is for one query, by hand:

# %%
d, t = 4, 6
q = rng.standard_normal(d)
K = rng.standard_normal((t, d))
V = rng.standard_normal((t, d))

s = K @ q / math.sqrt(d)                 # one score per position
w = np.exp(s) / np.exp(s).sum()          # softmax: weights >= 0, sum to 1
h = (w[:, None] * V).sum(axis=0)         # weighted average of the values

print("scores  s =", s)
print("weights w =", w, " sum =", w.sum())
print("output  h =", h)
print("reference :", attention(q[None, :], K, V)[0])

# %% [markdown]
# ## 2. Self-attention: every position is a query
#
# In *self*-attention the queries, keys and values are all linear maps of the same sequence
# $X \in \mathbb{R}^{T \times d_{model}}$: $Q = XW_Q$, $K = XW_K$, $V = XW_V$. Stacking one query per row turns the
# $T$ weighted sums into three matrix multiplications:
#
# $$S = \frac{QK^\top}{\sqrt d}\ (T\times T), \qquad P = \mathrm{softmax}(S)\ \text{(row-wise)}, \qquad O = PV\ (T\times d).$$
#
# A Transformer block wraps it: $Z = \mathrm{SelfAttention}(XW_Q, XW_K, XW_V)$, $Z = \mathrm{LayerNorm}(X + Z)$,
# $H = \mathrm{LayerNorm}(\mathrm{ReLU}(ZW_1)W_2 + Z)$. Row $t$ of $P$ is exactly the weight vector $w$ of
# section 1 for query $t$:

# %%
T, d_model = 8, 16
X = rng.standard_normal((T, d_model))
W_q, W_k, W_v = (rng.standard_normal((d_model, d_model)) / math.sqrt(d_model) for _ in range(3))
Q, K, V = X @ W_q, X @ W_k, X @ W_v

S = Q @ K.T / math.sqrt(d_model)
P = np.exp(S - S.max(axis=1, keepdims=True))
P /= P.sum(axis=1, keepdims=True)
O = P @ V
print("max |O - reference| =", np.abs(O - attention(Q, K, V)).max())

fig, ax = plt.subplots(1, 2, figsize=(7, 3))
ax[0].imshow(S, cmap="RdBu_r"); ax[0].set_title("scores S = QK^T / sqrt(d)"); ax[0].grid(False)
ax[1].imshow(P, cmap="Greens"); ax[1].set_title("P = softmax(S): rows sum to 1"); ax[1].grid(False)
for a in ax:
    a.set_xlabel("key position j"); a.set_ylabel("query position i")
plt.tight_layout()

# %% [markdown]
# ## 3. Multi-head attention
#
# One attention layer computes one kind of relevance. **Multi-head** attention runs $H$ of them in parallel on
# different linear projections of the input, each with a smaller head dimension $d_h = d_{model}/H$, then
# concatenates the results and mixes them with $W^O$:
#
# $$Z_i = \mathrm{softmax}\!\left(\frac{Q_i K_i^\top}{\sqrt{d_h}}\right) V_i, \qquad Z = \mathrm{Concat}(Z_0, \ldots, Z_{H-1})\, W^O .$$
#
# In practice one computes $Q, K, V$ for all heads with one big matmul and *reshapes* into heads: the layout
# `(batch, heads, N, d)` used everywhere in this course. The benefits the slides list: **more parallelism** (the
# heads are independent problems — later lectures hand them to different GPU thread blocks) and **reduced
# computation** compared with $H$ full-width attentions (each head works in $d_h = d_{model}/H$, so the score
# matmuls of all heads together cost as much as a single $d_{model}$-wide head). Each head can specialise in a
# different kind of information.

# %%
H = 4
d_h = d_model // H
W_o = rng.standard_normal((d_model, d_model)) / math.sqrt(d_model)

Z_heads = []
for i in range(H):                        # head i uses columns i*d_h:(i+1)*d_h of the projections
    cols = slice(i * d_h, (i + 1) * d_h)
    Z_heads.append(attention(Q[:, cols], K[:, cols], V[:, cols]))
Z = np.concatenate(Z_heads, axis=1) @ W_o

Z_ref = multi_head_attention(X, W_q, W_k, W_v, W_o, n_heads=H)
print("per-head loop vs multi_head_attention: max |diff| =", np.abs(Z - Z_ref).max())

# the reshape view: (N, H*d_h) -> (H, N, d_h)
Qh = Q.reshape(T, H, d_h).transpose(1, 0, 2)
print("heads layout:", Qh.shape, "| same as the loop:",
      np.allclose(attention(Qh, K.reshape(T, H, d_h).transpose(1, 0, 2), V.reshape(T, H, d_h).transpose(1, 0, 2))
                  .transpose(1, 0, 2).reshape(T, d_model) @ W_o, Z))

# %% [markdown]
# ## 4. Grouped-query and multi-query attention (GQA / MQA)
#
# At inference time the keys and values of past tokens are kept in a **KV cache** (lecture 7), and reading it
# dominates decoding time. GQA lets several query heads *share* one key/value head: with $H_q$ query heads and
# $H_{kv}$ key/value heads, query head $h$ reads kv head $h \,//\, (H_q/H_{kv})$. $H_{kv} = H_q$ is ordinary
# multi-head attention, $H_{kv} = 1$ is multi-query attention (MQA: all heads share $K, V$). The KV cache shrinks
# by the group size $H_q/H_{kv}$; the queries keep their full expressiveness.
#
# The reference implements GQA by broadcasting kv heads; the result equals explicitly repeating them:

# %%
Hq, Hkv, N, dh = 8, 2, 10, 16
q = rng.standard_normal((Hq, N, dh))
k = rng.standard_normal((Hkv, N, dh))
v = rng.standard_normal((Hkv, N, dh))
group = Hq // Hkv
o_gqa = attention(q, k, v)
o_rep = attention(q, np.repeat(k, group, axis=0), np.repeat(v, group, axis=0))
print(f"Hq={Hq}, Hkv={Hkv}: query head h reads kv head h // {group}:", [h // group for h in range(Hq)])
print("GQA == repeated-KV multi-head attention:", np.allclose(o_gqa, o_rep))

# %% [markdown]
# **Predict, then run.** A Llama-like model: 32 layers, 32 query heads of dimension 128, bf16 (2 bytes). With
# GQA-8 ($H_{kv} = 8$), how many GiB does the KV cache of one 128k-token sequence take?

# %%
guess = None  # your answer, in GiB
check_guess(guess, 2 * 32 * 8 * 128 * 2 * 128_000 / 2**30, what="GQA-8 KV cache, 128k tokens (GiB)")
for name, hkv in (("MHA", 32), ("GQA-8", 8), ("MQA", 1)):
    per_token = 2 * 32 * hkv * 128 * 2           # K and V, layers, kv heads, head dim, 2 bytes
    print(f"{name:6s} Hkv={hkv:2d}: {per_token / 1024:6.0f} KiB per token, "
          f"{per_token * 128_000 / 2**30:6.1f} GiB for a 128k-token context")

# %% [markdown]
# ## 5. Masked (causal) self-attention
#
# A language model predicts token $t$ from tokens $\le t$ only, so query $i$ must not look at keys $j > i$. The
# slides write this as an additive mask:
#
# $$\mathrm{MaskedSelfAttention}(Q,K,V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt d} - M\right)V, \qquad M_{ij} = \begin{cases}\infty & j > i\\ 0 & j \le i\end{cases}$$
#
# $e^{-\infty} = 0$, so masked keys get weight exactly 0. Two consequences matter for speed later: the masked
# half of $S$ need not be computed at all ("skip the computation that is masked out" — FlashAttention skips
# whole tiles, lecture 3), and the remaining work is unequal across rows (FA3's load balancing, lecture 6).
#
# **When $N_q \ne N_k$.** During decoding (lecture 7) a few new queries attend a long cache of keys. This
# course follows FlashAttention ≥ 2.1 and aligns the mask **bottom-right**: query $i$ of $N_q$ may attend key
# $j$ iff $j \le i + (N_k - N_q)$ — the *last* query sees every key. With $N_q = 1$ the single query sees all
# keys; with $N_q > N_k$ the first rows see nothing, and their output is defined as 0 (not NaN).

# %%
fig, axes = plt.subplots(1, 3, figsize=(8, 2.8))
for ax, (nq, nk) in zip(axes, ((6, 6), (3, 7), (6, 3))):
    ax.imshow(causal_mask(nq, nk), cmap="Blues", vmin=-0.3, vmax=1.2)
    ax.set_xticks(range(nk)); ax.set_yticks(range(nq))
    ax.set_title(f"Nq={nq}, Nk={nk}"); ax.set_xlabel("key j"); ax.set_ylabel("query i"); ax.grid(False)
fig.suptitle("bottom-right causal masks (dark = may attend, pale = masked)")
plt.tight_layout()

q, k, v = rng.standard_normal((6, 4)), rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
o, lse = attention(q, k, v, causal=True, return_lse=True)
print("Nq=6 > Nk=3: rows 0-2 attend no key -> output", o[:3].tolist(), "lse", lse[:3])

# the additive -inf form of the slide gives the same as the reference's boolean mask
q, k, v = (rng.standard_normal((6, 4)) for _ in range(3))
Sm = q @ k.T / 2 - np.where(causal_mask(6, 6), 0, np.inf)
Pm = np.exp(Sm - Sm.max(1, keepdims=True)); Pm /= Pm.sum(1, keepdims=True)
print("softmax(S - M) V == attention(causal=True):", np.allclose(Pm @ v, attention(q, k, v, causal=True)))

# %% [markdown]
# **Predict, then run.** Chunked prefill: $N_q = 256$ new queries attend a cache of $N_k = 1024$ keys (the
# 768 old ones plus themselves), bottom-right aligned. What fraction of the $N_q \times N_k$ scores may be
# attended? (A square causal mask keeps about half.)

# %%
guess = None  # your answer, a fraction between 0 and 1
check_guess(guess, float(causal_mask(256, 1024).mean()), what="allowed fraction, Nq=256, Nk=1024")

# %% [markdown]
# ## 6. The problem: the $N \times N$ intermediate
#
# $Q, K, V, O$ are $N \times d$, but $S$ and $P$ are $N \times N$. With typical $d = 64..128$ and $N$ from 1k to
# 128k, the intermediates dwarf everything else — and a straightforward GPU implementation writes $S$ to GPU
# memory, reads it back for the softmax, writes $P$, reads it again for $PV$. The slides' three challenges:
#
# * large intermediate results,
# * repeated reads/writes from GPU device memory,
# * cannot scale to long sequences because of the $O(N^2)$ intermediates.

# %%
d, heads, batch = 128, 32, 1
print(f"{'N':>7} | {'Q,K,V,O (MB)':>13} | {'one S or P (MB)':>16} | ratio")
for n in (1024, 4096, 16384, 65536, 131072):
    qkvo = 4 * batch * heads * n * d * 2 / 1e6
    s_mb = batch * heads * n * n * 2 / 1e6
    print(f"{n:7d} | {qkvo:13.0f} | {s_mb:16.0f} | {s_mb / qkvo:5.0f}x")

# %% [markdown]
# At 128k tokens a single fp16 $S$ for 32 heads is over a terabyte. Lecture 1 shows how to compute a softmax
# without seeing the whole row at once; lecture 2 explains *why* the memory traffic, not the FLOPs, is what
# costs time; lecture 3 puts both together into FlashAttention, which never materialises $S$ at all.
