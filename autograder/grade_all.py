"""Grading many submissions in parallel: each one in its own ``python -m autograder grade`` process (on a CPU
forked from a server that has imported the grader: ``grade_forks``), so a crash (or a submission that kills its
grader) never stops the rest; a submission whose grader failed gets a
result with score 0 and the reason. One JSON and one text report per submission, one CSV row per student (the
file's stem, or the subfolder's name in an LMS download: ``collect``), a histogram of the scores.

On a GPU machine every visible GPU (or those ``--gpus`` names) grades: each grading process gets one of them
through ``CUDA_VISIBLE_DEVICES`` (the least busy when it starts), and the gradings sharing a GPU share its
timing lane (``gpu_lane.py``): their correctness calls run together, their speed cases one at a time."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from . import specs
from .pick import PickError, candidates, pick
from .sandbox import REPO

SUFFIXES = (".ipynb", ".py")


def find_submissions(folder) -> list:
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"DIR must be a folder of submissions, got {folder}")
    return sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file()
                  and not p.name.startswith((".", "_")))


def collect(folder, assignment):
    """The submissions of ``folder``: every ``.ipynb``/``.py`` file in it (the student is the file's stem), and
    one per subfolder (the student is the folder's name; the file is the only notebook/module in it, or the one
    named for the assignment: ``autograder.pick``). Returns ``(paths, names, problems)``: ``names`` maps each
    path to its student, ``problems`` maps a student whose subfolder had no single submission to why."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"DIR must be a folder of submissions, got {folder}")
    paths, names, problems, taken = [], {}, {}, set()

    def unique(name):
        base, n = name, 2
        while name in taken:
            name, n = f"{base}-{n}", n + 1
        taken.add(name)
        return name
    for p in find_submissions(folder):
        paths.append(p)
        names[p] = unique(p.stem)
    for d in sorted(x for x in folder.iterdir() if x.is_dir() and not x.name.startswith((".", "_"))):
        try:
            p = pick(candidates(d), assignment, where=f"{d.name}/")
        except PickError as exc:
            problems[unique(d.name)] = str(exc)
            continue
        paths.append(p)
        names[p] = unique(d.name)
    return paths, names, problems


def visible_gpus(env=None) -> list:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries: its own list when set, else
    ``0 .. n-1`` for the n GPUs torch counts (none without CUDA)."""
    env = os.environ if env is None else env
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return [g.strip() for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    try:
        import torch
        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def choose_gpus(spec, visible) -> list:
    """``--gpus``: ``all`` (every visible GPU), a count ``N`` (the first N), or a comma list of visible GPUs."""
    if not visible:
        raise ValueError("--gpus: no GPU is visible (CUDA_VISIBLE_DEVICES empty, or no CUDA device)")
    spec = (spec or "all").strip()
    if spec == "all":
        return list(visible)
    if spec.isdigit():
        n = int(spec)
        if not 1 <= n <= len(visible):
            raise ValueError(f"--gpus {n}: expected 1 to {len(visible)} (visible GPUs: {', '.join(visible)})")
        return list(visible[:n])
    picked = [g.strip() for g in spec.split(",") if g.strip()]
    bad = [g for g in picked if g not in visible]
    if bad or not picked or len(set(picked)) != len(picked):
        raise ValueError(f"--gpus {spec}: expected 'all', a count, or distinct GPUs among the visible ones "
                         f"({', '.join(visible)})")
    return picked


class GpuSlots:
    """Hands each starting grading the GPU with the fewest gradings running (ties: the first listed)."""

    def __init__(self, gpus):
        self.running = {g: 0 for g in gpus}
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            g = min(self.running, key=lambda k: self.running[k])
            self.running[g] += 1
            return g

    def give(self, g):
        with self.lock:
            self.running[g] -= 1


def grade_one(assignment, path, json_path, device="auto", timeout=None, extra=(), gpu=None, forks=None):
    """Run one grade in a subprocess; return the result dict (a failure result if the grader failed). ``gpu``:
    the ``CUDA_VISIBLE_DEVICES`` of that process (one GPU, whose timing lane it then uses). ``forks``: a fork
    server (``grade_forks.Forks``) that starts that process already imported (the subprocess where it fails)."""
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
        env = dict(os.environ, PYTHONPATH=REPO)
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        p = None
        if forks is not None:
            from .grade_forks import ForkError
            with contextlib.suppress(ForkError):
                p = forks.run(cmd[3:], cwd=REPO, env=env, timeout=timeout)
        if p is None:
            p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
        if p.returncode != 0:
            err = f"grader exited with status {p.returncode}: {p.stderr.strip()[-800:]}"
    except subprocess.TimeoutExpired:
        err = f"grader did not finish within {timeout:.0f} s"
    if err is None and os.path.exists(json_path):
        with open(json_path) as f:
            result = json.load(f)
        if gpu is not None:
            result["gpu"] = str(gpu)
        return result
    result = {"assignment": spec.id, "submission": str(path), "score": 0.0, "max_score": spec.max_points,
              "bonus": 0.0, "max_bonus": spec.max_bonus, "device": device, "tests": [], "flags": [],
              "grader_error": err or "no result written",
              "execution_time": round(time.monotonic() - t0, 3)}
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    return result


def grade_many(assignment, paths, out_dir, jobs=2, device="auto", progress=True, names=None, extra=(), gpus=None):
    """Grade ``paths`` with ``jobs`` workers; returns {path: result}. JSONs go to ``out_dir/<name>.json``, the
    text report beside it (``<name>.txt``). ``gpus``: the GPUs to spread the gradings over (``GpuSlots``).
    Relative paths are taken from the caller's working directory."""
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    names = names or {p: Path(p).stem for p in paths}
    results = {}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(paths), desc=f"grading {assignment}", unit="sub")
    slots = GpuSlots(gpus) if gpus else None

    def one(p):
        gpu = slots.take() if slots else None
        try:
            return grade_one(assignment, p, os.path.join(out_dir, f"{names[p]}.json"), device, None, extra, gpu,
                             forks)
        finally:
            if slots:
                slots.give(gpu)
    with _zygote(assignment, device, len(paths)), forking(device, len(paths), [assignment]) as forks, \
            ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futs = {pool.submit(one, p): p for p in paths}
        for fut in as_completed(futs):
            p = futs[fut]
            try:
                results[p] = fut.result()
            except Exception as exc:  # noqa: BLE001 -- one failure never stops the others
                results[p] = {"assignment": assignment, "submission": str(p), "score": 0.0, "max_score": 0.0,
                              "bonus": 0.0, "max_bonus": 0.0, "tests": [], "flags": [], "grader_error": repr(exc)}
            write_report(results[p], os.path.join(out_dir, f"{names[p]}.txt"), names[p])
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    return results


