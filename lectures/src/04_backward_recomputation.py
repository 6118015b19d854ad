# %% [markdown]
# # Lecture 4 — The backward pass: recomputation beats storage
#
# **Learning objectives.** After this lecture you can:
#
# 1. Derive the gradients of attention, including $D = \mathrm{rowsum}(dO \circ O)$.
# 2. Trace Algorithm 2 for one key block and say where $dQ$, $dK$, $dV$ accumulate.
# 3. List what the forward must store for the backward and its size compared with $P$.
# 4. Explain why recomputing $P$ is faster than storing it despite 13-17% more FLOPs.
#
# Training needs gradients. Standard attention keeps the $N \times N$ probability matrix $P$ from the forward
# pass to use in the backward pass. FlashAttention's second technique is to **not** keep it: store only the
# output $O$ and one number per row — the logsumexp $L$ — and *recompute* $P$ tile by tile in the backward pass,
# from $Q, K$ in SRAM. That costs more FLOPs and still runs faster, because it moves far fewer bytes.
#
# This lecture derives the gradients, walks through FlashAttention-2's Algorithm 2
# (`reference.numpy.flash.flash_attention_backward`), checks it against PyTorch autograd, and explains the
# seeds' "13% more FLOPs, 6x faster" with the IO model.
#
# **Reading path:** lecture 3 → this lecture → assignment `a2_flash_numpy` (`flash_attention_backward`) →
# lecture 5.

# %% [markdown]
# <a id="conventions"></a>
# > **Conventions used in every lecture and assignment.**
# > * **$\ell$ is the normaliser, $L$ the log-sum-exp.** Per query row, $\ell_i = \sum_j e^{s_{ij} - m_i}$
# >   (lecture 1's running sum, relative to the running max $m_i$) and $L_i = m_i + \log \ell_i
# >   = \log \sum_j e^{s_{ij}}$. The slides and the FlashAttention-1 paper write the normaliser as $L$ (and
# >   $P_{ij} = e^{s_{ij}}/L_i$); here $L$ (the arrays `lse`) is always the **log**-sum-exp, so
# >   $P_{ij} = e^{s_{ij} - L_i}$ and one number per row is all the backward pass needs.
# > * **The scale sits inside the scores:** $s_{ij} = \tau\, q_i \cdot k_j$ with $\tau = 1/\sqrt d$ unless
# >   the caller passes `scale`. $L$ is the log-sum-exp of these *scaled* scores, so
# >   $P_{ij} = \exp(\tau\, q_i \cdot k_j - L_i)$.
# > * **Natural log at every API, base 2 inside GPU kernels.** Every function returns `lse` in natural-log units.
# >   The Triton kernels compute `exp2` (one hardware instruction) on $s \log_2 e$ and convert at the boundary:
# >   the forward stores $L = L_2 / \log_2 e$, the backward turns the saved $L$ back into $L_2 = L \log_2 e$.
# > * A row that sees no key (causal with $N_q > N_k$) has $o = 0$ and $L = -\infty$; its $P$ row is 0.

# %%
import math

import numpy as np
import torch

from lectures._exercise import check_guess
from lectures._measure import peak_mb
from lectures._plots import setup, tile_grid
from reference.simulators import iosim
from reference.numpy.attention import attention, attention_backward
from reference.numpy.flash import flash_attention_backward, flash_attention_forward

plt = setup()
rng = np.random.default_rng(4)

