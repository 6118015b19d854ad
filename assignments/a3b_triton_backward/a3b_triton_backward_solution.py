# %% [markdown]
# # Assignment 3b -- Triton: the FlashAttention-2 backward, in stages
#
# Assignment 3 wrote the forward: `o` and the log-sum-exp `lse` of every query row, nothing of size
# `Nq x Nk`. The backward recomputes the attention matrix tile by tile from `q`, `k` and `lse` (FA2 paper,
# Algorithm 2; lecture 4). You build it in four parts, each with its own function, its own `check()` cell and
# its own lines in the grade. The grader calls Parts 2 and 3 on their own, with `lse` and `delta` computed
# from an exact float64 forward (not from your Part 1), so a bug in one part costs only that part's points:
#
# 1. `flash_bwd_preprocess(o, do) -> delta` -- `D = rowsum(dO * O)` (line 4 of Algorithm 2);
# 2. `flash_bwd_dkdv(q, k, v, do, lse, delta, causal=False, scale=None) -> (dk, dv)` -- one program per key
#    block, summed over the query heads of its GQA group;
# 3. `flash_bwd_dq(q, k, v, do, lse, delta, causal=False, scale=None) -> dq` -- one program per query block;
# 4. `flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None)` and the differentiable
#    `flash_attention(q, k, v, causal=False, scale=None)` (a `torch.autograd.Function`) that tie them to a
#    given forward.
#
# Expect about 8-12 hours: Part 1 1 h, Part 2 4-6 h (the hardest: recomputation, masks, the GQA sum), Part 3
# 2-3 h (Part 2's loop turned inside out), Part 4 1-2 h.
#
# Read lecture 4 (sections 1-3: the gradients, Algorithm 2 line by line, where $dQ$ goes) and lecture 5
# (sections 3-4: Triton programs) first; the line numbers below are those of lecture 4's Algorithm 2.
#
# **No GPU?** As in assignment 3, the first cell sets `TRITON_INTERPRET=1` without a CUDA device and your
# kernels run on CPU tensors (slowly; the visible checks use small shapes). Forbidden: `torch.softmax` and
# friends, `scaled_dot_product_attention`, `flash_attn`, the course's `reference` package, and torch autograd
# for the gradients. Torch is fine for allocating outputs and for glue.
#
# Layout as in assignment 3: `q, o, do (B, Hq, Nq, d)`, `k, v (B, Hkv, Nk, d)`, `lse, delta (B, Hq, Nq)`
# float32; query head `h` reads kv head `h // (Hq // Hkv)`; row `i` may attend key `j` iff `j <= i + Nk - Nq`;
# a row that attends nothing has `lse = -inf` and zero gradients.

# %% given="triton_setup"

# %% given="attention_inputs"

# %% given="triton_program"

# %% [markdown]
# The forward is given, in plain torch (it stores the `Nq x Nk` scores, which a FlashAttention forward never
# does; it is here only so that Part 4 has something to differentiate). It returns exactly what your
# assignment-3 kernel returns.

# %% given="attention_forward_torch"

# %% [markdown]
# ## The math
#
# With $P = e^{\mathrm{scale}\cdot QK^T - L}$ (`L` = `lse`, the natural-log log-sum-exp of the *scaled* scores):
# $dV = P^T dO$, $dP = dO\,V^T$, $dS = P \circ (dP - D)$ with $D = \mathrm{rowsum}(dO \circ O)$,
# $dQ = \mathrm{scale}\cdot dS\,K$, $dK = \mathrm{scale}\cdot dS^T Q$ (lecture 4 derives $dS$ from the softmax
# Jacobian; its [conventions box](../../lectures/04_backward_recomputation.ipynb#conventions) says where the
# scale sits and why the kernels work in base 2). Fully masked rows have `lse = -inf`: treat it as `+inf`
# inside the kernels so that their `P` row is `0` (not `exp(s + inf)`).
#
# ## Part 1 -- preprocess: D = rowsum(dO * O)
#
# One program per (query block, batch * head) loads a `BLOCK_M x d` tile of `o` and of `do`, multiplies them
# in float32 and sums each row. The wrapper allocates `delta (B, H, Nq)` float32 and launches the grid
# `(cdiv(Nq, BLOCK_M), B * H)`; mask the ragged last block. The kernel takes no strides: make `o` and `do`
# contiguous, so that row `n` of program `bh` starts at `(bh * Nq + n) * D`, and `delta`'s at `bh * Nq + n`.
#
# Graded (11 points): `N` a multiple of the block, ragged `N` and `N = 1`, batch `B > 1`, float16 (and
# bfloat16 on a GPU).

