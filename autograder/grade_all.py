"""Grading many submissions in parallel: each one in its own ``python -m autograder grade`` process, so a
crash (or a submission that kills its grader) never stops the rest; a submission whose grader failed gets a
result with score 0 and the reason. One JSON per submission, one CSV row per student (file stem)."""
from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from . import specs
from .sandbox import REPO

SUFFIXES = (".ipynb", ".py")


def find_submissions(folder) -> list:
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"DIR must be a folder of submissions, got {folder}")
    return sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file()
                  and not p.name.startswith((".", "_")))


def grade_one(assignment, path, json_path, device="auto", timeout=None, extra=()):
    """Run one grade in a subprocess; return the result dict (a failure result if the grader failed)."""
    spec = specs.load(assignment)
    timeout = timeout or spec.total_timeout + 180
    # the grade runs with the repository as its working directory: every path must be absolute by now
    path, json_path = os.path.abspath(path), os.path.abspath(json_path)
    cmd = [sys.executable, "-m", "autograder", "grade", spec.id, str(path), "--json", str(json_path),
           "--device", device, "--quiet", *extra]
    t0 = time.monotonic()
    err = None
    if os.path.exists(json_path):
        os.remove(json_path)
    try:
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, PYTHONPATH=REPO))
        if p.returncode != 0:
            err = f"grader exited with status {p.returncode}: {p.stderr.strip()[-800:]}"
    except subprocess.TimeoutExpired:
        err = f"grader did not finish within {timeout:.0f} s"
    if err is None and os.path.exists(json_path):
        with open(json_path) as f:
            return json.load(f)
    result = {"assignment": spec.id, "submission": str(path), "score": 0.0, "max_score": spec.max_points,
              "bonus": 0.0, "max_bonus": spec.max_bonus, "device": device, "tests": [], "flags": [],
              "grader_error": err or "no result written",
              "execution_time": round(time.monotonic() - t0, 3)}
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    return result


def grade_many(assignment, paths, out_dir, jobs=2, device="auto", progress=True, names=None, extra=()):
    """Grade ``paths`` with ``jobs`` workers; returns {path: result}. JSONs go to ``out_dir/<name>.json``.
    Relative paths are taken from the caller's working directory."""
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    names = names or {p: Path(p).stem for p in paths}
    results = {}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(paths), desc=f"grading {assignment}", unit="sub")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futs = {pool.submit(grade_one, assignment, p, os.path.join(out_dir, f"{names[p]}.json"), device,
                            None, extra): p for p in paths}
        for fut in as_completed(futs):
            p = futs[fut]
            try:
                results[p] = fut.result()
            except Exception as exc:  # noqa: BLE001 -- one failure never stops the others
                results[p] = {"assignment": assignment, "submission": str(p), "score": 0.0, "max_score": 0.0,
                              "bonus": 0.0, "max_bonus": 0.0, "tests": [], "flags": [], "grader_error": repr(exc)}
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    return results


COLUMNS = ["student", "score", "max_score", "percent", "bonus", "max_bonus", "flags", "status", "submission"]


def write_csv(results: dict, path, names=None):
    """One row per student: ``score``/``max_score`` over the required tests and ``percent`` = score / max_score;
    ``bonus``/``max_bonus`` the optional tests' points, apart (they add on top: percent never counts them)."""
    rows = []
    for p, r in sorted(results.items(), key=lambda kv: str(kv[0])):
        mx = r.get("max_score") or 0.0
        rows.append({
            "student": (names or {}).get(p, Path(p).stem), "score": r.get("score", 0.0), "max_score": mx,
            "percent": round(100.0 * r.get("score", 0.0) / mx, 2) if mx else 0.0,
            "bonus": r.get("bonus", 0.0), "max_bonus": r.get("max_bonus", 0.0),
            "flags": " ".join(sorted({f["id"] for f in r.get("flags", [])})),
            "status": status(r),
            "submission": str(p),
        })
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return rows


def status(result: dict) -> str:
    """``grader-error`` (the grade's process failed), ``unreadable`` (not a notebook or module),
    ``load-error`` (a cell failed while loading: the console and each affected test say which), or ``ok``."""
    if result.get("grader_error"):
        return "grader-error"
    if result.get("submission_error"):
        return "unreadable"
    if (result.get("load") or {}).get("errors"):
        return "load-error"
    return "ok"


def summary(rows) -> str:
    if not rows:
        return "no submissions"
    pct = [r["percent"] for r in rows]
    flagged = sum(1 for r in rows if r["flags"])
    count = {s: sum(1 for r in rows if r["status"] == s) for s in ("grader-error", "unreadable", "load-error")}
    bonus = sum(1 for r in rows if r.get("bonus"))
    return (f"{len(rows)} submission(s): mean {statistics.mean(pct):.1f}%, median {statistics.median(pct):.1f}%, "
            f"min {min(pct):.1f}%, max {max(pct):.1f}% (required parts)"
            + (f", {bonus} with bonus points" if any(r.get("max_bonus") for r in rows) else "")
            + f"; {flagged} flagged; {count['grader-error']} grader error(s), "
            f"{count['unreadable']} unreadable, {count['load-error']} with cells that failed while loading")