# %% [markdown]
# ## 1. Gradients of attention
#
# Forward: $S = \tau QK^\top$ ($\tau = 1/\sqrt d$), $P = \mathrm{softmax}(S)$ row-wise, $O = PV$. Given
# $dO = \partial \mathcal{L}/\partial O$, the two matmuls give $dV = P^\top dO$ and $dP = dO\, V^\top$
# (for $C = AB$: $dA = dC\, B^\top$, $dB = A^\top dC$), and $S = \tau QK^\top$ gives $dQ = \tau\, dS\, K$,
# $dK = \tau\, dS^\top Q$. The only non-matmul step is the softmax.
#
# **The softmax Jacobian.** Take one row, $p = \mathrm{softmax}(s)$, $p_j = e^{s_j} / \sum_k e^{s_k}$. Then
# $\partial p_j / \partial s_k = p_j(\delta_{jk} - p_k)$: the numerator contributes $p_j \delta_{jk}$ and
# the denominator $-p_j p_k$. In matrix form the Jacobian is $J = \mathrm{diag}(p) - p p^\top$, and the chain
# rule gives
#
# $$ds_k = \sum_j dp_j\, \frac{\partial p_j}{\partial s_k} = p_k\, dp_k - p_k \sum_j p_j\, dp_j
#       = p_k\,(dp_k - D), \qquad D = \sum_j p_j\, dp_j ,$$
#
# so for the whole matrix $dS = P \circ (dP - D)$ with one $D_i$ per row — never the $N \times N$ Jacobian
# of each row. FlashAttention-2 then uses the identity
#
# $$D_i = \sum_j P_{ij}\, (dO_i \cdot v_j) = dO_i \cdot \Big(\sum_j P_{ij} v_j\Big) = dO_i \cdot O_i = \mathrm{rowsum}(dO \circ O)_i ,$$
#
# so $D$ is computed from two $N \times d$ matrices, before any tile of $P$ exists. The slides show the first
# gradient in the form FlashAttention uses it: column $j$ of $dV$ is
# $dv_j = \sum_i P_{ij}\, do_i = \sum_i \exp(\tau\, q_i \cdot k_j - L_i)\, do_i$ (the slides write
# $e^{q_i^\top k_j} / L_i$ with $L$ the normaliser and the scale folded into $q$; see the conventions box) —
# every $P_{ij}$ it needs can be rebuilt from $q_i$, $k_j$ and the row's log-sum-exp.

# %%
N, d = 6, 4
Q, K, V, dO = (rng.standard_normal((N, d)) for _ in range(4))
tau = 1 / math.sqrt(d)
S = tau * Q @ K.T
P = np.exp(S - S.max(1, keepdims=True)); P /= P.sum(1, keepdims=True)
O = P @ V
dP = dO @ V.T
print("D = rowsum(P * dP) == rowsum(dO * O):", np.allclose((P * dP).sum(1), (dO * O).sum(1)))

_, L = attention(Q, K, V, return_lse=True)
print("P recomputed from L alone: exp(S - L) == P:", np.allclose(np.exp(S - L[:, None]), P))

J = np.diag(P[0]) - np.outer(P[0], P[0])                   # Jacobian of row 0's softmax
print("row 0: J^T dp == p * (dp - D):", np.allclose(J.T @ dP[0], P[0] * (dP[0] - (P[0] * dP[0]).sum())))

# %% [markdown]
# **A finite-difference check.** With the scalar loss $\mathcal{L} = \sum (dO \circ O)$ (whose gradient with
# respect to $O$ is $dO$), nudge each entry of $Q$, $K$, $V$ by $\pm h$ and compare
# $(\mathcal{L}(x + h) - \mathcal{L}(x - h)) / 2h$ with the formulas — no autograd involved:

# %%
def loss(q, k, v):
    return float((dO * attention(q, k, v)).sum())

dS = P * (dP - (dO * O).sum(1, keepdims=True))
formula = {"dQ": tau * dS @ K, "dK": tau * dS.T @ Q, "dV": P.T @ dO}
h = 1e-6
for name, x in (("dQ", Q), ("dK", K), ("dV", V)):
    fd = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h; xm[idx] -= h
        args = [xp if name == n else a for n, a in (("dQ", Q), ("dK", K), ("dV", V))]
        argm = [xm if name == n else a for n, a in (("dQ", Q), ("dK", K), ("dV", V))]
        fd[idx] = (loss(*args) - loss(*argm)) / (2 * h)
    print(f"{name}: max |finite difference - formula| = {np.abs(fd - formula[name]).max():.1e}")

