"""Are GPU speed points reproducible? The same submission graded ``--gradings`` times alone and ``--gradings``
times inside ``grade-all -j JOBS`` on one GPU, plus a copy whose kernel does 3x the work, which must lose its
speed points in both modes (docs/design.md §6, T21).

Subjects (a4 by default): the assignment's solution source and ``s_split_thrice`` (the zoo's mutant that
launches the split kernel three times; ``autograder/submissions/a4_decoding/wrong/``). Alone: one
``python -m autograder grade ... --test speed`` process after another (only the speed test: what is timed is the
same as in a full grading). Under load: ``grade-all -j JOBS --gpus 1`` over a folder holding ``--gradings``
copies of each subject, full gradings, so correctness cases of the other gradings run while one is timed (the
GPU lane makes its timed reps exclusive: autograder/gpu_lane.py). Each grading's speed score, graded ratio, the
clock it used, and the ratio the host clock would have given (geometric mean over cases of the median host
times) go to ``--out`` (rewritten after each step), with the spread per subject and mode and the verdicts:
the solution's 2 x ``--gradings`` scores within ``--max-spread`` points and at full points, the slow copy at
no more than ``--slow-max`` of the points in every grading.

    python3 -m benchmarks.grader.speed_stability --out $OUT/h200-grader-speed-stability.json   # on a GPU
    python3 -m benchmarks.grader.speed_stability --smoke --out /tmp/stab.json                # CPU plumbing

``--smoke`` grades on the CPU (the speed test is "not run" there): it checks the plumbing, not the numbers.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder import specs
from autograder.selftest import materialise_mutant
from benchmarks import ROOT

SLOW = {"a4_decoding": "s_split_thrice"}
FIELDS = {
    "score": "the speed test's points (of 'points'), from 'ratio' with speed_full/speed_zero",
    "ratio": "graded ratio: geometric mean over cases of median student time / median reference time, on the "
             "clock named in 'clock' (device: the GPU's busy time of the call, autograder/device_clock.py)",
    "host_ratio": "the same calls timed by the child's host clock; the profiler that gives the device clock runs "
                  "around them and adds 2-4 ms of host time per call, so this is not the unprofiled host time",
    "cases": "per case: median device times (student_s, reference_s) and host times, seconds; lane_wait_s: "
             "seconds the case waited for the GPU's timing lane",
}


def subjects(aid, tmp):
    out = {"solution": ROOT / "assignments" / aid / f"{aid}_solution.py"}
    mutant = ROOT / "autograder" / "submissions" / aid / "wrong" / f"{SLOW[aid]}.mutant.json"
    out["slow_3x"] = materialise_mutant(mutant, Path(tmp) / "mutants")
    return out


def speed_entry(result: dict) -> dict:
    """The speed test of one grading's JSON: score, points, graded ratio, clock, and the host-clock ratio."""
    t = next((t for t in result.get("tests", []) if "speed" in t["name"] and not t.get("optional")), None)
    if t is None:
        return {"status": "missing", "error": result.get("grader_error")}
    cases = t.get("speed") or []
    host = None
    if cases and all(c.get("student_host_s") and c.get("reference_host_s") for c in cases):
        host = math.exp(statistics.fmean(math.log(c["student_host_s"] / c["reference_host_s"]) for c in cases))
    return {"status": t["status"], "score": t["score"], "points": t["max_score"], "ratio": t.get("ratio"),
            "clock": sorted({c.get("clock", "host") for c in cases}), "host_ratio": host,
            "cases": [{k: c.get(k) for k in ("case", "student_s", "reference_s", "student_host_s",
                                              "reference_host_s", "lane_wait_s", "clock_note")} for c in cases],
            "output": t["output"][:300], "time": t.get("time")}


