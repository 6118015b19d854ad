# %% [markdown]
# # Assignment 3 -- Triton: a fused softmax and the FlashAttention-2 forward on the GPU
#
# In assignment 2 the tiles were NumPy slices and the "SRAM" was your CPU cache. Now each tile is owned by a
# Triton **program** (one thread block on a streaming multiprocessor): it loads its tiles from HBM into
# registers/shared memory with `tl.load`, computes with `tl.dot` on tensor cores, and writes only the result
# back with `tl.store`. The algorithm is the one you already wrote. Lecture 5 (sections 3-4) shows how one
# program maps onto one thread block and runs the course's kernels in the interpreter; lecture 4's
# [conventions box](../../lectures/04_backward_recomputation.ipynb#conventions) fixes the units (`lse` in
# natural log at every API, `exp2` inside the kernels).
#
# Start with the **warm-up** (not graded, 0 points): a first kernel with its own `check()` cell, to get the
# launch, the pointers and the masks right before anything counts; lecture 5a (the Triton primer) teaches
# what it needs. Then three parts (and an optional fourth), each with its own functions, its own `check()`
# cell and its own lines in the grade (a bug in one part costs only that part's points):
# 1. `softmax(x)` -- a fused row softmax (one HBM read and one write per element);
# 2. `flash_attention_forward_basic(q, k, v, scale=None) -> (o, lse)` -- the FA2 forward kernel without a mask
#    and with one kv head per query head: the online softmax over key tiles, ragged `N` (no multiple of the
#    block size);
# 3. `flash_attention_forward(q, k, v, causal=False, scale=None) -> (o, lse)` -- the same kernel with a
#    bottom-right causal mask (`Nq != Nk`, fully masked rows, early loop exit) and GQA;
# 4. optional bonus: `flash_attention_forward_fp8(...)` -- the same forward on FP8 (e4m3) tiles, FlashAttention-3
#    style, graded for accuracy and, on a Hopper GPU, for speed against the course's bf16 forward.
#
# The backward kernels are the next assignment (`a3b_triton_backward`), which gives you a forward to build on.
# Expect about 8-12 hours: Part 1 2-3 h, Part 2 3-5 h (most of it is getting pointers and masks right once),
# Part 3 2-4 h (the optional Part 4: 3-6 h more).
#
# **No GPU?** Everything runs on a laptop: with no CUDA device the first cell sets `TRITON_INTERPRET=1`, and
# Triton then *interprets* your kernels on CPU tensors with NumPy -- slow, so the visible checks use small
# shapes. The grader runs the hidden cases (fp32/fp16, and bf16 on a GPU only; `N = 1`, ragged, GQA, causal
# `Nq != Nk`, fully masked rows, large logits) the same way, and on a GPU also times you against the course's
# kernels.
# Forbidden: `torch.softmax`/`F.softmax`/`Tensor.softmax`, `scaled_dot_product_attention`, `flash_attn`,
# the course's `reference` package. Torch is fine for allocating outputs and for glue.
#
# Layout: `q (B, Hq, Nq, d)`, `k, v (B, Hkv, Nk, d)`, `d` in {16, 32, 64, 128}; `o` like `q`; `lse (B, Hq, Nq)`
# float32, natural log; query head `h` reads kv head `h // (Hq // Hkv)`; row `i` may attend key `j` iff
# `j <= i + Nk - Nq`; a row that attends nothing has `o = 0`, `lse = -inf`.

# %% given="triton_setup"

# %% given="attention_inputs"

# %% given="triton_program"

# %% [markdown]
# ## Warm-up (not graded) -- scale each row
#
# `scale_rows(x, s)` returns `y` with `y[i, j] = s[i] * x[i, j]` for a float32 `x (rows, cols)` and
# `s (rows,)`. Write `_scale_rows_kernel` with a 2-d grid `(rows, cdiv(cols, BLOCK))`: program `(i, c)` loads
# the one scale `s[i]` and the columns `[c * BLOCK, (c + 1) * BLOCK)` of row `i`, masked at the ragged end of
# the row, and stores their product. Then the wrapper: allocate `y`, launch, return it. What you need:
# `tl.program_id(axis)`, `tl.arange`, `tl.load`/`tl.store` with `mask=`, and the row stride
# (`x.stride(0)`); lecture 5a, sections 1-2. The `check()` below runs three visible cases (a ragged row, a row
# longer than one block, a single element); the grader never runs this function.

