"""The GPU timing lane (autograder/gpu_lane.py) and the device clock of timed calls (autograder/device_clock.py):
a speed case's timed reps never overlap another process's calls on the same GPU, a dead holder releases the
lane, a waiting speed case is not starved by correctness calls, and the grade uses the device's clock only when
both children measured every timed rep with it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from autograder.device_clock import busy_seconds
from autograder.engine import Grader, _Timing, pick_device
from autograder.evaluate import Verdict
from autograder.gpu_lane import Lane, lane_key

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _holder(folder, mode, key="0", hold=30.0):
    """A separate process holding the lane (``exclusive`` or ``shared``); prints ``held`` once it has it."""
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        from pathlib import Path
        from autograder.gpu_lane import Lane
        lane = Lane(key={key!r}, folder=Path({str(folder)!r}))
        with lane.{mode}():
            print("held", flush=True)
            time.sleep({hold})
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def _waited(lane, mode):
    t0 = time.monotonic()
    with getattr(lane, mode)():
        return time.monotonic() - t0


def test_exclusive_waits_for_a_shared_holder_and_a_killed_holder_releases(tmp_path):
    p = _holder(tmp_path, "shared")
    lane = Lane(key="0", folder=tmp_path, timeout=0.3)
    with lane.exclusive() as waited:
        assert waited is None                  # gave up after the timeout: the other process still holds it
    assert lane.gave_up == 1
    p.send_signal(signal.SIGKILL)              # however the holder dies, the kernel releases its locks
    p.wait()
    lane = Lane(key="0", folder=tmp_path, timeout=5)
    with lane.exclusive() as waited:
        assert waited is not None and waited < 1.0


def test_shared_calls_run_together_but_not_inside_a_timed_case(tmp_path):
    p = _holder(tmp_path, "shared")
    try:
        assert _waited(Lane(key="0", folder=tmp_path, timeout=5), "shared") < 0.5   # readers share
    finally:
        p.kill()
        p.wait()
    p = _holder(tmp_path, "exclusive", hold=0.8)
    try:
        w = _waited(Lane(key="0", folder=tmp_path, timeout=10), "shared")
        assert w > 0.4, w                   # a correctness call waits for the timed reps to end
    finally:
        p.wait()


def test_lanes_of_different_gpus_are_independent(tmp_path):
    p = _holder(tmp_path, "exclusive", key="1")
    try:
        assert _waited(Lane(key="0", folder=tmp_path, timeout=5), "exclusive") < 0.5
    finally:
        p.kill()
        p.wait()


def test_a_waiting_speed_case_is_not_starved_by_new_correctness_calls(tmp_path):
    reader = _holder(tmp_path, "shared", hold=1.0)
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        from pathlib import Path
        from autograder.gpu_lane import Lane
        lane = Lane(key="0", folder=Path({str(tmp_path)!r}))
        with lane.exclusive():
            print("writer", time.monotonic(), flush=True)
            time.sleep(0.8)
    """)
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    time.sleep(0.4)                           # the writer is waiting for the reader now
    lane = Lane(key="0", folder=tmp_path, timeout=10)
    t0 = time.monotonic()
    with lane.shared():                       # a new reader queues behind the waiting writer
        got = time.monotonic()
    line = writer.stdout.readline().split()
    writer.wait()
    reader.wait()
    assert line[0] == "writer"
    assert got >= float(line[1]) + 0.7, (got - t0, float(line[1]) - t0)


def test_lane_is_reentrant_within_a_process(tmp_path):
    lane = Lane(key="0", folder=tmp_path, timeout=1)
    with lane.exclusive() as w:
        assert w is not None
        with lane.shared():                   # a correctness call of the same grading: no self-deadlock
            assert lane.held == "exclusive"
    assert lane.held is None and lane.gave_up == 0


def test_lane_key_is_the_first_visible_gpu():
    assert lane_key({}) == "0"
    assert lane_key({"CUDA_VISIBLE_DEVICES": "3,1"}) == "3"
    assert lane_key({"CUDA_VISIBLE_DEVICES": "GPU-ab/c"}) == "GPU-ab_c"


def test_busy_seconds_is_the_union_of_device_intervals():
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0, 10), (5, 12), (20, 21), (3, 3)]) == pytest.approx(13.0)
    assert busy_seconds([(20, 30), (0, 5)]) == pytest.approx(15.0)    # unsorted, disjoint


