# %% [markdown]
# # Lecture 4 — The backward pass: recomputation beats storage
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

# %%
import math
import tracemalloc

import numpy as np
import torch

from lectures._plots import setup
from reference import iosim
from reference.numpy.attention import attention, attention_backward
from reference.numpy.flash import flash_attention_backward, flash_attention_forward

plt = setup()
rng = np.random.default_rng(4)

# %% [markdown]
# ## 1. Gradients of attention
#
# Forward: $S = \tau QK^\top$ ($\tau = 1/\sqrt d$), $P = \mathrm{softmax}(S)$ row-wise, $O = PV$. Given
# $dO = \partial \mathcal{L}/\partial O$, the chain rule gives
#
# $$dV = P^\top dO, \qquad dP = dO\, V^\top, \qquad dS_{ij} = P_{ij}\,(dP_{ij} - D_i), \qquad dQ = \tau\, dS\, K, \qquad dK = \tau\, dS^\top Q,$$
#
# where the softmax Jacobian contributes $D_i = \sum_j P_{ij}\, dP_{ij}$. FlashAttention-2 uses the identity
#
# $$D_i = \sum_j P_{ij}\, (dO_i \cdot v_j) = dO_i \cdot \Big(\sum_j P_{ij} v_j\Big) = dO_i \cdot O_i = \mathrm{rowsum}(dO \circ O)_i ,$$
#
# so $D$ is computed from two $N \times d$ matrices, before any tile of $P$ exists. The slides show the first
# gradient in the form FlashAttention uses it: column $j$ of $dV$ is
# $dv_j = \sum_i P_{ij}\, do_i = \sum_i \frac{e^{q_i^\top k_j}}{L_i} do_i$ — every $P_{ij}$ it needs can be rebuilt from
# $q_i$, $k_j$ and the row's normaliser.

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
# * line 15: $dQ_i \mathrel{+}= \tau\, dS K_j$ (in HBM; on a GPU an atomic add, since several $j$ blocks update the
#   same $dQ_i$); line 16: $dK_j \mathrel{+}= \tau\, dS^\top Q_i$;
# * line 18: write $dK_j, dV_j$ once.
#
# The loop order is swapped relative to the forward (outer over $K/V$): $dK_j, dV_j$ accumulate on chip and are
# written once, while $dQ$ takes the read-modify-write traffic. Causal tiles above the diagonal are skipped as
# in the forward pass.

# %% [markdown]
# ## 3. Checked against autograd
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
# ## 4. What must be stored between forward and backward
#
# Per head, standard attention keeps $P$ ($N^2$ values) for its backward; FlashAttention keeps $O$ (already an
# output) and $L$ ($N$ values). Measured peak allocation of the backward call itself (one head, $d = 64$,
# float32):

# %%
def peak_mb(fn):
    tracemalloc.start(); fn(); peak = tracemalloc.get_traced_memory()[1]; tracemalloc.stop()
    return peak / 1e6

for n in (512, 1024, 2048):
    q, k, v, do = (rng.standard_normal((n, 64)).astype(np.float32) for _ in range(4))
    o, lse = flash_attention_forward(q, k, v)
    std = peak_mb(lambda: attention_backward(q, k, v, do))
    fla = peak_mb(lambda: flash_attention_backward(q, k, v, o, lse, do))
    print(f"N={n:5d}: saved for backward: P {n * n * 4 / 1e6:6.1f} MB vs O + L {(n * 64 + n) * 4 / 1e6:5.2f} MB;"
          f"  backward peak: standard {std:6.1f} MB, flash {fla:5.2f} MB")

# %% [markdown]
# ## 5. Why recomputation is faster despite more FLOPs
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