# %%
@triton.jit
def _scale_rows_kernel(x_ptr, s_ptr, y_ptr, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
    """``y[i, cols] = s[i] * x[i, cols]`` for row ``i = program_id(0)`` and column block ``program_id(1)``."""
    ### BEGIN SOLUTION
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    scale = tl.load(s_ptr + row)
    values = tl.load(x_ptr + row * stride_x + cols, mask=inside)
    tl.store(y_ptr + row * stride_y + cols, scale * values, mask=inside)
    ### END SOLUTION


def scale_rows(x, s):
    """``s[:, None] * x`` by ``_scale_rows_kernel``, for a float32 ``x (rows, cols)`` and ``s (rows,)``."""
    if not (isinstance(x, torch.Tensor) and isinstance(s, torch.Tensor)) or x.dim() != 2 \
            or s.shape != (x.shape[0],):
        raise ValueError(f"x must be (rows, cols) and s (rows,), got {tuple(getattr(x, 'shape', ()))} and "
                         f"{tuple(getattr(s, 'shape', ()))}")
    x = x.contiguous()
    ### BEGIN SOLUTION
    y = torch.empty_like(x)
    block = 256
    _scale_rows_kernel[(x.shape[0], triton.cdiv(x.shape[1], block))](x, s, y, x.shape[1], x.stride(0), y.stride(0),
                                                                     BLOCK=block)
    return y
    ### END SOLUTION


# %% tags=["check"]
from autograder.check import check

check("a3.scale_rows", scale_rows)

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
#
# The kernel's arguments: `x_ptr`, `y_ptr` point at `(rows, n_cols)` views of `x` and of the output (the
# wrapper flattens the leading axes: `x.reshape(-1, n_cols)`), `stride_x`, `stride_y` are their row strides
# (columns contiguous), `BLOCK` is a power of two (`triton.next_power_of_2`; cap it at a few thousand columns
# so that a block fits in registers -- the hidden "long rows" cases have 1025-6000 columns), and `ONE_BLOCK`
# is the flag `n_cols <= BLOCK`: a `tl.constexpr`, so each path compiles on its own. Grid: `(rows,)`.
#
# Graded (20 points): ragged rows, long rows, large logits, float16/bfloat16 output in `x.dtype` (bfloat16
# only on a GPU), and on a GPU the speed against the course's fused softmax (4 of the 20).

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
# ## Part 2 -- the FlashAttention-2 forward kernel, no mask
#
# Grid: `(cdiv(Nq, BLOCK_M), B * H)`. Program `(i, bh)` owns query rows `[i*BLOCK_M, (i+1)*BLOCK_M)` of
# batch `bh // H`, head `bh % H` (the given `program_block` names them at the top of the kernel), and runs
# Algorithm 1's inner loop (lines 6-11) over key blocks of `BLOCK_N` rows, then lines 12-15. In this part
# `Hq == Hkv` and there is no causal mask, but `Nq` and `Nk` may differ (graded). Write two functions:
#
# * `_fwd_block(acc, m_i, l_i, q, k, v, allowed, qk_scale)`: lines 8-10 for one key block -- scores
#   `S = Q K^T` in base-2 units, set to `-inf` where `allowed` is False, new running max, rescale factor
#   `alpha`, `P`, running sum, rescaled accumulator plus `P V`. Return `(acc, m_i, l_i)`. Guard `m = -inf`
#   as in assignment 2 (a row whose keys so far are all masked; Part 3 needs it, so write it now).
#   Shapes: `q (BLOCK_M, D)`, `k, v (BLOCK_N, D)` in the inputs' dtype; `allowed (BLOCK_M, BLOCK_N)` bool;
#   `acc (BLOCK_M, D)`, `m_i, l_i (BLOCK_M,)` float32, `m_i` in base-2 units (a max of `Q K^T * qk_scale`).
# * `_flash_fwd_basic_kernel`: load the query tile (line 4), loop over every key block (line 6), load `K_j`,
#   `V_j` (line 7), call `_fwd_block` with `allowed = cols < Nk`, then lines 12-15: `O = acc / l`,
#   `lse = (m + log2 l) / log2 e`, store both.
#
# and the wrapper `flash_attention_forward_basic(q, k, v, scale=None)` (choose the blocks, launch the grid).
# Hints:
#
# * Pointers: `base + rows[:, None] * stride_n + cols[None, :]`, loads masked with `rows < N` for the ragged
#   tail (`other=0.0`). Score columns past `Nk` must become `-inf` before the max. `K^T` is `tl.trans(k)`.
# * The kernel takes the strides of axes 0-2 of `q`, `k`, `v`, `o` (`*q.stride()[:3]`, ...); the last axis
#   must be contiguous (call `.contiguous()` on the inputs). `lse` gets no strides: it is the contiguous
#   `(B, H, Nq)` tensor the wrapper allocates, so program `bh`'s rows start at `lse_ptr + bh * Nq`.
# * Fold `scale * log2(e)` into one factor `qk_scale` and use `tl.exp2` (lecture 4's conventions box:
#   [lecture 4](../../lectures/04_backward_recomputation.ipynb#conventions)). On the host, `LOG2E` is a
#   `tl.constexpr`: pass `scale * LOG2E.value`, a plain float.
# * Use the given `dot(a, b)` (it is `tl.dot`, with a fix for the interpreter). Both operands must have
#   the same dtype: cast `p` to `v`'s dtype before `p @ v`; accumulate in float32. `tl.dot` needs every
#   dimension >= 16: `BLOCK_M = BLOCK_N = 64` is a good start for every `d` here.
#
# Graded (43 points): ragged `N` and `N = 1`, `Nq != Nk`, the `scale` argument, large logits, float16 (and
# bfloat16 on a GPU), and on a GPU the speed against the course's forward (8 of the 43).

# %%
@triton.jit
def _fwd_block(acc, m_i, l_i, q, k, v, allowed, qk_scale):
    """FA2 Algorithm 1, lines 8-10 for one key block, scores in base-2 units; returns ``(acc, m_i, l_i)``.

    ``q (BLOCK_M, D)``, ``k, v (BLOCK_N, D)``; ``allowed (BLOCK_M, BLOCK_N)`` bool; ``acc (BLOCK_M, D)`` and
    ``m_i, l_i (BLOCK_M,)`` float32 (``m_i`` in base-2 units); ``qk_scale = scale * log2 e``."""
    ### BEGIN SOLUTION
    s = tl.where(allowed, dot(q, tl.trans(k)) * qk_scale, float("-inf"))  # line 8
    m_new = tl.maximum(m_i, tl.max(s, axis=1))  # line 9
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no allowed key yet: exp2(-inf - 0) = 0, not NaN
    p = tl.exp2(s - shift[:, None])
    alpha = tl.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v)  # line 10
    return acc, m_new, l_i
    ### END SOLUTION