# %%
@triton.jit
def _bwd_preprocess(o_ptr, do_ptr, delta_ptr, Nq, D: tl.constexpr, BLOCK_M: tl.constexpr):
    """FA2 Algorithm 2, line 4: D = rowsum(dO * O) for contiguous (B*H, Nq, d) o and do."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    ### BEGIN SOLUTION
    ptrs = bh * Nq * D + offs_m[:, None] * D + offs_d[None, :]
    o = tl.load(o_ptr + ptrs, mask=offs_m[:, None] < Nq, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + ptrs, mask=offs_m[:, None] < Nq, other=0.0).to(tl.float32)
    tl.store(delta_ptr + bh * Nq + offs_m, tl.sum(o * do, axis=1), mask=offs_m < Nq)
    ### END SOLUTION


def flash_bwd_preprocess(o, do):
    """``delta = rowsum(do * o)`` over the last axis: ``(B, H, Nq)`` float32 for ``o, do (B, H, Nq, d)``."""
    if not isinstance(o, torch.Tensor) or not isinstance(do, torch.Tensor):
        raise TypeError(f"o and do must be torch.Tensors, got {type(o).__name__}, {type(do).__name__}")
    if o.dim() != 4 or do.shape != o.shape or do.dtype != o.dtype or o.shape[-1] not in (16, 32, 64, 128):
        raise ValueError(f"o and do must share one shape (B, H, Nq, d), d in 16..128, and one dtype, got "
                         f"o {tuple(o.shape)} {o.dtype}, do {tuple(do.shape)} {do.dtype}")
    B, H, Nq, d = o.shape
    ### BEGIN SOLUTION
    o, do = o.contiguous(), do.contiguous()
    delta = torch.empty((B, H, Nq), device=o.device, dtype=torch.float32)
    BLOCK_M = 64
    _bwd_preprocess[(triton.cdiv(Nq, BLOCK_M), B * H)](o, do, delta, Nq, D=d, BLOCK_M=BLOCK_M)
    return delta
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a3b.flash_bwd_preprocess", flash_bwd_preprocess)

# %% [markdown]
# ## Part 2 -- dK and dV
#
# One program per (key block `j`, batch * **kv** head) keeps `K_j`, `V_j` and the accumulators `dK_j`,
# `dV_j` on chip and loops over every query block of every query head in its GQA group (lines 6-17 of
# Algorithm 2 without line 15's `dQ` update). Because one program owns `dK_j`, `dV_j` of its kv head, the
# group sum needs no atomics. The query heads of kv head `hk` are `hk * group + g` for `g = 0 .. group - 1`
# (the inverse of `h // group`): loop over `g`, then over the query blocks `i` of head `hk * group + g`. Per
# query block `i`:
#
# * load `Q_i`, `dO_i` `(BLOCK_M, D)`, `L_i` (as `L_i * log2 e`, with `-inf` turned into `+inf`) and `D_i`
#   `(BLOCK_M,)`; rows past `Nq` are masked (`other=+inf` for `L` gives them `P = 0`);
# * `S = Q_i K_j^T * scale * log2 e` `(BLOCK_M, BLOCK_N)`, masked to `-inf` where a key is past `Nk` or
#   (causal) not visible; `P = exp2(S - L_i)` -- the forward's probabilities, recomputed (lines 10-11);
# * `dV_j += P^T dO_i`, `dP = dO_i V_j^T`, `dS = P o (dP - D_i)`, `dK_j += dS^T Q_i` (lines 12-14, 16).
#
# Store `dK_j * scale` and `dV_j` (in the inputs' dtype; line 18). Causal: query rows
# `i < j_start - (Nk - Nq)` see no key of this block, so start the query loop at the first block that can.
# `dot(a, b)` needs both operands in one dtype: cast `P` and `dS` to the inputs' dtype before the matmuls,
# accumulate in float32. `K_j^T` is `tl.trans(k)`. The layouts are contiguous `(B*H, N, D)`: the given
# `kv_ptrs` addresses this program's `K_j`, `V_j`, `dK_j`, `dV_j`.
#
# Graded (38 points): ragged `N` and `Nq = 1`, causal with `Nq != Nk` both ways (fully masked rows must get
# zero gradients), GQA (`dK`, `dV` summed over the group), float16 (and bfloat16 on a GPU).

# %%
@triton.jit
def _bwd_dkdv(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
              Hq, Hkv, group, Nq, Nk, sm_scale,
              CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dK_j, dV_j for one key block of one kv head (contiguous layouts), summed over the query heads of its group."""
    start_n, offs_n, bhk, b, hk = program_block(Hkv, BLOCK_N)
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