# %% [markdown]
# ## 2. Algorithm 2 (FlashAttention-2 backward), in words
#
# The forward pass saved $O$ and $L$ ($N$ numbers per head). The backward pass:
#
# * line 4: $D = \mathrm{rowsum}(dO \circ O)$ (a small pre-processing kernel);
# * lines 5–7: **for each key block $j$** (one GPU thread block each): load $K_j, V_j$; $dK_j = dV_j = 0$ on chip;
# * lines 8–9: **for each query block $i$**: load $Q_i, dO_i, L_i, D_i$;
# * line 10–11: $S = \tau Q_i K_j^\top$, $P = \exp(S - L_i)$ — **recomputation**, no max or sum needed;
# * line 12: $dV_j \mathrel{+}= P^\top dO_i$; line 13: $dP = dO_i V_j^\top$; line 14: $dS = P \circ (dP - D_i)$;
# * line 15: $dQ_i \mathrel{+}= \tau\, dS K_j$ — a read-modify-write of $dQ_i$ in HBM, since every key block $j$
#   adds to the same $dQ_i$ (section 3 below: how GPU kernels organise it); line 16: $dK_j \mathrel{+}= \tau\, dS^\top Q_i$;
# * line 18: write $dK_j, dV_j$ once.
#
# The loop order is swapped relative to the forward (outer over $K/V$): $dK_j, dV_j$ accumulate on chip and are
# written once, while $dQ$ takes the read-modify-write traffic. Causal tiles above the diagonal are skipped as
# in the forward pass. The figure shows one program's walk (left) and how many key blocks write each $dQ_i$
# (right, causal):

# %%
Tr = Tc = 6
walk = np.zeros((Tr, Tc), int)
walk[:, 2] = np.arange(1, Tr + 1)                           # the program of key block j = 2 walks down its column
causal_walk = np.tril(np.ones((Tr, Tc), int))              # causal: tiles (i, j) with j <= i are visited
fig, ax = plt.subplots(1, 2, figsize=(8.5, 3.4))
tile_grid(ax[0], walk, "program of key block j=2: visits i = 0..5 in order;\n"
          "$dK_2, dV_2$ stay on chip, each step adds into $dQ_i$", annotate=True)
ax[0].set_xlim(-0.5, Tc + 0.9)
for i in range(Tr):
    ax[0].annotate("", xy=(Tc + 0.1, i), xytext=(2.45, i), arrowprops=dict(arrowstyle="->", color="tab:red", lw=0.8))
    ax[0].text(Tc + 0.15, i, f"$dQ_{i}$", color="tab:red", fontsize=8, va="center")
tile_grid(ax[1], causal_walk * (np.arange(Tc)[None, :] + 1), "causal: key blocks adding to each $dQ_i$", cmap="Oranges")
for i in range(Tr):
    n_w = causal_walk[i].sum()
    ax[1].text(Tc - 0.5 + 0.9, i, f"{n_w} write{'s' if n_w > 1 else ''}", fontsize=8, va="center")
ax[1].set_xlim(-0.5, Tc + 1.4)
plt.tight_layout()

