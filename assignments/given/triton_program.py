@triton.jit
def program_block(H, BLOCK: tl.constexpr):
    """Given: where a program of the grid ``(cdiv(N, BLOCK), B * H)`` works. Axis 0 numbers blocks of ``BLOCK``
    rows (queries or keys), axis 1 the (batch, head) pairs ``bh = b * H + h``. Returns ``(start, offs, bh, b, h)``:
    the block's first row ``start``, its rows ``offs = start + arange(BLOCK)``, and ``bh``, ``b``, ``h``."""
    start = tl.program_id(0) * BLOCK
    bh = tl.program_id(1)
    return start, start + tl.arange(0, BLOCK), bh, bh // H, bh % H
