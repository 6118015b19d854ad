"""How long the autograder takes (docs/design.md §7: all CPU parts of a full submission graded in <= 2 min on 2 cores).

Grades each assignment's solution source (a full, correct submission) once, in-process (the children are the
same sandboxed processes `grade` uses), and prints per-assignment wall time, the number of tests and cases, and
the total; writes benchmarks/results/<device>-grader.json.

    python -m benchmarks.grader.bench_grader [--device cpu|cuda] [--only a1 a2]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time

from autograder import specs
from autograder.engine import Grader, detect_device
from benchmarks import RESULTS
from benchmarks import ROOT as REPO


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    device = detect_device(args.device)
    rows, total = [], 0.0
    for aid in specs.ASSIGNMENTS:
        if args.only and aid not in args.only and aid.split("_")[0] not in args.only:
            continue
        sol = REPO / "assignments" / aid / f"{aid}_solution.py"
        if not sol.exists():
            print(f"{aid}: no solution source, skipped")
            continue
        t0 = time.perf_counter()
        r = Grader(aid, device).grade(sol)
        dt = time.perf_counter() - t0
        total += dt
        ran = [t for t in r["tests"] if t["status"] != "not run"]
        slowest = max(ran, key=lambda t: t["time"]) if ran else None
        rows.append({"assignment": aid, "seconds": round(dt, 2), "score": r["score"], "max_score": r["max_score"],
                     "bonus": r.get("bonus", 0.0), "max_bonus": r.get("max_bonus", 0.0),
                     "tests_run": len(ran), "tests_not_run": len(r["tests"]) - len(ran),
                     "slowest_test": slowest["name"] if slowest else None,
                     "slowest_test_s": round(slowest["time"], 2) if slowest else None})
        bonus = f" + {r['bonus']:g}/{r['max_bonus']:g} bonus" if r.get("max_bonus") else ""
        print(f"{aid:16s} {dt:7.1f} s  score {r['score']:g}/{r['max_score']:g}{bonus}  {len(ran)} tests run"
              f"  (slowest: {slowest['name']} {slowest['time']:.1f} s)", flush=True)
    verdict = "PASS" if total <= 120 else "FAIL"
    print(f"total {total:.1f} s for all {device.upper()}-gradable parts (bar: <= 120 s on 2 cores): {verdict}")
    out = RESULTS / f"{device}-grader.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": device, "cpus": os.cpu_count(), "machine": platform.machine(),
                               "python": platform.python_version(), "total_s": round(total, 2), "bar_s": 120,
                               "verdict": verdict, "assignments": rows,
                               "when": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
