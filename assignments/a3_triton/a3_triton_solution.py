# %% [markdown]
# # Assignment 3 -- Triton: a fused softmax and FlashAttention-2 on the GPU
#
# In assignment 2 the tiles were NumPy slices and the "SRAM" was your CPU cache. Now each tile is owned by a
# Triton **program** (one thread block on a streaming multiprocessor): it loads its tiles from HBM into
# registers/shared memory with `tl.load`, computes with `tl.dot` on tensor cores, and writes only the result
# back with `tl.store`. The algorithm is the one you already wrote.
#
# You will write
# 1. `softmax(x)` -- a fused row softmax (one HBM read and one write per element),
# 2. `flash_attention_forward(q, k, v, causal=False, scale=None) -> (o, lse)` -- the FA2 forward kernel with a
#    bottom-right causal mask, ragged `N` (no multiple of the block size) and GQA,
# 3. `flash_attention(q, k, v, causal=False, scale=None)` -- a `torch.autograd.Function` whose backward is in
#    Triton too (last part; the hardest).
#
# **No GPU?** Everything runs on a laptop: with no CUDA device the first cell sets `TRITON_INTERPRET=1`, and
# Triton then *interprets* your kernels on CPU tensors with NumPy -- slow, so the visible checks use small
# shapes. The grader runs the hidden cases (fp16/bf16/fp32, `N = 1`, ragged, GQA, causal `Nq != Nk`, fully
# masked rows, large logits) the same way, and on a GPU also times you against the course's kernels.
# Forbidden: `torch.softmax`/`F.softmax`/`Tensor.softmax`, `scaled_dot_product_attention`, `flash_attn`,
# the course's `reference` package. Torch is fine for allocating outputs and for glue.
#
# Layout: `q (B, Hq, Nq, d)`, `k, v (B, Hkv, Nk, d)`, `d` in {16, 32, 64, 128}; `o` like `q`; `lse (B, Hq, Nq)`
# float32, natural log; query head `h` reads kv head `h // (Hq // Hkv)`; row `i` may attend key `j` iff
# `j <= i + Nk - Nq`; a row that attends nothing has `o = 0`, `lse = -inf`.

# %% given="triton_setup"

# %%
import math

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_attention_inputs(q, k, v):
    """Given: validate ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)``; return ``(B, Hq, Hkv, Nq, Nk, d)``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or x.dtype != q.dtype:
            raise TypeError(f"q, k, v must share one dtype among float16/bfloat16/float32, got {name} {x.dtype}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, N, d), got {tuple(x.shape)}")
    B, Hq, Nq, d = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != d:
        raise ValueError(f"k and v must have shape (B={B}, Hkv, Nk, d={d}), got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    Hkv, Nk = k.shape[1], k.shape[2]
    if Hkv == 0 or Hq % Hkv or min(B, Nq, Nk) == 0:
        raise ValueError(f"need Hq % Hkv == 0 and B, Nq, Nk >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if d not in (16, 32, 64, 128):
        raise ValueError(f"head dimension d must be one of 16, 32, 64, 128, got {d}")
    return B, Hq, Hkv, Nq, Nk, d


# %% [markdown]
# ## Part 1 -- fused softmax
#
# `torch` without fusion would launch one kernel for the max, one for `exp`, one for the sum, one for the
# division -- and read and write the whole matrix from HBM each time. A fused kernel gives each row to one
# program, which loads the row once, does everything in registers and stores once: softmax is memory-bound,
# so fewer bytes is faster.
#
# Write `_softmax_kernel` (one program per row) and the wrapper `softmax(x)` (any shape; softmax over the
# last axis; output in `x.dtype`; compute in float32). A row that fits in one block (`n_cols <= BLOCK`) is
# loaded once. For longer rows, loop over column blocks with the online softmax of assignment 1 (running max
# and sum) and then write a second pass. Use `other=-inf` for out-of-range columns, and make an all `-inf`
# row give zeros rather than NaN.

# %%
@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr):
    """Row softmax, one program per row; online max/sum over column blocks when the row is longer than BLOCK."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    ### BEGIN SOLUTION
    if ONE_BLOCK:
        x = tl.load(x_row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        m = tl.where(m == float("-inf"), 0.0, m)  # all -inf row: exp2(-inf) = 0, not NaN
        e = tl.exp2((x - m) * LOG2E)
        s = tl.sum(e, axis=0)
        y = e / tl.where(s == 0.0, 1.0, s)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)
    else:
        m = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane running max and sum, merged at the end
        l = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n_cols, BLOCK):
            x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, x)
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            l = l * tl.exp2((m - shift) * LOG2E) + tl.exp2((x - shift) * LOG2E)
            m = m_new
        m_row = tl.max(m, axis=0)
        shift_row = tl.where(m_row == float("-inf"), 0.0, m_row)
        l_row = tl.sum(l * tl.exp2((m - shift_row) * LOG2E), axis=0)
        l_row = tl.where(l_row == 0.0, 1.0, l_row)
        for start in range(0, n_cols, BLOCK):
            x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
            y = tl.exp2((x - shift_row) * LOG2E) / l_row
            tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=start + cols < n_cols)
    ### END SOLUTION


