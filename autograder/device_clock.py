"""The GPU's own clock for a timed call: how long the device was busy with the work the call launched.

A timed call's host time on a GPU is mostly not the kernel: Python, Triton's launch path, the given input checks'
host reads and the final synchronise cost 0.2-0.5 ms per call in a grading child, against 70-300 us of kernel
time for a4/a5's decode cases on an H200. That fixed part compresses every ratio towards 1 (a kernel made 3x
slower graded ~1.7x) and grows with the CPU load of other gradings. So the grader times the device: the
profiler's record of every kernel, copy and fill the call ran (CUPTI activity records, stamped by the GPU), on
every stream, measured as the length of the union of their intervals. ``notes/speed_calibration.md`` has the
measurements. Runs in the sandboxed child, around the call, inside the host clock (``child._timed``).
"""
from __future__ import annotations

import contextlib


def busy_seconds(intervals) -> float:
    """Length of the union of ``(start, end)`` intervals (any unit; overlapping streams count once)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((float(s), float(e)) for s, e in intervals if e > s):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _device_intervals(prof):
    """(start_us, end_us) of every device activity (kernel, memcpy, memset) of a finished profile."""
    from torch.autograd import DeviceType
    out = [(e.time_range.start, e.time_range.end) for e in prof.events()
           if getattr(e, "device_type", None) == DeviceType.CUDA]
    if not out:                  # the raw records, where the parsed events carry no device entries
        raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
        for e in (raw.events() if raw is not None else ()):
            if e.device_type() == DeviceType.CUDA:
                out.append((e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3))
    return out


@contextlib.contextmanager
def device_time(device: str):
    """``with device_time(dev) as box: call; synchronise`` -> ``box["s"]``: seconds the GPU was busy, or None (CPU,
    no profiler, no device activity recorded; ``box["error"]`` says why). The caller synchronises inside."""
    box = {"s": None, "error": None}
    if not str(device).startswith("cuda"):
        yield box
        return
    try:
        from torch.profiler import ProfilerActivity, profile
        prof = profile(activities=[ProfilerActivity.CUDA])
        prof.__enter__()
    except Exception as exc:  # noqa: BLE001 -- no profiler: the host clock decides
        box["error"] = f"profiler unavailable: {type(exc).__name__}: {exc}"[:300]
        yield box
        return
    try:
        yield box
    finally:
        try:
            prof.__exit__(None, None, None)
            busy = busy_seconds(_device_intervals(prof)) * 1e-6
            if busy > 0:
                box["s"] = busy
            else:
                box["error"] = "no device activity recorded"
        except Exception as exc:  # noqa: BLE001
            box["error"] = f"profiler failed: {type(exc).__name__}: {exc}"[:300]
