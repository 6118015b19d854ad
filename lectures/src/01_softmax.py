# %% [markdown]
# # Lecture 1 — Softmax: overflow, the max trick, and softmax in pieces
#
# **Learning objectives.** After this lecture you can:
#
# 1. Find the smallest logit at which the textbook softmax overflows in float16.
# 2. Prove that subtracting the row maximum leaves the softmax unchanged.
# 3. Merge the $(m, \ell)$ statistics of two pieces of a row, and rescale partial outputs the same way.
# 4. Implement online softmax in one streaming pass (a1's `online_softmax`).
#
# FlashAttention rests on one small fact: **a softmax can be computed in pieces and the pieces fixed up
# afterwards**, using two numbers per row. This lecture derives that fact from the numerical problem that
# motivates it (float16 overflow), using `reference.numpy.softmax`.
#
# **Reading path:** lecture 0 → this lecture → assignment `a1_attention` (`safe_softmax`, `online_softmax`,
# `merge_states`) → lecture 2.

# %%
import math

import numpy as np

from lectures._exercise import check_guess
from lectures._plots import setup
from reference.numpy.attention import attention
from reference.numpy.softmax import (merge_softmax_stats, naive_softmax, online_softmax, safe_softmax,
                                     softmax_stats)

plt = setup()
rng = np.random.default_rng(1)

# %% [markdown]
# ## 1. The textbook formula overflows in float16
#
# $$\mathrm{softmax}(x)_i = \frac{e^{x_i}}{\sum_j e^{x_j}}$$
#
# The largest float16 number is 65504, and $e^{12} \approx 162755$ is larger. So any logit above
# $\ln 65504 \approx 11.09$ makes $e^{x}$ overflow to `inf`, and then `inf / inf = nan`. Attention logits of 12
# are ordinary (scores grow with $\sqrt d$ and with training), so this is not a corner case.

# %%
print("float16 max          :", np.finfo(np.float16).max)
print("e^11, e^12 in float64:", math.exp(11), math.exp(12))
with np.errstate(over="ignore"):  # NumPy would warn "overflow encountered in exp"
    print("e^11, e^12 in float16:", np.exp(np.float16(11)), np.exp(np.float16(12)))
print("threshold ln(65504)  :", math.log(65504))

x = np.array([3.0, 11.0, 12.0], dtype=np.float16)
with np.errstate(over="ignore", invalid="ignore"):
    print("naive_softmax(float16 [3, 11, 12]) =", naive_softmax(x))
print("safe_softmax (float16 [3, 11, 12]) =", safe_softmax(x))
print("float64 truth                      =", naive_softmax(x.astype(np.float64)))

# %% [markdown]
# **Predict, then run.** float32 is what the kernels accumulate in. Above which logit does $e^x$ overflow in
# float32 (largest value about $3.4 \times 10^{38}$)?

# %%
guess = None  # your answer, a logit value
with np.errstate(over="ignore"):
    overflow_at = next(x for x in np.arange(80, 100, 0.01, dtype=np.float32) if np.isinf(np.exp(x)))
check_guess(guess, float(overflow_at), rel=0.01, what="first float32 logit whose exp overflows")
print("ln(float32 max) =", math.log(np.finfo(np.float32).max))

# %% [markdown]
# ## 2. Safe softmax: subtract the maximum
#
# Softmax does not change when a constant is subtracted from every logit:
# $\frac{e^{x_i - c}}{\sum_j e^{x_j - c}} = \frac{e^{-c} e^{x_i}}{e^{-c}\sum_j e^{x_j}}$. Choosing $c$ = the
# maximum makes every exponent $\le 0$, so nothing overflows, and at least one term is $e^0 = 1$, so the sum
# cannot underflow to 0. In the slides' notation, for a vector $x$ of length $B$:
#
# $$m(x) := \max_i x_i, \quad f(x) := \left[e^{x_1 - m(x)} \;\ldots\; e^{x_B - m(x)}\right], \quad \ell(x) := \sum_i f(x)_i, \quad \mathrm{softmax}(x) := \frac{f(x)}{\ell(x)} .$$
#
# The price: the row is read **three** times — once for $m$, once for $\ell$, once to write $f/\ell$.

# %%
x = rng.standard_normal(10) * 4 + 20            # logits around 20: float16 naive would overflow
m = x.max()
f = np.exp(x - m)
l = f.sum()
print("m =", m, "| l =", l, "| max |f/l - safe_softmax| =", np.abs(f / l - safe_softmax(x)).max())