def check_backward_inputs(q, k, v, do, lse, delta):
    """Given: validate the inputs of Parts 2 and 3; return ``(B, Hq, Hkv, Nq, Nk, d)``."""
    B, Hq, Hkv, Nq, Nk, d = check_attention_inputs(q, k, v)
    if not isinstance(do, torch.Tensor) or do.shape != q.shape or do.dtype != q.dtype:
        raise ValueError(f"do must be a tensor of q's shape {tuple(q.shape)} and dtype {q.dtype}, got "
                         f"{getattr(do, 'shape', type(do).__name__)}")
    for name, x in (("lse", lse), ("delta", delta)):
        if not isinstance(x, torch.Tensor) or x.shape != q.shape[:3] or x.dtype != torch.float32:
            raise ValueError(f"{name} must be a float32 tensor of shape (B, Hq, Nq) = {tuple(q.shape[:3])}, got "
                             f"{getattr(x, 'shape', type(x).__name__)} {getattr(x, 'dtype', '')}")
    return B, Hq, Hkv, Nq, Nk, d


def flash_bwd_dkdv(q, k, v, do, lse, delta, causal=False, scale=None):
    """``(dk, dv)`` (like ``k``, ``v``) of ``sum(o * do)``: FA2 Algorithm 2 by key blocks, GQA summed in registers."""
    B, Hq, Hkv, Nq, Nk, d = check_backward_inputs(q, k, v, do, lse, delta)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    ### BEGIN SOLUTION
    q, k, v, do, lse, delta = (x.contiguous() for x in (q, k, v, do, lse, delta))
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    BLOCK_M, BLOCK_N = 64, 64
    _bwd_dkdv[(triton.cdiv(Nk, BLOCK_N), B * Hkv)](q, k, v, do, lse, delta, dk, dv,
                                                  Hq, Hkv, Hq // Hkv, Nq, Nk, scale, CAUSAL=bool(causal),
                                                  D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4)
    return dk, dv
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a3b.flash_bwd_dkdv", flash_bwd_dkdv)

# %% [markdown]
# ## Part 3 -- dQ
#
# One program per (query block `i`, batch * head) keeps `Q_i`, `dO_i`, `L_i`, `D_i` and the accumulator
# `dQ_i` on chip and loops over the key blocks its rows can see (causal: stop early, as the forward does),
# recomputing `P` and `dS` exactly as in Part 2, then `dQ_i += dS K_j` (line 15). Store `dQ_i * scale`. The
# given `bhk` is the row of the kv head this query head reads (`b * Hkv + h // group`), and `q_ptrs` addresses
# this program's `Q_i`, `dO_i` and `dQ_i`.
#
# Graded (28 points): the same cases as Part 2 (GQA: each query head reads its own kv head, no sum).
#
# That is one of three ways to handle $dQ$ (lecture 4, section 3). The FlashAttention-2 paper and its CUDA
# code instead let each dK/dV program atomically add its $dS K_j$ into an fp32 $dQ$ buffer (no recomputation,
# but a non-deterministic summation order and a conversion kernel); the Triton tutorial loops over key blocks
# for $dQ$ inside the dK/dV kernel. The separate pass recomputes $S$ and $dP$ (backward matmul FLOPs
# $14N^2d$ instead of $10N^2d$) and in exchange is deterministic and needs no atomics.

# %%
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