def softmax(x):
    """Fused softmax over the last axis of a float16/bfloat16/float32 tensor (same shape and dtype out)."""
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"x must be a float16/bfloat16/float32 torch.Tensor, got {getattr(x, 'dtype', type(x))}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension")
    ### BEGIN SOLUTION
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols).contiguous()
    y = torch.empty_like(x2)
    if x2.numel() == 0:
        return y.reshape(x.shape)
    block = min(triton.next_power_of_2(n_cols), 4096)
    num_warps = 4 if block <= 1024 else 8 if block <= 2048 else 16
    _softmax_kernel[(x2.shape[0],)](x2, y, n_cols, x2.stride(0), y.stride(0),
                                    BLOCK=block, ONE_BLOCK=n_cols <= block, num_warps=num_warps)
    return y.reshape(x.shape)
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a3.softmax", softmax)

# %% [markdown]
# ## Part 2 -- the FlashAttention-2 forward kernel
#
# Grid: `(cdiv(Nq, BLOCK_M), B * Hq)`. Program `(i, bh)` owns query rows `[i*BLOCK_M, (i+1)*BLOCK_M)` of
# batch `bh // Hq`, head `bh % Hq`, and runs Algorithm 1's inner loop (lines 6-11) over key blocks of
# `BLOCK_N` rows, then lines 12-13. Hints:
#
# * Pointers: `base + rows[:, None] * stride_n + cols[None, :]`, loads masked with `rows < N` for the ragged
#   tail (`other=0.0`). Score columns past `Nk` must become `-inf` before the max.
# * Fold `scale * log2(e)` into one factor and use `tl.exp2`; `lse` is `(m + log2(l)) / log2(e)`.
# * Causal: row `i` sees keys `j <= i + Nk - Nq`; stop the key loop after the last key any row of the block
#   may see (that halves the work). A row may have seen only masked keys so far: guard `m = -inf` as in A2.
# * Use the given `dot(a, b)` (it is `tl.dot`, with a fix for the interpreter). Both operands must have
#   the same dtype: cast `p` to `v`'s dtype before `p @ v`; accumulate in float32.
# * GQA: kv head = `h // (Hq // Hkv)`: nothing else changes.

