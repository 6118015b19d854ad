"""Speed baselines of the a4/a5 GPU speed tests: the reference kernels after exactly the input checks that the
notebooks' given ``check_decode_tensors`` / ``check_paged_tensors`` make a student's function do.

Those given checks read ``seq_lens.min()`` and ``seq_lens.max()`` on the host: two device syncs per call, which
cost 100-150 us each in a grading child on an H100. Timed without them (``validate=False``) the reference beat
a solution with the same kernel by 1.24-1.26x; timed with its own fuller checks (``validate=True``, which also
validates the block table) it took twice as long as the solution. Same checks on both sides, same kernel: ratio
1 (``notes/speed_calibration.md``; ``tests/test_speed_fairness.py`` counts the host reads of both).
Runs only in the trusted reference child (``Task.reference = "autograder.baselines:<name>"``).
"""
from __future__ import annotations

from reference.triton import flash_decode as _flash_decode
from reference.triton import paged_decode as _paged_decode


def _check_seq_lens(seq_lens, limit: int) -> None:
    """The value check of the given code: two host reads of ``seq_lens`` (when there is one)."""
    if seq_lens is not None and seq_lens.numel() and (int(seq_lens.min()) < 0 or int(seq_lens.max()) > limit):
        raise ValueError(f"seq_lens must lie in [0, {limit}]")


def flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None):
    """``reference.triton.flash_decode`` after a4's given input check (``seq_lens`` in ``[0, Nmax]``)."""
    _check_seq_lens(seq_lens, k.shape[2])
    return _flash_decode(q, k, v, seq_lens=seq_lens, num_splits=num_splits, scale=scale, validate=False)


def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=None):
    """``reference.triton.paged_decode`` after a5's given input check (``seq_lens`` in
    ``[0, max_blocks * block_size]``)."""
    _check_seq_lens(seq_lens, block_tables.shape[1] * k_cache.shape[1])
    return _paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=scale, validate=False)