def _zygote(assignment, device, count):
    """The selftest's zygotes (``zygote.running``) for several gradings on a CPU: a Triton assignment's grading
    and compile children are forked with torch and Triton imported instead of importing both each (about 1.2 s
    of CPU per child), a NumPy assignment's with NumPy. Nothing for a GPU or a single submission (a torch
    assignment's grading then starts its own: ``engine._own_zygotes``)."""
    if count < 2 or device not in ("cpu", "auto"):
        return contextlib.nullcontext()
    from .engine import detect_device
    from .zygote import running
    kinds = ("torch", "compile") if specs.load(assignment).needs_torch else ("numpy",)
    return running("cpu", kinds) if detect_device(device) == "cpu" else contextlib.nullcontext()


def forking(device, count, assignments=()):
    """A fork server (``grade_forks``) for several gradings on a CPU: each grading process starts with NumPy, the
    grader and the ``assignments``' ``Spec.parent_imports`` imported (about 0.4 s of CPU less per submission, a7's
    another 0.85 s). Yields None for a GPU or a single submission (or where the server does not start): the
    gradings run as subprocesses."""
    if count < 2 or device not in ("cpu", "auto"):
        return contextlib.nullcontext()
    from .engine import detect_device
    from .grade_forks import forks
    preload = tuple(dict.fromkeys(m for aid in assignments for m in specs.load(aid).parent_imports))
    return forks(REPO, preload) if detect_device(device) == "cpu" else contextlib.nullcontext()


def unpicked(assignment, problems: dict) -> dict:
    """A 0-point result for each student whose subfolder held no single submission (``collect``), keyed by a
    pseudo-path (the student's name): status ``unreadable`` with the reason, like an unreadable file."""
    spec = specs.load(assignment)
    return {name: {"assignment": spec.id, "submission": name, "score": 0.0, "max_score": spec.max_points,
                   "bonus": 0.0, "max_bonus": spec.max_bonus, "device": "-", "tests": [], "flags": [],
                   "submission_error": why, "execution_time": 0.0} for name, why in problems.items()}


def write_report(result: dict, path, student: str) -> None:
    """The student's plain-text report beside the JSON: who and which file, then the grade table."""
    from .report import table
    head = [f"student: {student}", f"file: {result.get('submission', '')}"]
    if result.get("gpu") is not None:
        head.append(f"GPU: {result['gpu']}")
    if result.get("grader_error"):
        body = f"GRADER ERROR (0 points; grade this submission again alone): {result['grader_error']}"
    else:
        try:
            body = table(result, width=110, verbose=True)
        except (KeyError, TypeError, ValueError) as exc:      # a malformed result still gets a report
            body = f"(no table: {type(exc).__name__}: {exc})\nscore {result.get('score')} / {result.get('max_score')}"
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(head) + "\n\n" + body + "\n")


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