def grade_alone(aid, path, device, json_path, timeout):
    cmd = [sys.executable, "-m", "autograder", "grade", aid, str(path), "--device", device, "--test", "speed",
           "--json", str(json_path), "--quiet"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.monotonic() - t0
    if p.returncode != 0 or not Path(json_path).exists():
        return {"status": "grader-error", "error": p.stderr[-800:], "wall_s": wall}
    return {**speed_entry(json.loads(Path(json_path).read_text())), "wall_s": wall}


def grade_all(aid, paths, device, jobs, n, tmp, timeout):
    """``grade-all -j jobs --gpus 1`` over ``n`` copies of each subject; {subject: [entries]} and the wall time."""
    folder = Path(tmp) / "roster"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for label, path in paths.items():
        for i in range(n):
            shutil.copy(path, folder / f"{label}-{i}.py")
    out = Path(tmp) / "roster-out"
    cmd = [sys.executable, "-m", "autograder", "grade-all", aid, str(folder), "-j", str(jobs), "--device", device,
           "--out", str(out), "--csv", str(Path(tmp) / "roster.csv")]
    if device == "cuda":
        cmd += ["--gpus", "1"]
    t0 = time.monotonic()
    # its own process group: on a timeout the whole batch (grade-all and every grading it started) is ended, and
    # the gradings that finished still count
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    try:
        text, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        text, _ = p.communicate()
        text += f"\n[speed_stability] grade-all stopped after {timeout:.0f} s"
    wall = time.monotonic() - t0
    res = {label: [] for label in paths}
    for label in paths:
        for i in range(n):
            j = out / f"{label}-{i}.json"
            res[label].append(speed_entry(json.loads(j.read_text())) if j.exists() else {"status": "missing"})
    return res, wall, p.returncode, text[-1500:]


def ramp(ratio, full, zero, points):
    """The engine's speed score (``engine._speed_score``): full points at <= ``full``, none at >= ``zero``."""
    return points * min(1.0, max(0.0, (zero - ratio) / (zero - full)))


def rescore(data, full, zero):
    """Every recorded grading scored again from its graded ratio with thresholds ``full``/``zero`` (the ratios
    do not depend on the thresholds): what a run under other thresholds would have given."""
    for mode in data["modes"].values():
        for entries in mode.values():
            for e in entries:
                if e.get("ratio") is not None:
                    e["score_as_graded"] = e.get("score_as_graded", e["score"])
                    e["score"] = round(ramp(e["ratio"], full, zero, e["points"]), 4)
    data["rescored"] = {"speed_full": full, "speed_zero": zero,
                        "why": "scores recomputed from the recorded ratios with the spec's thresholds; "
                               "score_as_graded is what the run's thresholds gave"}
    data["speed_full"], data["speed_zero"] = full, zero
    data.setdefault("fields", FIELDS)


def verdicts(data, points_full, max_spread, slow_max):
    out = {}
    for label in data["subjects"]:
        scores = {m: [e.get("score") for e in data["modes"].get(m, {}).get(label, []) if e.get("score") is not None]
                  for m in ("alone", "grade_all")}
        every = scores["alone"] + scores["grade_all"]
        ratios = [e.get("ratio") for m in ("alone", "grade_all") for e in data["modes"].get(m, {}).get(label, [])
                  if e.get("ratio")]
        hosts = [e.get("host_ratio") for m in ("alone", "grade_all") for e in data["modes"].get(m, {}).get(label, [])
                 if e.get("host_ratio")]
        v = {"measured_modes": [m for m in ("alone", "grade_all") if scores[m]], "scores": scores, "spread": (max(every) - min(every)) if every else None,
             "ratio_range": [min(ratios), max(ratios)] if ratios else None,
             "host_ratio_range": [min(hosts), max(hosts)] if hosts else None}
        for m in ("alone", "grade_all"):
            s = scores[m]
            v[f"{m}_spread"] = (max(s) - min(s)) if s else None
        if not (scores["alone"] and scores["grade_all"]):
            v["ok"] = None                      # a mode was not measured: no verdict
        elif label == "solution":
            v["ok"] = v["spread"] <= max_spread and min(every) >= points_full - 1e-9
        else:
            v["ok"] = max(every) <= slow_max * points_full
        out[label] = v
    return out


def environment():
    env = {"python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count()}
    try:
        import torch
        import triton
        env.update(torch=torch.__version__, triton=triton.__version__,
                   gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except ImportError:
        pass
    return env


def probe_device_clock():
    """The device clock in this process (no sandbox): what the profiler records for one small kernel."""
    try:
        import torch
        from autograder.device_clock import device_time
        if not torch.cuda.is_available():
            return {"ok": False, "why": "no GPU"}
        x = torch.randn(1 << 24, device="cuda")
        torch.cuda.synchronize()
        with device_time("cuda") as box:
            y = x * 2
            torch.cuda.synchronize()
        del y
        return {"ok": box["s"] is not None, "s": box["s"], "error": box["error"]}
    except Exception as exc:  # noqa: BLE001 -- a probe reports, never stops the benchmark
        return {"ok": False, "why": repr(exc)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--assignment", default="a4_decoding")
    ap.add_argument("--gradings", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--max-spread", type=float, default=0.5, help="points, over all gradings of the solution")
    ap.add_argument("--slow-max", type=float, default=0.1, help="fraction of the speed points the slow copy may keep")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU plumbing check (speed tests are not run there)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds for one grading alone")
    ap.add_argument("--budget", type=float, default=900, help="seconds for the whole run: grade-all gets what is left")
    ap.add_argument("--modes", nargs="+", choices=("alone", "grade_all"), default=["alone", "grade_all"],
                    help="which modes to run (a run of one mode can be merged into a run of the other: --merge)")
    ap.add_argument("--merge", help="an earlier JSON of this script: its modes that this run does not measure are "
                                    "kept (same assignment)")
    ap.add_argument("--rescore", action="store_true",
                    help="no grading: score --merge's recorded ratios with the spec's current thresholds, write --out")
    args = ap.parse_args(argv)
    aid = specs.resolve(args.assignment)
    device = "cpu" if args.smoke else "cuda"
    spec = specs.load(aid)
    test = next(t for t in spec.tests if t.kind == "speed" and not t.optional)
    if args.rescore:
        data = json.loads(Path(args.merge).read_text())
        rescore(data, test.speed_full, test.speed_zero)
        data["verdicts"] = verdicts(data, test.points, args.max_spread, args.slow_max)
        Path(args.out).write_text(json.dumps(data, indent=1))
        for label, v in data["verdicts"].items():
            print(f"{label}: {v}")
        return 0
    tmp = tempfile.mkdtemp(prefix="speed-stability-")
    paths = subjects(aid, tmp)
    data = {"assignment": aid, "test": test.name, "speed_full": test.speed_full, "speed_zero": test.speed_zero,
            "points": test.points, "gradings": args.gradings, "jobs": args.jobs, "device": device,
            "environment": environment(), "device_clock_probe": probe_device_clock() if not args.smoke else None,
            "subjects": {k: str(v.relative_to(ROOT)) if v.is_relative_to(ROOT) else v.name for k, v in paths.items()},
            "modes": {}, "wall_s": {}, "fields": FIELDS}
    if args.merge:
        old = json.loads(Path(args.merge).read_text())
        if old.get("assignment") != aid:
            raise SystemExit(f"--merge: {args.merge} is of {old.get('assignment')}, not {aid}")
        data["modes"] = {m: v for m, v in old["modes"].items() if m not in args.modes and v}
        data["merged_from"] = {m: {"environment": old.get("environment"), "wall_s": old.get("wall_s", {}).get(m)}
                               for m in data["modes"]}

    def save():
        data["verdicts"] = verdicts(data, test.points, args.max_spread, args.slow_max)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(data, indent=1))

    t0 = time.monotonic()
    if "alone" in args.modes:
        data["modes"]["alone"] = {k: [] for k in paths}
    for i in range(args.gradings if "alone" in args.modes else 0):   # one grading at a time, subjects interleaved
        for label, path in paths.items():
            e = grade_alone(aid, path, device, Path(tmp) / f"alone-{label}-{i}.json", args.timeout)
            data["modes"]["alone"][label].append(e)
            print(f"[alone {i}] {label}: score {e.get('score')} ratio {e.get('ratio')} clock {e.get('clock')} "
                  f"host-clock ratio {e.get('host_ratio')} ({e.get('wall_s', 0):.0f} s)", flush=True)
            save()
    if "alone" in args.modes:
        data["wall_s"]["alone"] = time.monotonic() - t0
    if "grade_all" in args.modes:
        left = max(60.0, args.budget - (time.monotonic() - t0))
        res, wall, rc, tail = grade_all(aid, paths, device, args.jobs, args.gradings, tmp, left)
        data["modes"]["grade_all"] = res
        data["wall_s"]["grade_all"] = wall
        data["grade_all_exit"] = rc
        data["grade_all_tail"] = tail
        for label, es in res.items():
            for i, e in enumerate(es):
                print(f"[grade-all -j {args.jobs}] {label}-{i}: score {e.get('score')} ratio {e.get('ratio')} "
                      f"clock {e.get('clock')} host-clock ratio {e.get('host_ratio')}", flush=True)
    save()
    for label, v in data["verdicts"].items():
        print(f"{label}: scores alone {v['scores']['alone']} grade-all {v['scores']['grade_all']} spread "
              f"{v['spread']} ratios {v['ratio_range']} host-clock ratios {v['host_ratio_range']} ok={v['ok']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