@triton.jit
def _flash_fwd_basic_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                            sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
                            H, Nq, Nk, qk_scale,
                            D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """FA2 Algorithm 1 for one (query block, batch*head), no mask, Hq == Hkv (qk_scale = scale * log2 e).

    Stores ``o`` rows ``offs_m`` (lines 12, 14) and ``lse`` in natural log (lines 13, 15) into the contiguous
    ``(B*H, Nq)`` lse at ``lse_ptr + bh * Nq + offs_m``; rows past ``Nq`` are not stored."""
    start_m, offs_m, bh, b, h = program_block(H, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_base = q_ptr + b.to(tl.int64) * sqb + h * sqh
    k_base = k_ptr + b.to(tl.int64) * skb + h * skh
    v_base = v_ptr + b.to(tl.int64) * svb + h * svh
    o_base = o_ptr + b.to(tl.int64) * sob + h * soh
    ### BEGIN SOLUTION
    rows_ok = offs_m[:, None] < Nq
    q = tl.load(q_base + offs_m[:, None] * sqn + offs_d[None, :], mask=rows_ok, other=0.0)  # line 4
    acc = tl.zeros([BLOCK_M, D], tl.float32)  # line 5
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for start_n in range(0, Nk, BLOCK_N):  # line 6
        cols = start_n + offs_n
        k = tl.load(k_base + cols[:, None] * skn + offs_d[None, :], mask=cols[:, None] < Nk, other=0.0)  # line 7
        v = tl.load(v_base + cols[:, None] * svn + offs_d[None, :], mask=cols[:, None] < Nk, other=0.0)
        acc, m_i, l_i = _fwd_block(acc, m_i, l_i, q, k, v, cols[None, :] < Nk, qk_scale)
    tl.store(o_base + offs_m[:, None] * son + offs_d[None, :], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty),
             mask=rows_ok)  # lines 12 and 14
    tl.store(lse_ptr + bh.to(tl.int64) * Nq + offs_m, (m_i + tl.log2(l_i)) / LOG2E, mask=offs_m < Nq)  # 13, 15
    ### END SOLUTION


