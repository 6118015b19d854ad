@triton.jit
def merge_splits_kernel(o_part_ptr, lse_part_ptr, o_ptr, num_splits, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Given: stage 2 of split-KV decode, grid ``(B * Hq,)``: merge the ``num_splits`` partial ``(o_s, lse_s)``
    of one query head (float32 scratch of shape ``(B, Hq, num_splits, d)`` and ``(B, Hq, num_splits)``, lse in
    base 2) into ``o = sum_s w_s o_s / sum_s w_s`` with ``w_s = 2^(lse_s - max_s lse_s)`` -- the same merge as
    Part 1's NumPy ``flash_decoding``. An empty split (``lse_s = -inf``) gets weight 0; all empty gives ``o = 0``.
    """
    bh = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    lse = tl.load(lse_part_ptr + bh * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    o_s = tl.load(o_part_ptr + (bh * num_splits + offs_s[:, None]) * D + offs_d[None, :],
                  mask=offs_s[:, None] < num_splits, other=0.0)
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)  # every split empty (seq_len 0): weights 0, o = 0
    w = tl.exp2(lse - m)
    total = tl.sum(w, axis=0)
    o = tl.sum(w[:, None] * o_s, axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(o_ptr + bh * D + offs_d, o.to(o_ptr.dtype.element_ty))