# %%
@triton.jit
def _flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                      sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
                      Hq, group, Nq, Nk, qk_scale,
                      CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """FA2 Algorithm 1 for one (query block, batch*head); scores kept in base 2 (qk_scale = scale * log2 e)."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // Hq, bh % Hq
    hk = h // group  # GQA: the kv head this query head reads
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_base = q_ptr + b.to(tl.int64) * sqb + h * sqh
    k_base = k_ptr + b.to(tl.int64) * skb + hk * skh
    v_base = v_ptr + b.to(tl.int64) * svb + hk * svh
    ### BEGIN SOLUTION
    q = tl.load(q_base + offs_m[:, None] * sqn + offs_d[None, :], mask=offs_m[:, None] < Nq, other=0.0)  # line 4
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # line 5
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    offset = Nk - Nq  # bottom-right causal alignment
    hi = Nk
    if CAUSAL:
        hi = tl.minimum(Nk, start_m + BLOCK_M + offset)  # last key any row of this block may see, + 1
    for start_n in range(0, hi, BLOCK_N):  # line 6
        cols = start_n + offs_n
        k = tl.load(k_base + cols[:, None] * skn + offs_d[None, :], mask=cols[:, None] < Nk, other=0.0)  # line 7
        v = tl.load(v_base + cols[:, None] * svn + offs_d[None, :], mask=cols[:, None] < Nk, other=0.0)
        s = dot(q, tl.trans(k)) * qk_scale  # line 8 (base-2 units)
        allowed = cols[None, :] < Nk
        if CAUSAL:
            allowed = allowed & (cols[None, :] <= offs_m[:, None] + offset)
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # line 9
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v)  # line 10
        m_i = m_new
    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]  # line 12
    lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) / LOG2E, float("-inf"))  # line 13
    o_base = o_ptr + b.to(tl.int64) * sob + h * soh
    tl.store(o_base + offs_m[:, None] * son + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Nq)  # line 14
    tl.store(lse_ptr + bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)  # line 15
    ### END SOLUTION


def flash_attention_forward(q, k, v, causal=False, scale=None):
    """FlashAttention-2 forward in Triton: returns ``o`` (like ``q``) and ``lse (B, Hq, Nq)`` float32."""
    B, Hq, Hkv, Nq, Nk, d = check_attention_inputs(q, k, v)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
    ### BEGIN SOLUTION
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    BLOCK_M, BLOCK_N = 64, 64
    grid = (triton.cdiv(Nq, BLOCK_M), B * Hq)
    _flash_fwd_kernel[grid](q, k, v, o, lse,
                            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                            v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
                            Hq, Hq // Hkv, Nq, Nk, scale * LOG2E.value,
                            CAUSAL=bool(causal), D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4)
    ### END SOLUTION
    return o, lse


# %% tags=["check"]
from autograder.check import check

check("a3.flash_attention_forward", flash_attention_forward)

# %% [markdown]
# ## Part 3 -- the backward kernels (last part)
#
# The math is assignment 2's: $D = \mathrm{rowsum}(dO \circ O)$, $P = e^{S - L}$ recomputed per tile,
# $dV = P^T dO$, $dP = dO V^T$, $dS = P \circ (dP - D)$, $dQ = \mathrm{scale}\cdot dS K$,
# $dK = \mathrm{scale}\cdot dS^T Q$ (notation: the conventions box of
# [lecture 4](../../lectures/04_backward_recomputation.ipynb#conventions) -- `lse` is the natural-log
# log-sum-exp of the *scaled* scores, converted to base 2 inside the kernels). This part splits the work so
# that no two programs write the same output:
#
# * `_bwd_preprocess`: one program per query block computes `D` (B, Hq, Nq).
# * `_bwd_dkdv`: one program per (key block, batch * **kv** head) keeps `dK_j`, `dV_j` in registers and loops
#   over every query block of every query head in its GQA group (so the group sum needs no atomics).
# * `_bwd_dq`: one program per (query block, batch * head) keeps `dQ_i` and loops over key blocks.
#
# That is one of three ways to handle $dQ$ (lecture 4, section 3). The FlashAttention-2 paper and its CUDA
# code instead let each dK/dV program atomically add its $dS K_j$ into an fp32 $dQ$ buffer (no recomputation,
# but a non-deterministic summation order and a conversion kernel); the Triton tutorial loops over key blocks
# for $dQ$ inside the dK/dV kernel. The separate `_bwd_dq` pass recomputes $S$ and $dP$ (backward matmul
# FLOPs $14N^2d$ instead of $10N^2d$) and in exchange is deterministic and needs no atomics. Fully masked rows
# have `lse = -inf`; treat it as `+inf` so that their `P` row is `0`.

# %%
@triton.jit
def _bwd_preprocess(o_ptr, do_ptr, delta_ptr, Nq, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """D = rowsum(dO * O) for contiguous (B*Hq, Nq, d) o and do."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    ### BEGIN SOLUTION
    ptrs = bh * Nq * D + offs_m[:, None] * D + offs_d[None, :]
    o = tl.load(o_ptr + ptrs, mask=offs_m[:, None] < Nq, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + ptrs, mask=offs_m[:, None] < Nq, other=0.0).to(tl.float32)
    tl.store(delta_ptr + bh * Nq + offs_m, tl.sum(o * do, axis=1), mask=offs_m < Nq)
    ### END SOLUTION