def flash_attention_forward_basic(q, k, v, scale=None):
    """FlashAttention-2 forward without a mask, ``Hq == Hkv``: ``o`` (like ``q``) and ``lse (B, H, Nq)`` float32."""
    B, Hq, Hkv, Nq, Nk, d = check_attention_inputs(q, k, v)
    if Hq != Hkv:
        raise ValueError(f"Part 2 takes one kv head per query head (Hq == Hkv), got Hq={Hq}, Hkv={Hkv}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
    ### BEGIN SOLUTION
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    BLOCK_M, BLOCK_N = 64, 64
    _flash_fwd_basic_kernel[(triton.cdiv(Nq, BLOCK_M), B * Hq)](
        q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
        Hq, Nq, Nk, scale * LOG2E.value, D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4)
    ### END SOLUTION
    return o, lse


# %% tags=["check"]
from autograder.check import check

check("a3.flash_attention_forward_basic", flash_attention_forward_basic)

# %% [markdown]
# ## Part 3 -- causal (bottom-right) and GQA
#
# Same grid with `B * Hq` programs on axis 1. Start from a copy of your Part 2 kernel and change four things:
#
# * GQA: query head `h` reads kv head `h // group`, `group = Hq // Hkv` -- only the K/V base pointers change.
# * Causal: row `i` sees keys `j <= i + Nk - Nq` (aligned bottom-right, as in assignment 1). Pass
#   `allowed = (cols < Nk) & (cols <= rows + Nk - Nq)` to your `_fwd_block`.
# * Early exit: stop the key loop after the last key any row of the block may see (that halves the work).
# * Rows that see no key at all (`Nq > Nk`, the first `Nq - Nk` rows) end with `l = 0`: store `o = 0` and
#   `lse = -inf` for them, not `0/0`. With the early exit a whole block of such rows runs no iteration at all
#   (the loop bound is <= 0), so the end of the kernel must handle `l = 0` without the loop's help.
#
# Graded (37 points): causal with `Nq == Nk`, causal with `Nq != Nk` both ways (fully masked rows), GQA and MQA
# (causal and not), float16 (and bfloat16 on a GPU), and on a GPU the speed, causal + GQA (8 of the 37).

# %%
@triton.jit
def _flash_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                      sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
                      Hq, group, Nq, Nk, qk_scale,
                      CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """FA2 Algorithm 1 for one (query block, batch*head) with GQA and a bottom-right causal mask; stores as the
    Part 2 kernel does, with ``o = 0`` and ``lse = -inf`` for rows that see no key."""
    start_m, offs_m, bh, b, h = program_block(Hq, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_base = q_ptr + b.to(tl.int64) * sqb + h * sqh
    o_base = o_ptr + b.to(tl.int64) * sob + h * soh
    ### BEGIN SOLUTION
    hk = h // group  # GQA: the kv head this query head reads
    k_base = k_ptr + b.to(tl.int64) * skb + hk * skh
    v_base = v_ptr + b.to(tl.int64) * svb + hk * svh
    q = tl.load(q_base + offs_m[:, None] * sqn + offs_d[None, :], mask=offs_m[:, None] < Nq, other=0.0)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    offset = Nk - Nq  # bottom-right causal alignment
    hi = Nk
    if CAUSAL:
        hi = tl.minimum(Nk, start_m + BLOCK_M + offset)  # last key any row of this block may see, + 1
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = cols[:, None] < Nk
        k = tl.load(k_base + cols[:, None] * skn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * svn + offs_d[None, :], mask=kv_mask, other=0.0)
        allowed = cols[None, :] < Nk
        if CAUSAL:
            allowed = allowed & (cols[None, :] <= offs_m[:, None] + offset)
        acc, m_i, l_i = _fwd_block(acc, m_i, l_i, q, k, v, allowed, qk_scale)
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    tl.store(o_base + offs_m[:, None] * son + offs_d[None, :], (acc / l_safe[:, None]).to(o_ptr.dtype.element_ty),
             mask=offs_m[:, None] < Nq)
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) / LOG2E, float("-inf"))
    tl.store(lse_ptr + bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)
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
    _flash_fwd_kernel[grid](q, k, v, o, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                            Hq, Hq // Hkv, Nq, Nk, scale * LOG2E.value,
                            CAUSAL=bool(causal), D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, num_warps=4)
    ### END SOLUTION
    return o, lse