def flash_bwd_dq(q, k, v, do, lse, delta, causal=False, scale=None):
    """``dq`` (like ``q``) of ``sum(o * do)``: FA2 Algorithm 2, line 15, as a separate pass by query blocks."""
    B, Hq, Hkv, Nq, Nk, d = check_backward_inputs(q, k, v, do, lse, delta)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    ### BEGIN SOLUTION
    q, k, v, do, lse, delta = (x.contiguous() for x in (q, k, v, do, lse, delta))
    dq = torch.empty_like(q)
    BLOCK_M, BLOCK_N = 64, 64
    _bwd_dq[(triton.cdiv(Nq, BLOCK_M), B * Hq)](q, k, v, do, lse, delta, dq,
                                               Hq, Hq // Hkv, Nq, Nk, scale, CAUSAL=bool(causal),
                                               D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4)
    return dq
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a3b.flash_bwd_dq", flash_bwd_dq)

# %% [markdown]
# ## Part 4 -- the whole backward, and attention you can call `.backward()` on
#
# `flash_attention_backward(q, k, v, o, lse, do, causal, scale)` runs Parts 1-3 in order and returns
# `(dq, dk, dv)`. `FlashAttention` is a `torch.autograd.Function`: its `forward` calls the given
# `attention_forward` and saves what the backward needs (`ctx.save_for_backward`; never the attention
# matrix), its `backward` receives `do` and returns one gradient per input of `forward` (`None` for `causal`
# and `scale`). `flash_attention` applies it.
#
# Graded (23 points): `flash_attention_backward` (causal and not, MQA, float16: 5), on a GPU its speed against
# the course's backward (8); `o.backward(do)` through `flash_attention` against float64 autograd, causal and not,
# and with a `scale` argument (5 + 5).

# %%
def flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None):
    """Gradients ``(dq, dk, dv)`` of ``sum(o * do)`` for ``o, lse = attention_forward(q, k, v, causal, scale)``."""
    ### BEGIN SOLUTION
    delta = flash_bwd_preprocess(o, do)
    dk, dv = flash_bwd_dkdv(q, k, v, do, lse, delta, causal=causal, scale=scale)
    return flash_bwd_dq(q, k, v, do, lse, delta, causal=causal, scale=scale), dk, dv
    ### END SOLUTION


class FlashAttention(torch.autograd.Function):
    """Forward: the given ``attention_forward`` (saves q, k, v, o, lse). Backward: Parts 1-3."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        """Returns ``o`` only (not ``lse``); keeps what the backward needs on ``ctx`` (tensors through
        ``ctx.save_for_backward``, ``causal`` and ``scale`` as attributes)."""
        ### BEGIN SOLUTION
        o, lse = attention_forward(q, k, v, causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o
        ### END SOLUTION

    @staticmethod
    def backward(ctx, do):
        """One gradient per input of ``forward``, in order: ``dq, dk, dv`` from Parts 1-3, then ``None`` for
        ``causal`` and for ``scale``."""
        ### BEGIN SOLUTION
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do.contiguous(), ctx.causal, ctx.scale)
        return dq, dk, dv, None, None
        ### END SOLUTION


def flash_attention(q, k, v, causal=False, scale=None):
    """Differentiable attention: ``o = flash_attention(q, k, v)``; ``o.backward(do)`` runs your Triton backward."""
    ### BEGIN SOLUTION
    return FlashAttention.apply(q, k, v, causal, scale)
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a3b.flash_attention_backward", flash_attention_backward)

# %% tags=["check"]
from autograder.check import check

check("a3b.flash_attention", flash_attention)

# %% [markdown]
# ## Going further (ungraded, needs a GPU)
#
# * Time `flash_attention_backward` against the backward of `torch.nn.functional.scaled_dot_product_attention`
#   (`triton.testing.do_bench`, batch x N = 16k tokens, d = 64 and 128). At d = 128 the 64 x 64 blocks of
#   Part 2 keep four 64 x 128 tiles in registers: try `BLOCK_M = 32` or `num_warps = 8`.
# * Replace Part 3 by atomic adds of `dS K_j` into a float32 `dQ` buffer from the Part 2 kernel. Is it faster?
#   Are two runs bit-identical?