sweep = np.linspace(0, 16, 161)
with np.errstate(over="ignore", invalid="ignore"):
    bad = [np.isnan(naive_softmax(np.array([0.0, s], np.float16))).any() for s in sweep]
    ok = [np.isfinite(safe_softmax(np.array([0.0, s], np.float16))).all() for s in sweep]
fig, ax = plt.subplots(figsize=(6.5, 2.2))
ax.plot(sweep, bad, label="naive softmax gives NaN")
ax.plot(sweep, np.array(ok) * 0.95, label="safe softmax finite (x0.95 for visibility)")
ax.axvline(math.log(65504), color="k", ls=":", label="ln 65504 = 11.09")
ax.set_xlabel("largest logit (float16 row [0, x])"); ax.set_yticks([0, 1]); ax.legend(fontsize=8)
plt.tight_layout()

# %% [markdown]
# ## 3. Softmax in two pieces: the $(m, \ell)$ statistics
#
# Split the row into $x = [x^{(1)}\; x^{(2)}]$ and compute each part's statistics on its own. The whole row's
# statistics follow from the parts' (this is the rule on the slides):
#
# $$m(x) = \max\big(m(x^{(1)}), m(x^{(2)})\big), \qquad f(x) = \left[e^{m(x^{(1)}) - m(x)} f(x^{(1)}) \quad e^{m(x^{(2)}) - m(x)} f(x^{(2)})\right],$$
#
# $$\ell(x) = e^{m(x^{(1)}) - m(x)}\,\ell(x^{(1)}) + e^{m(x^{(2)}) - m(x)}\,\ell(x^{(2)}), \qquad \mathrm{softmax}(x) = \frac{f(x)}{\ell(x)} .$$
#
# Each part was normalised to *its own* maximum; multiplying by $e^{m_{part} - m}$ re-expresses it relative to the
# global maximum. Two numbers per row — $m$ and $\ell$ — are all that must be carried between pieces.

# %%
x = rng.standard_normal(12) * 3
x1, x2 = x[:5], x[5:]
m1, l1 = softmax_stats(x1)
m2, l2 = softmax_stats(x2)
m, l = merge_softmax_stats(m1, l1, m2, l2)
print("merged (m, l) =", (float(m), float(l)), "| whole row:", tuple(float(v) for v in softmax_stats(x)))

f = np.concatenate([np.exp(m1 - m) * np.exp(x1 - m1), np.exp(m2 - m) * np.exp(x2 - m2)])
print("softmax from the pieces == safe_softmax:", np.allclose(f / l, safe_softmax(x)))
print("log-sum-exp of the row = m + log l =", float(m + np.log(l)), "=", float(np.log(np.exp(x).sum())))

# %% [markdown]
# ## 4. Online softmax: one streaming pass for the statistics
#
# Apply the merge rule block after block, keeping a *running* $(m, \ell)$: every block updates
# $m \leftarrow \max(m, m_b)$, $\ell \leftarrow e^{m_{old} - m}\ell + e^{m_b - m}\ell_b$. The row is read once
# to get both statistics (Milakov & Gimelshein, 2018, "online normaliser"), and once more to write the output:
# two passes instead of three. The running max only moves up; each time it does, the sum accumulated so far is
# shrunk by $e^{m_{old} - m_{new}}$.

# %%
x = rng.standard_normal(64) * 2 + np.linspace(0, 6, 64)   # a drift so the max keeps moving
B = 8
run_m, run_l, ms, ls = -np.inf, 0.0, [], []
for start in range(0, x.size, B):
    mb, lb = softmax_stats(x[start:start + B])
    run_m, run_l = merge_softmax_stats(np.float64(run_m), np.float64(run_l), mb, lb)
    ms.append(float(run_m)); ls.append(float(run_l))
print("streamed (m, l):", (ms[-1], ls[-1]), "| exact:", tuple(float(v) for v in softmax_stats(x)))
print("online_softmax == safe_softmax:", np.allclose(online_softmax(x, block_size=B), safe_softmax(x)))

fig, ax = plt.subplots(1, 2, figsize=(8, 2.8))
ax[0].plot(x, ".", ms=4); ax[0].step(np.arange(B - 1, x.size, B), ms, where="post", label="running max m")
ax[0].set_xlabel("position in row"); ax[0].legend(fontsize=8); ax[0].set_title("logits and running max")
ax[1].plot(range(1, len(ls) + 1), ls, "o-"); ax[1].set_xlabel("blocks seen"); ax[1].set_title("running sum l (rescaled each block)")
plt.tight_layout()

