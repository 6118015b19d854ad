"""Rank programs that misbehave on purpose (for the launcher's timeout and error tests)."""
import torch
import torch.distributed as dist


def hang_rank(rank, world):
    if rank == 0:  # waits for a message rank 1 never sends
        dist.recv(torch.empty(1), src=1)
    return rank


def fail_rank(rank, world):
    if rank == 1:
        raise RuntimeError("rank 1 failed on purpose")
    return rank