# %% [markdown]
# ## 3. Where $dQ$ goes: three ways to organise line 15
#
# With one program per key block (what makes $dK_j, dV_j$ cheap), $T_c$ programs add into each $dQ_i$. GPU
# implementations choose one of three organisations:
#
# | choice | who uses it | cost |
# |---|---|---|
# | **atomic adds** into an fp32 $dQ$ accumulator in HBM, then a small kernel converting it to the input dtype | the FlashAttention-2 paper (§3.2: thread blocks exchange their dQ updates by atomic adds) and its CUDA code (`flash_bwd_launch_template.h`: `compute_dq_dk_dv_seqk_parallel`, then `convert_dQ`) | $T_c$ fp32 read-modify-writes of every $dQ_i$ (mostly served by L2); an extra fp32 $N \times d$ buffer; the summation order varies run to run, so gradients are not bitwise reproducible (FA2's deterministic mode pays speed for it) |
# | **a separate pass**: a second kernel, one program per query block, recomputes $S$, $P$, $dP$, $dS$ over its key blocks and keeps $dQ_i$ in registers | this course: `reference/triton/flash_bwd.py` (`_bwd_dq`) and assignment 3b (`a3b_triton_backward`, Part 3) | $S = \tau QK^\top$ and $dP = dO\,V^\top$ are computed twice: backward matmul FLOPs $14N^2d$ instead of $10N^2d$ (+40%), and $K, V, Q, dO$ are read again |
# | **a loop inside the dK/dV kernel**: after its key block, each program takes one query block and loops over the key blocks for $dQ$ | the Triton tutorial's fused-attention backward | the same recomputation as the separate pass, in one launch |
#
# The course's kernel makes the second choice: it is deterministic (the tests compare gradients at tight
# tolerances and a re-run gives identical bits), needs no fp32 scratch buffer or conversion kernel, runs
# unchanged under the Triton interpreter, and gives the assignment two small kernels instead of one large one.
# The price is the 40% extra backward FLOPs; on the H200 the backward still runs 1.16-1.66x the speed of SDPA's
# FlashAttention-2 backend (`benchmarks/results/h200-attention.json`, lecture 5), which uses atomics. The NumPy reference
# (assignment 2) is sequential, so its line 15 is a plain `+=`.

# %% [markdown]
# **Predict, then run.** How many times the backward matmul FLOPs of the atomic version does the separate-pass
# version do? Count the $N \times N \times d$ matmuls of each kernel (2 FLOPs per multiply-add), then run.

# %%
guess = None  # your answer, a number
dkdv_matmuls = 4        # S = Q K^T, dV += P^T dO, dP = dO V^T, dK += dS^T Q
dq_pass_matmuls = 3     # S again, dP again, dQ = dS K
atomic_matmuls = 5      # S, dV, dP, dK, dQ in one kernel
check_guess(guess, (dkdv_matmuls + dq_pass_matmuls) / atomic_matmuls, what="separate-pass / atomic backward FLOPs")

# %% [markdown]
# ## 4. Lines 5–18 by hand, for one key block
#
# Mirroring lecture 3's forward loop: Algorithm 2 for the single key block $j$, with $dQ$ taking the
# read-modify-writes. The reference computes all blocks the same way.

# %%
N, d, Br, Bc = 24, 8, 6, 8
Q, K, V, dO = (rng.standard_normal((N, d)) for _ in range(4))
tau = 1 / math.sqrt(d)
O_full, L_full = flash_attention_forward(Q, K, V, block_q=Br, block_k=Bc)
Dvec = (dO * O_full).sum(1)                                   # line 4


def key_block(j, dQ, verbose=False):
    """Lines 6-18 for key block j: returns (dK_j, dV_j); adds this block's share into dQ (in HBM)."""
    Kj, Vj = K[j * Bc:(j + 1) * Bc], V[j * Bc:(j + 1) * Bc]   # line 6: load K_j, V_j
    dKj, dVj = np.zeros((len(Kj), d)), np.zeros((len(Kj), d))  # line 7: on chip
    for i in range(math.ceil(N / Br)):                        # line 8
        rows = slice(i * Br, (i + 1) * Br)
        Qi, dOi, Li, Di = Q[rows], dO[rows], L_full[rows], Dvec[rows]   # line 9
        Sij = tau * Qi @ Kj.T                                 # line 10
        Pij = np.exp(Sij - Li[:, None])                       # line 11: recomputed from L
        dVj += Pij.T @ dOi                                    # line 12
        dPij = dOi @ Vj.T                                     # line 13
        dSij = Pij * (dPij - Di[:, None])                     # line 14
        dQ[rows] += tau * dSij @ Kj                           # line 15: read-modify-write in HBM
        dKj += tau * dSij.T @ Qi                              # line 16
        if verbose:
            print(f"i={i}: P tile row sums (this key block's share of each row) {Pij.sum(1)[:3].round(3)} ...")
    return dKj, dVj                                           # line 18: written once


