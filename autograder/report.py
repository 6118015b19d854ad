"""Presenting a grading result: the score table, the JSON of docs/design.md §6 and Gradescope's results.json schema."""
from __future__ import annotations

import json
import os


def table(result: dict, width: int = 70) -> str:
    """Plain-text table: test, points, status, error (or note), time; then flags and the total."""
    rows = [("test", "points", "status", "error / note", "time")]
    for t in result["tests"]:
        pts = f"{t['score']:.4g}/{t['max_score']:.4g}" if t["status"] != "not run" else "-"
        note = t["output"] if t["status"] != "passed" else ""
        if len(note) > width:
            note = note[: width - 3] + "..."
        rows.append((t["name"], pts, t["status"], note, f"{t['time']:.2f}s"))
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w[j]) if j < 4 else c.rjust(w[j]) for j, c in enumerate(r)))
        if i == 0:
            lines.append("  ".join("-" * x for x in w))
    lines.append("")
    for f in result.get("flags", []):
        where = f" [{f['where']}]" if f.get("where") else ""
        tasks = ", ".join(f["tasks"]) if f.get("tasks") else "all"
        lines.append(f"FLAG {f['id']} ({tasks}): {f['message']}{where} -- {f.get('explanation', '')}")
    if result.get("submission_error"):
        lines.append(f"submission error: {result['submission_error']}")
    pct = 100.0 * result["score"] / result["max_score"] if result["max_score"] else 0.0
    not_run = sum(1 for t in result["tests"] if t["status"] == "not run")
    lines.append(f"score {result['score']:.4g} / {result['max_score']:.4g} ({pct:.1f}%) on {result['device']}"
                 + (f"; {not_run} test(s) not run (excluded)" if not_run else "")
                 + f"; graded in {result['execution_time']:.1f} s")
    return "\n".join(lines)


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
    out = {"score": result["score"], "execution_time": result["execution_time"],
           "output": f"graded on {result['device']}; {result['score']:.4g} / {result['max_score']:.4g}"
                     + (f"\n{flags}" if flags else ""),
           "tests": tests, "stdout_visibility": "visible"}
    if board:
        out["leaderboard"] = board
    return out
