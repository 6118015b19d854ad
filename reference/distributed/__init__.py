"""Attention over a sequence sharded across processes: ring attention (context parallelism).

Modules: ``layout`` (which positions each rank holds: contiguous or zig-zag chunks), ``schedule`` (the work
each rank does at each ring step, and the imbalance of the naive order), ``merge`` (``merge_states`` on torch
tensors), ``local_step`` (one rank's attention of its queries to a visiting K/V chunk: NumPy, torch or the
course's Triton kernels), ``ring_attention`` (the ring itself on ``torch.distributed``: gloo on CPU processes,
NCCL on GPUs), ``launch`` (starting CPU ranks with gloo) and ``demo`` (rank programs for tests and the lecture).
"""
from .demo import ring_cases_rank
from .launch import run_ranks
from .layout import chunk_bounds, rank_segments, shard, unshard
from .local_step import attend_segments, get_step
from .merge import merge_states_torch
from .ring_attention import (ring_attention, ring_attention_backward, ring_attention_forward,
                             simulate_ring_attention)
from .schedule import ring_balance, ring_work

__all__ = ["attend_segments", "chunk_bounds", "get_step", "merge_states_torch", "rank_segments", "ring_attention",
           "ring_attention_backward", "ring_attention_forward", "ring_balance", "ring_cases_rank", "ring_work",
           "run_ranks", "shard", "simulate_ring_attention", "unshard"]
