"""PagedAttention decode in Triton: Flash-Decoding that reads K/V through a block table.

vLLM's PagedAttention (seed slides "PagedAttention") stores each sequence's keys and values in fixed-size
blocks scattered through one pool, ``k_cache, v_cache (num_blocks, block_size, Hkv, d)``, and a per-sequence
block table maps logical block ``j`` (tokens ``j*block_size .. (j+1)*block_size - 1``) to a physical block.
This is the layout of ``reference.numpy.paged.PagedKVCache``.

The kernel is ``reference.triton.decode``'s split-KV kernel with ``PAGED=True``: for key position ``n`` it
looks up ``phys = block_tables[b, n // block_size]`` and reads row ``n % block_size`` of that block. Every row
is ``d`` contiguous elements, as in the contiguous cache, so paging costs one small (cached) table load per
key block, not bandwidth. Any block size works, including ones smaller than the kernel's key tile.
"""
from __future__ import annotations

from . import _checks
from ._checks import check_block_tables, check_decode_q, check_paged_cache
from .configs import check_decode_config
from .decode import DecodeCall, checked_call, launch_decode


def check_call(q, k_cache, v_cache, block_tables, seq_lens, scale=None, num_splits=None, validate=True,
               config=None) -> DecodeCall:
    """``paged_decode``'s checks (each bad argument named) and defaults: the ``DecodeCall`` it launches."""
    B = check_decode_q(q)[0]
    validate = _checks.check_flag(validate, "validate")
    config = check_decode_config(config)
    num_blocks, block_size, Hkv, _ = check_paged_cache(q, k_cache, v_cache)
    block_tables, seq_lens = check_block_tables(block_tables, seq_lens, B, num_blocks, block_size, validate)
    return checked_call(q, k_cache, v_cache, seq_lens, block_tables, block_tables.shape[1] * block_size, Hkv, scale,
                        num_splits, block_size, config)


def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=None, *, num_splits=None, validate=True,
                 config=None):
    """Decode attention over a paged KV cache (PagedAttention + Flash-Decoding); returns ``o (B, Hq, d)``.

    q: ``(B, Hq, d)``; k_cache, v_cache: ``(num_blocks, block_size, Hkv, d)``, ``Hq % Hkv == 0`` (GQA);
    block_tables: ``(B, max_blocks)`` int32 (int64 accepted), padded with -1; seq_lens: ``(B,)`` int32/int64,
    ``0 <= seq_lens[b] <= max_blocks * block_size`` (0 gives output 0). Sequence ``b``'s token ``n`` lives in
    block ``block_tables[b, n // block_size]``, row ``n % block_size``. num_splits: None picks
    ``choose_num_splits(B, Hkv, max_blocks * block_size)``. validate=False skips the value checks that need
    a device sync (seq_lens range, block indices in range); bad values then give wrong output, and the
    kernel still never reads through a negative index. config: a ``reference.triton.configs.DecodeConfig`` for
    every split count (None: ``configs.decode_pin``'s ``"paged"`` / ``"paged_one_split"`` pins, ``"fp32"`` for
    fp32). ``reference.triton.paged_decode`` is this call with recorded launches
    (``reference.triton.decode_serving``).
    """
    return launch_decode(*check_call(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, validate,
                                     config))