dq_ref, dk_ref, dv_ref = flash_attention_backward(Q, K, V, O_full, L_full, dO, block_q=Br, block_k=Bc)
j = 1                                                         # second key block: keys 8..15
dQ = np.zeros((N, d))                                         # line 5: in HBM
dKj, dVj = key_block(j, dQ, verbose=True)
print("block j by hand == reference rows of dK, dV:", np.allclose(dKj, dk_ref[j * Bc:(j + 1) * Bc]),
      np.allclose(dVj, dv_ref[j * Bc:(j + 1) * Bc]))

# %% [markdown]
# After one key block, $dK_j$ and $dV_j$ are final but $dQ$ holds one key block's share of every row. The
# outer loop (line 5) runs every key block; each adds into all of $dQ$ again — $T_c$ read-modify-writes of
# every $dQ_i$:

# %%
dQ = np.zeros((N, d))
for j in range(math.ceil(N / Bc)):
    key_block(j, dQ)
    print(f"after key block {j}: max |dQ - dQ_ref| = {np.abs(dQ - dq_ref).max():.1e}")

# %% [markdown]
# ## 5. Checked against autograd
#
# The gradients of the tiled backward equal those of PyTorch autograd (float64) through the plain formula —
# for ragged shapes, causal masks with $N_q \ne N_k$, GQA and float32:

# %%
def autograd_grads(q, k, v, do, causal):
    qt, kt, vt = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, k, v))
    g = qt.shape[-3] // kt.shape[-3]
    kk, vv = kt.repeat_interleave(g, dim=-3), vt.repeat_interleave(g, dim=-3)
    s = qt @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        s = s.masked_fill(torch.arange(nk)[None, :] > torch.arange(nq)[:, None] + (nk - nq), float("-inf"))
    (torch.softmax(s, -1) @ vv).backward(torch.tensor(do, dtype=torch.float64))
    return [t.grad.numpy() for t in (qt, kt, vt)]

for nq, nk, hq, hkv, causal, dt in ((77, 77, 2, 2, False, np.float64), (50, 130, 4, 2, True, np.float64),
                                     (129, 129, 4, 1, True, np.float32)):
    q = rng.standard_normal((hq, nq, 32)).astype(dt)
    k, v = (rng.standard_normal((hkv, nk, 32)).astype(dt) for _ in range(2))
    do = rng.standard_normal((hq, nq, 32)).astype(dt)
    o, lse = flash_attention_forward(q, k, v, causal=causal, block_q=32, block_k=16)
    grads = flash_attention_backward(q, k, v, o, lse, do, causal=causal, block_q=32, block_k=16)
    ref = autograd_grads(q, k, v, do, causal)
    errs = [np.abs(a - b).max() / np.abs(b).max() for a, b in zip(grads, ref)]
    print(f"Nq={nq:3d} Nk={nk:3d} Hq={hq} Hkv={hkv} causal={causal!s:5} {np.dtype(dt).name}: "
          f"rel err dQ {errs[0]:.1e}  dK {errs[1]:.1e}  dV {errs[2]:.1e}")

# %% [markdown]
# ## 6. What must be stored between forward and backward
#
# Per head, standard attention keeps $P$ ($N^2$ values) for its backward; FlashAttention keeps $O$ (already an
# output) and $L$ ($N$ values). **Predict, then run:** at $N = 2048$, $d = 64$, how many times more bytes is
# $P$ than $O$ and $L$ together?

# %%
guess = None  # your answer, a number
check_guess(guess, 2048 * 2048 / (2048 * 64 + 2048), what="P bytes / (O + L) bytes at N=2048, d=64")

# %% [markdown]
# Measured peak allocation of the backward call itself (one head, $d = 64$, float32):

# %%
for n in (512, 1024, 2048):
    q, k, v, do = (rng.standard_normal((n, 64)).astype(np.float32) for _ in range(4))
    o, lse = flash_attention_forward(q, k, v)
    std = peak_mb(lambda: attention_backward(q, k, v, do))
    fla = peak_mb(lambda: flash_attention_backward(q, k, v, o, lse, do))
    print(f"N={n:5d}: saved for backward: P {n * n * 4 / 1e6:6.1f} MB vs O + L {(n * 64 + n) * 4 / 1e6:5.2f} MB;"
          f"  backward peak: standard {std:6.1f} MB, flash {fla:5.2f} MB")

