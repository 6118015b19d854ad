@triton.jit
def split_program(Hkv, group, BLOCK_G: tl.constexpr):
    """Given: where a program of split-KV decode's grid ``(B * Hkv, num_splits)`` works: sequence ``b``, kv head
    ``hk`` and split ``split``, with the query heads of its GQA group as the rows of the tile, ``heads = hk * group +
    arange(BLOCK_G)`` (``row_ok``: the rows ``< group``; ``BLOCK_G >= 16`` for ``tl.dot``). Returns
    ``(b, hk, split, heads, row_ok)``."""
    pid = tl.program_id(0)
    b, hk = pid // Hkv, pid % Hkv
    offs_g = tl.arange(0, BLOCK_G)
    return b, hk, tl.program_id(1), hk * group + offs_g, offs_g < group