# %% [markdown]
# **Predict, then run.** The running state is $(m, \ell) = (3, 2)$ and the next block has
# $(m_b, \ell_b) = (5, 1)$. What is the new running sum $\ell$?

# %%
guess = None  # your answer, a number
m_new, l_new = merge_softmax_stats(np.float64(3.0), np.float64(2.0), np.float64(5.0), np.float64(1.0))
check_guess(guess, float(l_new), rel=0.02, what=f"new l (the new m is {float(m_new):g})")

# %% [markdown]
# Large logits, fully masked rows and tiny blocks all work: a block that is all $-\infty$ (a masked piece of a
# row) has $m = -\infty, \ell = 0$ and contributes nothing — the reference makes sure this gives 0, not NaN.

# %%
big = (rng.standard_normal((4, 300)) * 3 + 50).astype(np.float16)
print("float16 logits ~50, online_softmax max error vs float64:",
      np.abs(online_softmax(big, 7).astype(np.float64) - safe_softmax(big.astype(np.float64))).max())
print("a fully masked row:", online_softmax(np.full((1, 5), -np.inf), 2))
print("stats of an empty piece:", softmax_stats(np.full(3, -np.inf)))

# %% [markdown]
# ## 5. From softmax to attention: the output can be merged too
#
# Attention needs $\mathrm{softmax}(s)\,V$, not the softmax itself. Split the keys (and values) into two
# blocks. The slides write the whole thing as
#
# $$\mathrm{softmax}([A_1, A_2]) = [\alpha\, \mathrm{softmax}(A_1),\; \beta\, \mathrm{softmax}(A_2)], \qquad
# \mathrm{softmax}([A_1, A_2]) \begin{bmatrix} V_1\\ V_2\end{bmatrix} = \alpha\, \mathrm{softmax}(A_1) V_1 + \beta\, \mathrm{softmax}(A_2) V_2$$
#
# with $\alpha = e^{m_1 - m}\ell_1 / \ell$ and $\beta = e^{m_2 - m}\ell_2/\ell$ — each block's share of the total
# mass. The FA3 talk shows the two attempts: computing each block's output with its **local** denominator gives
# the **wrong** answer; **rescaling** by the ratio of denominators fixes it, without ever revisiting block 1.

# %%
d, n = 8, 40
q = rng.standard_normal((3, d))
K, V = rng.standard_normal((n, d)), rng.standard_normal((n, d))
S = q @ K.T / math.sqrt(d)
A1, A2, V1, V2 = S[:, :15], S[:, 15:], V[:15], V[15:]

wrong = safe_softmax(A1) @ V1 + safe_softmax(A2) @ V2       # each block normalised locally
(m1, l1), (m2, l2) = softmax_stats(A1), softmax_stats(A2)
m, l = merge_softmax_stats(m1, l1, m2, l2)
alpha, beta = (np.exp(m1 - m) * l1 / l)[:, None], (np.exp(m2 - m) * l2 / l)[:, None]
right = alpha * (safe_softmax(A1) @ V1) + beta * (safe_softmax(A2) @ V2)
exact = attention(q, K, V)
print("1st attempt (local denominators): max error", np.abs(wrong - exact).max())
print("2nd attempt (rescaled)          : max error", np.abs(right - exact).max())
print("alpha + beta =", (alpha + beta).ravel())

# %% [markdown]
# Because the merge only needs $(m, \ell)$ of each piece (equivalently the log-sum-exp $m + \log \ell$) and the
# piece's normalised output, pieces can be combined **in any order and any grouping** — the merge is
# associative and commutative. Lecture 3 uses it left to right, block after block (FlashAttention); lecture 7
# uses it as a tree over chunks of a long KV cache (Flash-Decoding, recursive attention).

# %%
pieces = np.array_split(np.arange(n), 5)
stats = [softmax_stats(S[:, p]) for p in pieces]
order = rng.permutation(len(pieces))
mm, ll = stats[order[0]]
for i in order[1:]:
    mm, ll = merge_softmax_stats(mm, ll, *stats[i])
print("merged in order", order.tolist(), "-> log-sum-exp matches:",
      np.allclose(mm + np.log(ll), np.log(np.exp(S).sum(axis=1))))