# %% [markdown]
# ## 7. Why recomputation is faster despite more FLOPs
#
# Per head, the forward pass does two $N \times N \times d$ matmuls ($4N^2 d$ FLOPs). The standard backward does
# four ($dV$, $dP$, $dQ$, $dK$: $8N^2d$); FlashAttention's backward also recomputes $S = QK^\top$: $10N^2d$.
# Forward + backward: $14/12 = 1.17$, i.e. about 17% more matmul FLOPs (the seeds' table: 66.6 → 75.2 GFLOPs,
# +13%). But the standard backward reads $P$ and writes/reads $dP$ and $dS$ — several $N \times N$ matrices
# through HBM — while FlashAttention's moves only $N \times d$ tensors. Attention is memory-bound (lecture 2), so
# bytes win. The IO model for the seeds' configuration (GPT-2 medium, A100):

# %%
cfg = dict(batch=64, heads=16, seq_len=1024, head_dim=64)
reports = {}
for label, fwd_only, fn in (("standard fwd", True, iosim.standard_attention_io),
                            ("flash fwd", True, iosim.flash_attention_io)):
    kw = dict(mask=True, dropout=0.1) if "standard" in label else dict(dropout=0.1)
    reports[label] = fn(**cfg, backward=False, **kw)
reports["standard fwd+bwd"] = iosim.standard_attention_io(**cfg, mask=True, dropout=0.1)
reports["flash fwd+bwd"] = iosim.flash_attention_io(**cfg, dropout=0.1)
rows = {}
for alg in ("standard", "flash"):
    f, fb = reports[f"{alg} fwd"], reports[f"{alg} fwd+bwd"]
    rows[alg] = {"fwd": (f.matmul_flops, f.hbm_bytes, f.runtime_estimate()),
                 "bwd": (fb.matmul_flops - f.matmul_flops, fb.hbm_bytes - f.hbm_bytes,
                         fb.runtime_estimate() - f.runtime_estimate())}
print(f"{'':10}{'pass':>5}{'matmul GFLOPs':>15}{'HBM GB':>9}{'roofline ms':>13}")
for alg, r in rows.items():
    for p, (fl, by, t) in r.items():
        print(f"{alg:10}{p:>5}{fl / 1e9:15.1f}{by / 1e9:9.2f}{t * 1e3:13.2f}")
bwd_fl = rows["flash"]["bwd"][0] / rows["standard"]["bwd"][0]
print(f"backward: flash does {bwd_fl:.2f}x the matmul FLOPs (10/8), moves "
      f"{rows['standard']['bwd'][1] / rows['flash']['bwd'][1]:.1f}x fewer bytes, estimated "
      f"{rows['standard']['bwd'][2] / rows['flash']['bwd'][2]:.1f}x faster")

fig, ax = plt.subplots(1, 3, figsize=(9, 2.8))
for a, idx, title in zip(ax, range(3), ("matmul GFLOPs", "HBM GB", "roofline ms")):
    scale = 1e9 if idx < 2 else 1e-3
    vals = [[rows[alg][p][idx] / scale for alg in ("standard", "flash")] for p in ("fwd", "bwd")]
    a.bar(["standard", "flash"], vals[0], label="forward")
    a.bar(["standard", "flash"], vals[1], bottom=vals[0], label="backward")
    a.set_title(title)
ax[0].legend(fontsize=8)
fig.suptitle("GPT-2 medium attention on an A100 (IO model): more FLOPs, far fewer bytes, less time")
plt.tight_layout()

# %% [markdown]
# The roofline estimate is a lower bound, not a measurement; the seeds' measured figures are 41.7 ms vs
# 7.3 ms for forward + backward. The lesson carries over to every later lecture: on modern accelerators,
# **recomputing is cheaper than re-reading** whenever the recomputation stays on chip.
