"""Attention over a sequence sharded across processes: ring attention (context parallelism).

Modules: ``layout`` (which positions each rank holds: contiguous or zig-zag chunks), ``schedule`` (the work
each rank does at each ring step, and the imbalance of the naive order), ``merge`` (``merge_states`` on torch
tensors), ``local_step`` (one rank's attention of its queries to a visiting K/V chunk: NumPy, torch or the
course's Triton kernels), ``ring_attention`` (the ring itself on ``torch.distributed``: gloo on CPU processes,
NCCL on GPUs), ``ulysses`` (Ulysses' all-to-all over heads, its hybrid with the ring, all-gather context
parallelism; ``collectives``: the ragged all-to-all they use), ``launch`` (starting CPU ranks with gloo) and ``demo`` (rank programs for tests and the lecture).
"""
from .demo import ring_cases_rank
from .launch import run_ranks
from .layout import chunk_bounds, hybrid_segments, hybrid_shard, hybrid_unshard, rank_segments, shard, unshard
from .local_step import attend_segments, get_step
from .merge import merge_states_torch
from .ring_attention import (ring_attention, ring_attention_backward, ring_attention_forward,
                             simulate_ring_attention)
from .schedule import ring_balance, ring_work
from .ulysses import (allgather_attention_backward, allgather_attention_forward, hybrid_attention,
                      hybrid_attention_backward, hybrid_attention_forward, hybrid_groups, ulysses_attention,
                      ulysses_attention_backward, ulysses_attention_forward)

__all__ = ["allgather_attention_backward", "allgather_attention_forward", "attend_segments", "chunk_bounds",
           "hybrid_attention", "hybrid_attention_backward", "hybrid_attention_forward", "hybrid_groups",
           "hybrid_segments", "hybrid_shard", "hybrid_unshard", "ulysses_attention", "ulysses_attention_backward",
           "ulysses_attention_forward", "get_step", "merge_states_torch", "rank_segments", "ring_attention",
           "ring_attention_backward", "ring_attention_forward", "ring_balance", "ring_cases_rank", "ring_work",
           "run_ranks", "shard", "simulate_ring_attention", "unshard"]
