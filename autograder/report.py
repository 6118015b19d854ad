"""Presenting a grading result: the score table, the JSON of docs/design.md §6 and Gradescope's results.json schema.
Scores: required tests out of ``max_score``, optional (bonus) tests apart, ``+ bonus / max_bonus`` (``totals``)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import textwrap


def totals(tests: list) -> dict:
    """``score``/``max_score`` over the required tests, ``bonus``/``max_bonus`` over the optional ones (a test
    dict with ``"optional": true``): bonus points add on top and stay out of the denominator, so every required
    test right is 100% whether or not the bonus was tried. "not run" tests have ``max_score`` 0 already."""
    req = [t for t in tests if not t.get("optional")]
    opt = [t for t in tests if t.get("optional")]
    return {"score": round(sum(t["score"] for t in req), 4), "max_score": round(sum(t["max_score"] for t in req), 4),
            "bonus": round(sum(t["score"] for t in opt), 4), "max_bonus": round(sum(t["max_score"] for t in opt), 4)}


def score_line(result: dict) -> str:
    """``80 / 80 (100.0%) + 7 / 7 bonus``: the required score, its percentage, and the bonus (only where the
    result has bonus tests that ran); a result without the bonus keys (older JSON) shows no bonus."""
    pct = 100.0 * result["score"] / result["max_score"] if result["max_score"] else 0.0
    line = f"{result['score']:.4g} / {result['max_score']:.4g} ({pct:.1f}%)"
    if result.get("max_bonus"):
        line += f" + {result.get('bonus', 0.0):.4g} / {result['max_bonus']:.4g} bonus"
    return line


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
        pts += " bonus" if t.get("optional") else ""
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
    not_run = sum(1 for t in result["tests"] if t["status"] == "not run")
    lines.append(f"score {score_line(result)} on {result['device']}"
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


_BONUS_NOTE = "Bonus test (optional part): its points add on top of the required score. "


def to_gradescope(result: dict) -> dict:
    """Gradescope's results.json: tests (name, score, max_score, status, output, visibility), execution_time,
    and a leaderboard of speedups over the reference for the timed (GPU) tests. Gradescope's ``score`` is the
    required score plus the bonus (it is out of the points set on Gradescope, the required total: the bonus
    adds on top); a bonus test's name ends in ``[bonus]`` and its output says so."""
    tests = []
    for t in result["tests"]:
        bonus = bool(t.get("optional"))
        tests.append({"name": t["name"] + (" [bonus]" if bonus else ""), "score": t["score"],
                      "max_score": t["max_score"], "status": "passed" if t["status"] == "passed" else "failed",
                      "output": (_BONUS_NOTE if bonus else "") + t["output"], "visibility": "visible"})
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
    total = round(result["score"] + result.get("bonus", 0.0), 4)
    extra = (f" (Gradescope score {total:.4g}: the bonus adds on top of the required {result['max_score']:.4g})"
             if result.get("max_bonus") else "")
    out = {"score": total, "execution_time": result["execution_time"],
           "output": "".join(f"{x}\n" for x in first)
                     + f"graded on {result['device']}; {score_line(result)}{extra}"
                     + (f"\n{flags}" if flags else ""),
           "tests": tests, "stdout_visibility": "visible"}
    if board:
        out["leaderboard"] = board
    return out
