"""The two collectives that Ulysses and all-gather context parallelism need, written as point-to-point sends.

``all_to_all`` sends a different tensor to every member of a process group and receives one from each;
pieces may differ in shape (ragged sequence shards, replicated K/V heads), which ``torch.distributed``'s own
``all_to_all`` does not allow on every backend (gloo has no ragged all-to-all). Built from one
``batch_isend_irecv`` (gloo on CPU processes, NCCL on GPUs: NCCL's own all-to-all is this grouped send/recv
too), so every pair of ranks exchanges its pieces at once and no rank blocks on a send.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_A2A_TAG = 3
_METERS: list = []


class ByteMeter:
    """``with ByteMeter() as m:`` counts the bytes this process sends through :func:`all_to_all` (``m.sent``),
    so a benchmark can hold the measured volume against ``comm_model``'s formula."""

    def __init__(self):
        self.sent = 0

    def __enter__(self):
        _METERS.append(self)
        return self

    def __exit__(self, *exc):
        _METERS.remove(self)


class GroupInfo:
    """This rank's index in ``group`` and the global rank of every member (``group=None``: the world)."""

    def __init__(self, group=None):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group "
                               "('gloo' on CPU, 'nccl' on GPUs) first; reference.distributed.run_ranks does it "
                               "for CPU ranks")
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.members = [r if group is None else dist.get_global_rank(group, r) for r in range(self.world)]


def all_to_all(sends: list, recv_shapes: list, info: GroupInfo, like: torch.Tensor) -> list:
    """Send ``sends[j]`` to member ``j`` and receive member ``j``'s piece for this rank, of shape
    ``recv_shapes[j]`` (dtype and device of ``like``). Returns the received list; entry ``info.rank`` is
    ``sends[info.rank]`` itself (a rank keeps its own piece, nothing is copied)."""
    if len(sends) != info.world or len(recv_shapes) != info.world:
        raise ValueError(f"all_to_all needs one send and one receive shape per member ({info.world}), got "
                         f"{len(sends)} and {len(recv_shapes)}")
    recvs, ops = [], []
    for j in range(info.world):
        if j == info.rank:
            recvs.append(sends[j])
            continue
        buf = like.new_empty(recv_shapes[j])
        recvs.append(buf)
        if sends[j].numel():
            for m in _METERS:
                m.sent += sends[j].numel() * sends[j].element_size()
            ops.append(dist.P2POp(dist.isend, sends[j].contiguous(), info.members[j], info.group, _A2A_TAG))
        if buf.numel():
            ops.append(dist.P2POp(dist.irecv, buf, info.members[j], info.group, _A2A_TAG))
    for w in (dist.batch_isend_irecv(ops) if ops else []):
        w.wait()
    return recvs
