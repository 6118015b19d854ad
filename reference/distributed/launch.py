"""Start ``world`` CPU processes joined by a gloo process group, run one function in each, collect results.

For tests and the lecture (a notebook can call it too: the function must be importable, i.e. live in a
module, because ranks are started by ``forkserver`` or ``spawn``, never a plain fork of the caller). A hang (a rank waiting for a message that never
comes) ends in ``TimeoutError`` after ``timeout`` seconds instead of stalling forever; an exception in a rank
is re-raised in the caller with that rank's traceback.
"""
from __future__ import annotations

import datetime
import os
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(rank, world, fn, args, folder, backend, timeout):
    torch.set_num_threads(1)  # ranks share the machine's cores; one thread each avoids oversubscription
    if backend == "nccl":     # one GPU per rank, chosen before the communicator exists
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout + 30))  # the caller times out first
    try:
        result = fn(rank, world, *args)
        dist.barrier()
    except BaseException:
        # the first error written is the cause; peers then fail on closed connections (see run_ranks)
        (Path(folder) / f"rank{rank}.error").write_text(f"rank {rank}: {traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()
    torch.save(result, Path(folder) / f"rank{rank}.pt")


def _start_method() -> str:
    """``forkserver`` where available: one clean server process imports torch once and forks every rank from
    it (a rank then starts in well under a second instead of re-importing torch); ``spawn`` elsewhere."""
    if "forkserver" in mp.get_all_start_methods():
        mp.set_forkserver_preload(["torch", "torch.distributed", "reference.distributed.ring_attention"])
        return "forkserver"
    return "spawn"


def run_ranks(fn, world: int, args: tuple = (), timeout: float = 60.0, backend: str = "gloo") -> list:
    """Run ``fn(rank, world, *args)`` in ``world`` new processes; return ``[result of rank 0, 1, ...]``.

    ``backend="nccl"`` puts rank ``r`` on GPU ``r`` (one GPU per rank; the benchmark uses it).

    Results travel back through ``torch.save`` files (tensors, dicts, lists...). Raises ``TimeoutError`` if the
    ranks have not all finished after ``timeout`` seconds (they are killed), or the first rank's exception.
    """
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive integer, got {world!r}")
    if not callable(fn):
        raise TypeError(f"fn must be a module-level function, got {type(fn).__name__}")
    with tempfile.TemporaryDirectory(prefix="ring_") as folder:
        ctx = mp.start_processes(_rank_main, args=(world, fn, args, folder, backend, timeout), nprocs=world,
                                 join=False, start_method=_start_method())
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=0.2):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world} ranks running {getattr(fn, '__name__', fn)} did not finish in "
                                       f"{timeout} s (a rank waiting for a message that never comes?)")
        except mp.ProcessRaisedException as e:
            errors = sorted(Path(folder).glob("rank*.error"), key=lambda p: p.stat().st_mtime)
            first = errors[0].read_text() if errors else str(e)
            raise RuntimeError(f"a rank failed; the first error:\n{first}") from e
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
        return [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=False) for r in range(world)]
