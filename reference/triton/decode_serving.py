"""The decode entry points of the package (``reference.triton.flash_decode`` / ``paged_decode``): the teaching
kernels of ``decode.py`` and ``paged.py`` with recorded launches and reused ticket counters.

A serving loop calls decode once per generated token with the same shapes, and Triton's launch path costs about
as much host time as the kernel takes at batch 1 (``reference.triton._fastlaunch``). So the first eager call of
each shape takes the teaching path (checks, then ``decode.launch_decode``) and records its launch; the next
call with the same key (shapes, strides, dtypes, options, the scoped decode config, the stream) repeats it on
its own tensors after the value checks only. Only single-kernel launches (one split, or the fused merge) are
recorded; the fused merge's counters come from one zeroed buffer per device and stream, which each launch
leaves zeroed, instead of a fresh one per call. Results are those of ``decode.flash_decode`` /
``paged.paged_decode``.
"""
from __future__ import annotations

import torch

from . import _checks, _fastlaunch, configs, decode, paged
from ._checks import check_block_tables, check_seq_lens
from ._device import INTERPRET

#: the fused merge's ticket counters, one int32 per (batch, kv head) and merge group, zero between launches
_COUNTERS = _fastlaunch.TicketCounters(256)
LAUNCH_CACHE = _fastlaunch.LaunchCache()
_SLOTS = ("Q", "K", "V", "SeqLens", "BlockTables", "Out", "DescK", "DescV")


def clear_launch_cache() -> None:
    """Forget every recorded launch (the next eager call of each shape takes the full path again)."""
    LAUNCH_CACHE.clear()


def fast_key(kind: str, tensors, *options, enabled: bool = True):
    """Key of a recorded launch, or None when ``enabled`` is False (a caller's ``fast_launch=False``), an input
    is not a plain tensor on a CUDA device or when interpreting: then the call takes the full path, whose checks
    raise the proper errors. ``options`` must include the call's ``config``; the scoped default
    (``configs.pinned(decode=...)``) is added here, so a recorded launch never outlives the configuration it
    was recorded with."""
    if INTERPRET or not enabled:
        return None
    parts = [kind]
    for t in tensors:
        if t is None:
            parts.append(None)
        elif type(t) is not torch.Tensor or t.device.type != "cuda":
            return None
        else:
            parts.append(_fastlaunch.tensor_key(t))
    key = (*parts, *options, configs.scoped_decode(), _fastlaunch.stream_key(tensors[0].device))
    try:
        hash(key)
    except TypeError:  # an unhashable option: the full path names it
        return None
    return key


def recorded_launch(kind: str, tensors, *options):
    """The launch recorded for a call of ``kind`` ("contiguous": ``flash_decode``, "paged": ``paged_decode``) on
    ``tensors`` with ``options`` (``num_splits``, ``scale``, ``config``, as the entry point passes them to
    ``fast_key``), or None: what the next such call will repeat (benchmarks read it to time the launch alone)."""
    key = fast_key(kind, tensors, *options)
    return LAUNCH_CACHE.get(key) if key is not None else None


def one_launch(call: decode.DecodeCall) -> bool:
    """Whether ``decode.launch_decode`` runs ``call`` as one kernel (one split, or the splits merged in stage 1):
    only such a launch is recorded."""
    paged = call.block_tables is not None
    return call.num_splits == 1 or decode.base_config(call.q.dtype, paged, call.num_splits, call.config).fuse_merge


def _launch(call: decode.DecodeCall, key):
    """``decode.launch_decode`` on a checked call, recording stage 1 under ``key`` where it is the whole launch."""
    def record(kernel, grid, args, kwargs):
        rec = _fastlaunch.launch_and_record(kernel, grid, args, kwargs, _SLOTS)
        if rec is not None:
            LAUNCH_CACHE.put(key, rec)
    launch = record if key is not None and one_launch(call) else None
    return decode.launch_decode(*call, counters=_COUNTERS.buffer, launch=launch)


def repeat_launch(rec, q, k, v, seq_lens, block_tables):
    """Repeat a recorded decode launch on new tensors of the recorded shapes; returns the output. A launch
    recorded with TMA descriptors gets descriptors of the new K/V (same shapes and box)."""
    out = torch.empty_like(q)
    i = rec.slots["DescK"]
    desc_k = rec.args[i]
    if isinstance(desc_k, torch.Tensor):
        desc_k, desc_v = k, v
    else:
        desc_k, desc_v = decode.descriptors(k, v, desc_k.block_shape[0])
    rec({"Q": q, "K": k, "V": v, "SeqLens": q if seq_lens is None else seq_lens,
         "BlockTables": q if block_tables is None else block_tables, "Out": out, "DescK": desc_k, "DescV": desc_v})
    return out


def flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None, *, validate=True, config=None,
                 fast_launch=True):
    """``decode.flash_decode`` (same arguments and result); fast_launch=False always takes the full path (checks
    + Triton's launch) instead of repeating a recorded launch of the same shapes."""
    key = fast_key("contiguous", (q, k, v, seq_lens), num_splits, scale, config, enabled=fast_launch is True)
    rec = LAUNCH_CACHE.get(key) if key is not None else None
    if rec is not None and type(validate) is bool:  # shapes, strides, dtypes, options of a checked call
        if validate and seq_lens is not None:       # only the value checks remain
            check_seq_lens(seq_lens, q.shape[0], k.shape[2], "Nmax = k.shape[2]", True)
        return repeat_launch(rec, q, k, v, seq_lens, None)
    _checks.check_flag(fast_launch, "fast_launch")
    call = decode.check_call(q, k, v, seq_lens, num_splits, scale, validate, config)
    direct = q.is_contiguous() and k.stride(-1) == 1 and v.stride(-1) == 1  # no copies: a launch to record
    return _launch(call, key if direct else None)


def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale=None, *, num_splits=None, validate=True,
                 config=None, fast_launch=True):
    """``paged.paged_decode`` (same arguments and result); fast_launch=False always takes the full path (no
    recorded launch)."""
    key = fast_key("paged", (q, k_cache, v_cache, block_tables, seq_lens), num_splits, scale, config,
                   enabled=fast_launch is True)
    rec = LAUNCH_CACHE.get(key) if key is not None else None
    if rec is not None and type(validate) is bool:  # shapes, strides, dtypes, options of a checked call
        if validate:                                # only the value checks remain
            check_block_tables(block_tables, seq_lens, q.shape[0], k_cache.shape[0], k_cache.shape[1], True)
        return repeat_launch(rec, q, k_cache, v_cache, seq_lens, block_tables)
    _checks.check_flag(fast_launch, "fast_launch")
    call = paged.check_call(q, k_cache, v_cache, block_tables, seq_lens, scale, num_splits, validate, config)
    direct = (q.is_contiguous() and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
              and call.block_tables.stride(1) == 1 and call.seq_lens.is_contiguous())  # no copies: a launch to record
    return _launch(call, key if direct else None)
