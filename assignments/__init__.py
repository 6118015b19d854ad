"""Student assignments (docs/design.md §5).

Each ``assignments/<aid>/`` folder holds the instructor's solution source ``<aid>_solution.py`` (jupytext
"percent" format with ``### BEGIN SOLUTION`` / ``### END SOLUTION`` regions), the generated student notebook
``<aid>.ipynb`` and a README. ``python -m assignments.generate`` rebuilds the student notebooks.
"""

#: assignment id -> short id used in task ids ("a2.flash_attention_forward")
ASSIGNMENTS = {
    "a1_attention": "a1",
    "a2_flash_numpy": "a2",
    "a3_triton": "a3",
    "a3b_triton_backward": "a3b",
    "a4_decoding": "a4",
    "a5_paged": "a5",
    "a6_ring": "a6",
    "a7_gluon": "a7",
}

#: the graded names of each assignment (the shared grading contract; same signatures as docs/design.md §4)
GRADED = {
    "a1_attention": ("safe_softmax", "online_softmax", "merge_states", "attention"),
    "a2_flash_numpy": ("flash_attention_forward", "flash_attention_backward", "forward_hbm_bytes"),
    "a3_triton": ("softmax", "flash_attention_forward_basic", "flash_attention_forward",
                  "flash_attention_forward_fp8"),
    "a3b_triton_backward": ("flash_bwd_preprocess", "flash_bwd_dkdv", "flash_bwd_dq", "flash_attention_backward",
                            "flash_attention"),
    "a4_decoding": ("flash_decoding", "flash_decode", "lpt_schedule"),
    "a5_paged": ("BlockAllocator", "cow_fork", "cow_append", "paged_attention", "paged_decode"),
    "a6_ring": ("ring_step", "ring_backward_step"),
    "a7_gluon": ("flash_attention_forward_pingpong",),
}

#: ungraded warm-up functions (``autograder`` spec ``warmups``): the student writes each, with its own ``check()``
#: cell of visible cases, before the graded parts; the grader never runs them
WARMUP = {
    "a3_triton": ("scale_rows",),
}

#: the functions the student writes, where they are not the graded names: a7's graded name is the given host
#: wrapper ``flash_attention_forward_pingpong`` that launches a kernel whose synchronisation (barrier parities,
#: ping-pong turn, overlap wait) the student writes. The
#: student notebook stubs each of these (``raise NotImplementedError("Implement <name>")``, checked by
#: ``generate.render``); signatures in docs/design.md §4.
WRITTEN = {
    "a7_gluon": ("_ready_phase", "_empty_phase", "_turn_phase", "_take_turn", "_give_turn", "_wait_scores"),
}


def written(aid: str) -> tuple:
    """The names the student implements in ``aid``: ``WRITTEN[aid]``, else the graded names."""
    return WRITTEN.get(aid, GRADED[aid])
