"""Presenting a grading result: the score table, the JSON of docs/design.md §6 and Gradescope's results.json schema."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import textwrap


def table(result: dict, width: int | None = None, verbose: bool = False) -> str:
    """Plain-text report: what stopped the submission from loading (first: it explains the failures below),
    then the table (test, points, status, time, error or note) fitted to ``width`` columns (default: the
    terminal's; a longer note is cut, or with ``verbose`` wrapped in full, passed tests' notes too), the flags, the total, and a command that re-runs the first
    failing test with the same inputs."""
    head = []
    if result.get("submission_error"):
        head.append(f"SUBMISSION UNREADABLE: {result['submission_error']}")
    if result.get("hint"):
        head.append(f"NOTE: {result['hint']}")
    errors = (result.get("load") or {}).get("errors") or []
    if errors:
        head.append("LOAD ERRORS (fix these first: a test of a function defined in a failed cell cannot pass):")
        head += [f"  {e}" for e in errors]
    rows = [("test", "points", "status", "time", "error / note")]
    for t in result["tests"]:
        pts = f"{t['score']:.4g}/{t['max_score']:.4g}" if t["status"] != "not run" else "-"
        rows.append((t["name"], pts, t["status"], f"{t['time']:.2f}s",
                     t["output"] if t["status"] != "passed" or verbose else ""))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    indent = sum(w) + 2 * 4
    room = max(30, (width or shutil.get_terminal_size((120, 24)).columns) - 1 - indent)
    lines = [*head, ""] if head else []
    for i, r in enumerate(rows):
        left = "  ".join(c.ljust(w[j]) if j != 3 else c.rjust(w[j]) for j, c in enumerate(r[:4]))
        note = r[4]
        if verbose:
            parts = textwrap.wrap(note, room) or [""]
        else:
            parts = [note if len(note) <= room else note[: room - 3] + "..."]
        lines.append(f"{left}  {parts[0]}".rstrip())
        lines += [" " * (indent) + p for p in parts[1:]]
        if i == 0:
            lines.append("  ".join("-" * x for x in w) + "  " + "-" * min(room, max(len(r[4]) for r in rows)))
    lines.append("")
    for f in result.get("flags", []):
        where = f" [{f['where']}]" if f.get("where") else ""
        tasks = ", ".join(f["tasks"]) if f.get("tasks") else "all"
        lines.append(f"FLAG {f['id']} ({tasks}): {f['message']}{where} -- {f.get('explanation', '')}")
    pct = 100.0 * result["score"] / result["max_score"] if result["max_score"] else 0.0
    not_run = sum(1 for t in result["tests"] if t["status"] == "not run")
    lines.append(f"score {result['score']:.4g} / {result['max_score']:.4g} ({pct:.1f}%) on {result['device']}"
                 + (f"; {not_run} test(s) not run (excluded)" if not_run else "")
                 + f"; graded in {result['execution_time']:.1f} s")
    repro = reproduce(result)
    if repro:
        lines.append(f"first failure, again with the same inputs: {repro}")
    return "\n".join(lines)


# failures that re-running one test would only repeat: the fix is in the notebook, not in a case
_NOT_REPRODUCIBLE = ("failed while loading", "is not defined in the submission", "not implemented yet",
                     "submission unreadable", "zeroed:")


def reproduce(result: dict) -> str | None:
    """One command line that grades only the first failed test, with the seed of this run (same cases)."""
    first = next((t for t in result["tests"] if t["status"] in ("failed", "partial")
                  and not any(m in t["output"] for m in _NOT_REPRODUCIBLE)), None)
    if first is None or not result.get("seed") or not result.get("submission"):
        return None
    return (f"python -m autograder grade {result['assignment']} {shlex.quote(result['submission'])} "
            f"--device {result['device']} --seed {result['seed']} --test {shlex.quote(first['name'])}")


def write_json(result: dict, path) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=float)


def to_gradescope(result: dict) -> dict:
    """Gradescope's results.json: tests (name, score, max_score, status, output, visibility), execution_time,
    and a leaderboard of speedups over the reference for the timed (GPU) tests."""
    tests = []
    for t in result["tests"]:
        tests.append({"name": t["name"], "score": t["score"], "max_score": t["max_score"],
                      "status": "passed" if t["status"] == "passed" else "failed",
                      "output": t["output"] if t["status"] != "not run" else t["output"],
                      "visibility": "visible"})
    board = [{"name": t["name"].split(": ")[0] + " speedup", "value": round(t["speedup"], 4), "order": "desc"}
             for t in result["tests"] if t.get("speedup") is not None]
    flags = "\n".join(f"FLAG {f['id']}: {f['message']} -- {f.get('explanation', '')}" for f in result.get("flags", []))
    first = []                      # why nothing or little could be graded comes before the score
    if result.get("submission_error"):
        first.append(f"Your submission could not be read: {result['submission_error']}")
    if result.get("hint"):
        first.append(f"Note: {result['hint']}")
    errors = (result.get("load") or {}).get("errors") or []
    if errors:
        first += ["Cells that failed while loading (the functions they define were not graded):", *errors]
    out = {"score": result["score"], "execution_time": result["execution_time"],
           "output": "".join(f"{x}\n" for x in first)
                     + f"graded on {result['device']}; {result['score']:.4g} / {result['max_score']:.4g}"
                     + (f"\n{flags}" if flags else ""),
           "tests": tests, "stdout_visibility": "visible"}
    if board:
        out["leaderboard"] = board
    return out