def test_device_clock_only_when_every_timed_rep_has_it():
    t = _Timing(student=[3.0, 3.0], reference=[1.0, 1.0], student_dev=[0.2, 0.2], reference_dev=[0.1, 0.1])
    assert t.clock() == ("device", [0.2, 0.2], [0.1, 0.1])
    t.reference_dev[1] = None
    assert t.clock()[0] == "host"
    assert pick_device(0.01, {"device": 0.02}) is None        # longer than the parent's own clock: not believed
    assert pick_device(0.01, {"device": 0.005}) == 0.005
    assert pick_device(0.01, {"device": None}) is None


def test_speed_case_holds_the_lane_exclusively_for_its_timed_reps(tmp_path):
    """The engine's timing path with the children replaced: the warm-up rep runs outside the lane, every timed
    rep of both children inside it, the lane is free again afterwards, and the device clock decides the ratio."""
    g = Grader("a4_decoding", "cuda", seed=3)
    g.lane = Lane(key="t", folder=tmp_path, timeout=5)
    seen = []

    def fake_timed(sb, task, header, arrays, fetch, on_trap=None, audit=False):
        seen.append((sb, audit, g.lane.held))
        dev = 0.002 if sb == "student" else 0.001
        return {"t": "result"}, [], 0.05, {"host": 0.01, "device": dev, "device_error": None}

    g._timed, g.student = fake_timed, lambda: "student"
    g._check_timed = lambda *a: Verdict(True)
    g._after_call = lambda *a: None
    test = next(t for t in g.spec.tests if t.kind == "speed")
    task = g.spec.tasks[test.task]
    timing = g._time_case(test, task, "reference", dict(B=1, Hq=2, Hkv=1, N=70, d=16, dtype="float32", torch=True))
    assert [s for s in seen if s[1]] == [("student", True, None), ("reference", True, None)]   # warm-up
    timed = [s for s in seen if not s[1]]
    assert len(timed) == 2 * test.reps and all(held == "exclusive" for _, _, held in timed)
    assert g.lane.held is None
    clock, student, reference = timing.clock()
    assert clock == "device" and student == [0.002] * test.reps and reference == [0.001] * test.reps


def test_work_done_off_the_gpu_is_timed_by_the_host_clock():
    """Timed reps run without the op audit: an answer computed on the CPU there would be invisible to the device
    clock, so a call far slower than the reference's on the host clock is graded on the host clock."""
    cpu = _Timing(student=[0.060, 0.061], reference=[0.003, 0.003], student_dev=[1e-5, 1e-5],
                  reference_dev=[7e-5, 7e-5])
    clock, student, _ = cpu.clock()
    assert clock == "host" and student == [0.060, 0.061] and "off the GPU" in cpu.clock_note
    honest = _Timing(student=[0.0045, 0.0046], reference=[0.003, 0.003], student_dev=[2e-4, 2e-4],
                     reference_dev=[7e-5, 7e-5])
    assert honest.clock()[0] == "device" and honest.clock_note is None
    quick = _Timing(student=[0.004, 0.004], reference=[0.001, 0.001], student_dev=[1e-5] * 2,
                    reference_dev=[1e-5] * 2)
    assert quick.clock()[0] == "device"        # 4x the host time but only 3 ms more: within the slack


def test_device_intervals_read_the_profilers_device_records():
    """Kernel/copy records of a finished profile (``device_type`` CUDA) give the intervals, CPU ones do not; where
    the parsed events hold none, the raw records are read; on the CPU no profiler runs and no time is claimed."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from autograder.device_clock import _device_intervals, device_time

    def ev(dev, a, b):
        return NS(device_type=dev, time_range=NS(start=a, end=b))
    prof = NS(events=lambda: [ev(DeviceType.CPU, 0, 100), ev(DeviceType.CUDA, 10, 30), ev(DeviceType.CUDA, 25, 40)])
    assert _device_intervals(prof) == [(10, 30), (25, 40)]
    raw = NS(device_type=lambda: DeviceType.CUDA, start_ns=lambda: 5000, duration_ns=lambda: 2000)
    prof = NS(events=lambda: [ev(DeviceType.CPU, 0, 1)], profiler=NS(kineto_results=NS(events=lambda: [raw])))
    assert _device_intervals(prof) == [(5.0, 7.0)]
    with device_time("cpu") as box:
        pass
    assert box == {"s": None, "error": None}