# %% tags=["check"]
from autograder.check import check

check("a3.flash_attention_forward", flash_attention_forward)

# %% [markdown]
# ## Part 4 (optional bonus, needs Hopper for speed) -- an FP8 forward, FlashAttention-3 style
#
# Hopper's tensor cores multiply float8 matrices twice as fast as bfloat16 ones. FlashAttention-3 uses that
# for the forward (Shah et al., 2024, section 3.3): Q, K, V are stored in **e4m3** (4 exponent bits, 3
# mantissa bits, largest value 448), each block of rows with its own scale, and the two matmuls run in FP8
# with float32 accumulation (lecture 6, section 3, "FP8 with incoherent processing": read it before this
# part). Write `flash_attention_forward_fp8(q, k, v, causal=False, scale=None, hadamard=False, seed=0) ->
# (o, lse)`: `o` in **bfloat16**, `lse` float32 as before, `d` in {32, 64, 128}.
#
# 1. `_quant_fp8_kernel`: one program per block of `BLOCK` rows of one (batch, head). Its scale is
#    `amax / 448` (1 for an all-zero block), its rows become `to_fp8(x / scale)` (given: the cast, with a fix
#    for the interpreter), rows past `N` are written as zeros so that the attention kernel can load whole
#    blocks without masks. V is written **transposed**, `(B, Hkv, d, N_pad)`: Hopper's FP8 MMA reads its
#    second operand with the reduction axis contiguous, and for `P @ V` that axis is the keys.
#    `quantize_fp8(x, block, transposed)` allocates the outputs and launches it on the grid
#    `(N_pad // block, B * H)`. The quantisation block must be the attention tile: quantise Q with
#    `block = BLOCK_M` and K, V with `block = BLOCK_N`, so that query block `i` has one scale `sq_i` and key
#    block `j` one `sk_j` and one `sv_j`.
# 2. `_fp8_key_block`: lines 7-10 for one key block -- your Part 2 `_fwd_block` (same argument and return
#    order: `acc, m_i, l_i`) plus the loads of `K_j` and `V_j^T`, with three changes. The scores are `dot(q8, k8^T) * (sq_i * sk_j * scale)`. `P` is rounded
#    with `to_fp8` and multiplied into V with the given `dot_acc(p8, v8, acc)` (load the `(D, BLOCK_N)` tile
#    of V^T and pass its `tl.trans`, `(BLOCK_N, D)`): e4m3's smallest normal number is `2^-6`, so take `P`
#    times `256` before rounding (fold it into the `exp2` argument: `exp2(S - m + 8)`).
#    V's per-block scale `sv_j` does not fit inside the MMA: keep `acc` in units of the current block's
#    `sv_j`, and when the next block has another scale rescale `acc` by `sv_old / sv_new` -- in the same
#    multiplication as the `alpha` rescale. Its docstring lists what each argument is and what it returns.
# 3. `_flash_fwd_fp8_kernel`: your Part 3 kernel around it (GQA, bottom-right causal, early exit). The
#    quantised buffers are padded to whole blocks, so the loads need no masks; the score masks are needed
#    only on the ragged last key block and the causal diagonal (`MASKED=True`; calling every block with
#    `MASKED=True` is correct, only slower). At the end `o = acc * v_unit / l` (`acc` is in units of the last
#    block's V scale; the 256 cancels there) but **not** in `lse`: `l` is 256 times the true sum, so
#    `lse = (m + log2 l - 8) / log2 e`.
#
# Block sizes: `BLOCK_N >= 32` on a GPU (it is the reduction axis of `P @ V`, and an FP8 MMA reduces over at
# least 32 elements); in the interpreter small tiles (say 16 x 32) keep the checks quick and cross several key
# blocks.
#
# Optional on top (ungraded): `hadamard=True` multiplies Q and K by `J = random_hadamard(d, seed)` (given)
# before quantising; `(QJ)(KJ)^T = QK^T`, but an outlier channel is spread over all `d` channels first
# (lecture 6, section 3). Measure what it changes on the outlier inputs below.
#
# **Grading (bonus points, on top of the 100).** Accuracy against float64 attention of the bf16 inputs: e4m3
# rounds each entry by up to `2^-4` relative (3 mantissa bits), and `o` collects the roundings of Q, K, V and
# `P`: an ideal FP8 pipeline measures 0.04-0.06 relative error on normal inputs, so the bound is 0.1. With
# outlier channels (a few channels of Q and K x10) the logits are ~20x larger and so are their rounding errors:
# 0.05-0.36 measured, bound 0.5; V there has heads of magnitude 1e-4 and 1e4 (per-block scales keep both),
# and one case ramps V from 1e-2 to 1e2 along the keys (each key block of a head has its own scale). `lse`:
# relative error <= 0.1. Inputs are bfloat16, `d` in {32, 64}, ragged `N`, causal `Nq != Nk`, GQA: 4 points
# (normal) + 3 (outliers). On an H100/H200 the speed test (3 points) times your function, quantisation
# included, against the course's **bf16** forward (B=2, N=8192 and causal B=1, N=16384; d=128): full points at
# <= 1/1.2 of its time, none at >= 1x. Without a Hopper GPU the speed test is not run;
# on CPU the accuracy tests run in the interpreter. On a GPU older than Hopper, develop Part 4 in the
# interpreter too: start Jupyter with `TRITON_INTERPRET=1` (the FP8 kernels then run on the CPU).