@triton.jit
def _bwd_dkdv(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
              Hq, Hkv, group, Nq, Nk, sm_scale,
              CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK_j, dV_j for one key block of one kv head (contiguous layouts), summed over the query heads of its group."""
    start_n = tl.program_id(0) * BLOCK_N
    bhk = tl.program_id(1)
    b, hk = bhk // Hkv, bhk % Hkv
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    kv_ptrs = bhk.to(tl.int64) * Nk * D + offs_n[:, None] * D + offs_d[None, :]
    ### BEGIN SOLUTION
    k = tl.load(k_ptr + kv_ptrs, mask=offs_n[:, None] < Nk, other=0.0)
    v = tl.load(v_ptr + kv_ptrs, mask=offs_n[:, None] < Nk, other=0.0)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, D], tl.float32)
    qk_scale = sm_scale * LOG2E
    offset = Nk - Nq
    lo = 0
    if CAUSAL:  # query rows i < start_n - offset cannot see any key of this block
        lo = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
    for g in range(0, group):
        bh = (b * Hq + hk * group + g).to(tl.int64)
        for start_m in range(lo, Nq, BLOCK_M):
            offs_m = start_m + offs_m0
            row_ok = offs_m < Nq
            q_ptrs = bh * Nq * D + offs_m[:, None] * D + offs_d[None, :]
            q = tl.load(q_ptr + q_ptrs, mask=row_ok[:, None], other=0.0)
            do = tl.load(do_ptr + q_ptrs, mask=row_ok[:, None], other=0.0)
            lse = tl.load(lse_ptr + bh * Nq + offs_m, mask=row_ok, other=float("inf"))
            lse = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E  # fully masked row -> P = 0
            delta = tl.load(delta_ptr + bh * Nq + offs_m, mask=row_ok, other=0.0)
            s = dot(q, tl.trans(k)) * qk_scale
            allowed = offs_n[None, :] < Nk
            if CAUSAL:
                allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + offset)
            p = tl.exp2(tl.where(allowed, s, float("-inf")) - lse[:, None])  # P = exp(S - L), recomputed
            dv += dot(tl.trans(p.to(do.dtype)), do)  # dV = P^T dO
            dp = dot(do, tl.trans(v)).to(tl.float32)  # dP = dO V^T
            ds = p * (dp - delta[:, None])  # dS = P o (dP - D)
            dk += dot(tl.trans(ds.to(q.dtype)), q)  # dK = dS^T Q (scaled below)
    tl.store(dk_ptr + kv_ptrs, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=offs_n[:, None] < Nk)
    tl.store(dv_ptr + kv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=offs_n[:, None] < Nk)
    ### END SOLUTION


@triton.jit
def _bwd_dq(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
            Hq, group, Nq, Nk, sm_scale,
            CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ_i for one query block of one query head (contiguous layouts), looping over key blocks."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    bhk = (bh // Hq) * (Hq // group) + (bh % Hq) // group  # b * Hkv + kv head
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_ptrs = bh * Nq * D + offs_m[:, None] * D + offs_d[None, :]
    ### BEGIN SOLUTION
    row_ok = offs_m < Nq
    q = tl.load(q_ptr + q_ptrs, mask=row_ok[:, None], other=0.0)
    do = tl.load(do_ptr + q_ptrs, mask=row_ok[:, None], other=0.0)
    lse = tl.load(lse_ptr + bh * Nq + offs_m, mask=row_ok, other=float("inf"))
    lse = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    delta = tl.load(delta_ptr + bh * Nq + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    qk_scale = sm_scale * LOG2E
    offset = Nk - Nq
    hi = Nk
    if CAUSAL:
        hi = tl.minimum(Nk, start_m + BLOCK_M + offset)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        kv_ptrs = bhk * Nk * D + offs_n[:, None] * D + offs_d[None, :]
        k = tl.load(k_ptr + kv_ptrs, mask=offs_n[:, None] < Nk, other=0.0)
        v = tl.load(v_ptr + kv_ptrs, mask=offs_n[:, None] < Nk, other=0.0)
        s = dot(q, tl.trans(k)) * qk_scale
        allowed = offs_n[None, :] < Nk
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + offset)
        p = tl.exp2(tl.where(allowed, s, float("-inf")) - lse[:, None])
        dp = dot(do, tl.trans(v)).to(tl.float32)
        ds = p * (dp - delta[:, None])
        dq += dot(ds.to(k.dtype), k)  # dQ = dS K (scaled below)
    tl.store(dq_ptr + q_ptrs, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=row_ok[:, None])
    ### END SOLUTION


class FlashAttention(torch.autograd.Function):
    """Forward: the Part 2 kernel (saves o and lse). Backward: preprocess D, then the dK/dV and dQ kernels."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        o, lse = flash_attention_forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        B, Hq, Hkv, Nq, Nk, d = check_attention_inputs(q, k, v)
        scale = 1.0 / math.sqrt(d) if ctx.scale is None else float(ctx.scale)
        ### BEGIN SOLUTION
        q, k, v, o, do = (x.contiguous() for x in (q, k, v, o, do))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        delta = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
        BLOCK_M, BLOCK_N = 64, 64
        _bwd_preprocess[(triton.cdiv(Nq, BLOCK_M), B * Hq)](o, do, delta, Nq, D=d, BLOCK_M=BLOCK_M)
        _bwd_dkdv[(triton.cdiv(Nk, BLOCK_N), B * Hkv)](q, k, v, do, lse, delta, dk, dv,
                                                      Hq, Hkv, Hq // Hkv, Nq, Nk, scale, CAUSAL=bool(ctx.causal),
                                                      D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4)
        _bwd_dq[(triton.cdiv(Nq, BLOCK_M), B * Hq)](q, k, v, do, lse, delta, dq,
                                                   Hq, Hq // Hkv, Nq, Nk, scale, CAUSAL=bool(ctx.causal),
                                                   D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4)
        ### END SOLUTION
        return dq, dk, dv, None, None


def flash_attention(q, k, v, causal=False, scale=None):
    """Differentiable FlashAttention-2: ``o = flash_attention(q, k, v)``; ``o.backward(do)`` runs the Triton backward."""
    return FlashAttention.apply(q, k, v, causal, scale)


# %% tags=["check"]
from autograder.check import check

check("a3.flash_attention", flash_attention)

# %% [markdown]
# ## Going further (ungraded, needs a GPU)
#
# * Time your forward against `torch.nn.functional.scaled_dot_product_attention` with
#   `triton.testing.do_bench` for `N` in 512..16k (batch x N = 16k, hidden 2048). Report TFLOP/s
#   (`4 * B * H * N^2 * d`, halved for causal).
# * Try `BLOCK_M = 128` and `num_stages = 3` for `d = 64`; watch shared-memory limits for `d = 128`.