# %% given="fp8_helpers"

# %%
@triton.jit
def _quant_fp8_kernel(x_ptr, y_ptr, scale_ptr, H, N, N_PAD, sxb, sxh, sxn,
                      D: tl.constexpr, BLOCK: tl.constexpr, TRANSPOSED: tl.constexpr):
    """One block of BLOCK rows of one (batch, head): scale = amax / 448, y = e4m3(x / scale), zero-padded;
    y is (B*H, N_PAD, D) contiguous, or (B*H, D, N_PAD) if TRANSPOSED; scale_ptr is (B*H, N_PAD // BLOCK)."""
    blk = tl.program_id(0)
    bh = tl.program_id(1)
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, D)
    x_base = x_ptr + (bh // H).to(tl.int64) * sxb + (bh % H) * sxh
    y_base = y_ptr + bh.to(tl.int64) * N_PAD * D
    ### BEGIN SOLUTION
    x = tl.load(x_base + rows[:, None] * sxn + cols[None, :], mask=rows[:, None] < N, other=0.0).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    scale = tl.where(amax > 0.0, amax / FP8_MAX, 1.0)
    y = to_fp8(x * (1.0 / scale))
    if TRANSPOSED:
        tl.store(y_base + cols[None, :] * N_PAD + rows[:, None], y)
    else:
        tl.store(y_base + rows[:, None] * D + cols[None, :], y)
    tl.store(scale_ptr + bh.to(tl.int64) * (N_PAD // BLOCK) + blk, scale)
    ### END SOLUTION


def quantize_fp8(x, block, transposed=False):
    """``x (B, H, N, d)`` -> ``(x8, scales)``: float8 e4m3 ``(B, H, N_pad, d)`` (or ``(B, H, d, N_pad)``),
    ``N_pad = cdiv(N, block) * block``, and float32 ``(B, H, N_pad // block)`` with one scale per block."""
    B, H, N, d = x.shape
    n_pad = triton.cdiv(N, block) * block
    shape = (B, H, d, n_pad) if transposed else (B, H, n_pad, d)
    x8 = torch.empty(shape, device=x.device, dtype=torch.float8_e4m3fn)
    scales = torch.empty((B, H, n_pad // block), device=x.device, dtype=torch.float32)
    ### BEGIN SOLUTION
    _quant_fp8_kernel[(n_pad // block, B * H)](x, x8, scales, H, N, n_pad, x.stride(0), x.stride(1), x.stride(2),
                                               D=d, BLOCK=block, TRANSPOSED=transposed, num_warps=4)
    ### END SOLUTION
    return x8, scales


@triton.jit
def _fp8_key_block(acc, m_i, l_i, v_unit, q8, k_base, vt_base, sk_ptr, sv_ptr, start_n, offs_m, offs_n, offs_d,
                   q_scale, Nk, NK_PAD, diag, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                   D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Algorithm 1, lines 7-10, for one FP8 key block (MASKED: the ragged tail or the causal diagonal).

    ``acc (BLOCK_M, D)`` float32 in units of the V scale ``v_unit``; ``m_i`` (base 2) and ``l_i`` (256 times
    the true running sum) ``(BLOCK_M,)`` float32, in the order of Part 2's ``_fwd_block``; ``q8 (BLOCK_M, D)``
    e4m3; ``k_base``: this kv head's K8, ``(NK_PAD, D)`` contiguous; ``vt_base``: its transposed V8,
    ``(D, NK_PAD)``; ``sk_ptr``, ``sv_ptr``: its
    key-block scales (block ``start_n // BLOCK_N``); ``q_scale = sq_i * scale * log2 e``; ``diag = Nk - Nq``
    (row ``i`` sees keys ``j <= i + diag``). Returns ``(acc, m_new, l_i, sv)``: ``acc`` now in units of this
    block's V scale ``sv``, which the caller passes back as ``v_unit`` for the next block."""
    ### BEGIN SOLUTION
    jb = start_n // BLOCK_N
    cols = start_n + offs_n
    k8 = tl.load(k_base + cols[:, None] * D + offs_d[None, :])
    s = dot(q8, tl.trans(k8)) * (q_scale * tl.load(sk_ptr + jb))  # dequantised scores, base 2
    if MASKED:
        keep = cols[None, :] < Nk
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None] + diag)
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    shift = m_new
    if MASKED:  # a row may have seen only masked keys so far
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - (shift - 8.0)[:, None])  # 256 * P: its entries stay above e4m3's subnormals
    alpha = tl.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    sv = tl.load(sv_ptr + jb)
    vt8 = tl.load(vt_base + offs_d[:, None] * NK_PAD + cols[None, :])
    acc = dot_acc(to_fp8(p), tl.trans(vt8), acc * (alpha * (v_unit / sv))[:, None])  # acc now in units of sv
    ### END SOLUTION
    return acc, m_new, l_i, sv


@triton.jit
def _flash_fwd_fp8_kernel(q_ptr, k_ptr, vt_ptr, sq_ptr, sk_ptr, sv_ptr, o_ptr, lse_ptr,
                          Hq, group, Nq, Nk, NQ_PAD, NK_PAD, qk_scale,
                          CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """FA2 Algorithm 1 on FP8 inputs for one (query block, batch*head); quantised buffers padded to whole blocks.

    ``q_ptr``: Q8 ``(B*Hq, NQ_PAD, D)``, ``k_ptr``: K8 ``(B*Hkv, NK_PAD, D)``, ``vt_ptr``: V8 transposed
    ``(B*Hkv, D, NK_PAD)``, all contiguous e4m3; ``sq_ptr (B*Hq, NQ_PAD // BLOCK_M)``, ``sk_ptr``, ``sv_ptr``
    ``(B*Hkv, NK_PAD // BLOCK_N)`` float32 block scales; ``o`` contiguous ``(B, Hq, Nq, D)`` bfloat16, ``lse``
    contiguous ``(B, Hq, Nq)`` float32; ``qk_scale = scale * log2 e``; ``group = Hq // Hkv``."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    bhk = (bh // Hq) * (Hq // group) + (bh % Hq) // group  # b * Hkv + kv head
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    k_base = k_ptr + bhk.to(tl.int64) * NK_PAD * D
    vt_base = vt_ptr + bhk.to(tl.int64) * NK_PAD * D
    sk_base = sk_ptr + bhk.to(tl.int64) * (NK_PAD // BLOCK_N)
    sv_base = sv_ptr + bhk.to(tl.int64) * (NK_PAD // BLOCK_N)
    ### BEGIN SOLUTION
    q8 = tl.load(q_ptr + bh.to(tl.int64) * NQ_PAD * D + offs_m[:, None] * D + offs_d[None, :])
    q_scale = tl.load(sq_ptr + bh.to(tl.int64) * (NQ_PAD // BLOCK_M) + pid_m) * qk_scale
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    v_unit = tl.load(sv_base)  # the V scale acc is expressed in (acc is zero so far)
    diag = Nk - Nq  # row i sees keys j <= i + diag
    if CAUSAL:
        hi = tl.maximum(tl.minimum(Nk, start_m + BLOCK_M + diag), 0)  # past the last key any row sees
        full = tl.maximum(tl.minimum(hi, start_m + diag + 1), 0) // BLOCK_N * BLOCK_N  # seen by every row
    else:
        hi = Nk
        full = Nk // BLOCK_N * BLOCK_N
    for start_n in range(0, full, BLOCK_N):
        acc, m_i, l_i, v_unit = _fp8_key_block(acc, m_i, l_i, v_unit, q8, k_base, vt_base, sk_base, sv_base,
                                               start_n, offs_m, offs_n, offs_d, q_scale, Nk, NK_PAD, diag,
                                               CAUSAL, False, D, BLOCK_N)
    for start_n in range(full, hi, BLOCK_N):
        acc, m_i, l_i, v_unit = _fp8_key_block(acc, m_i, l_i, v_unit, q8, k_base, vt_base, sk_base, sv_base,
                                               start_n, offs_m, offs_n, offs_d, q_scale, Nk, NK_PAD, diag,
                                               CAUSAL, True, D, BLOCK_N)
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    o = acc * (v_unit / l_safe)[:, None]  # the 256 of P cancels here
    lse = tl.where(seen, (m_i - 8.0 + tl.log2(l_safe)) / LOG2E, float("-inf"))
    o_ptrs = o_ptr + bh.to(tl.int64) * Nq * D + offs_m[:, None] * D + offs_d[None, :]
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < Nq)
    tl.store(lse_ptr + bh.to(tl.int64) * Nq + offs_m, lse, mask=offs_m < Nq)
    ### END SOLUTION


def flash_attention_forward_fp8(q, k, v, causal=False, scale=None, hadamard=False, seed=0):
    """FP8 (e4m3) FlashAttention forward: ``o`` (B, Hq, Nq, d) bfloat16 and ``lse`` (B, Hq, Nq) float32."""
    B, Hq, Hkv, Nq, Nk, d = check_attention_inputs(q, k, v)
    if d not in FP8_HEAD_DIMS:
        raise ValueError(f"the FP8 forward needs head dimension d in {FP8_HEAD_DIMS}, got {d}")
    check_fp8_device(q.device)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if hadamard:
        j = random_hadamard(d, seed, q.device)
        q, k = q.float() @ j, k.float() @ j
    o = torch.empty((B, Hq, Nq, d), device=q.device, dtype=torch.bfloat16)
    lse = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
    ### BEGIN SOLUTION
    # GPU: 64 x 128 tiles; the interpreter: small tiles, so that the tests cross several key blocks
    BLOCK_M, BLOCK_N = (16, 32) if INTERPRET.value else (64, 128)
    q8, sq = quantize_fp8(q, BLOCK_M)
    k8, sk = quantize_fp8(k, BLOCK_N)
    vt8, sv = quantize_fp8(v, BLOCK_N, transposed=True)
    grid = (q8.shape[2] // BLOCK_M, B * Hq)
    _flash_fwd_fp8_kernel[grid](q8, k8, vt8, sq, sk, sv, o, lse, Hq, Hq // Hkv, Nq, Nk, q8.shape[2], k8.shape[2],
                                scale * LOG2E.value, CAUSAL=bool(causal), D=d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                num_warps=4, num_stages=3)
    ### END SOLUTION
    return o, lse


# %% tags=["check"]
from autograder.check import check

check("a3.flash_attention_forward_fp8", flash_attention_forward_fp8)

# %% [markdown]
# ## Going further (ungraded, needs a GPU)
#
# * Time your forward against `torch.nn.functional.scaled_dot_product_attention` with
#   `triton.testing.do_bench` for `N` in 512..16k (batch x N = 16k tokens, hidden 2048: the FlashAttention
#   papers' convention, which the grader's speed cases follow). Report TFLOP/s (`4 * B * H * N^2 * d`,
#   halved for causal).
# * Try `BLOCK_M = 128` and `num_stages = 3` for `d = 64`; watch shared-memory limits for `d = 128`.
# * Split the causal key loop in two: the blocks below the diagonal need no mask at all (`allowed` only for
#   the ragged tail), only the diagonal blocks do. How much does the causal case gain?
