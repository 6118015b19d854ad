"""Presenting a grading result: the score table, the JSON of docs/design.md §6 and Gradescope's results.json schema.
Scores: required tests out of ``max_score``, optional (bonus) tests apart, ``+ bonus / max_bonus`` (``totals``)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
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


MIN_NOTE = 40          # narrower than this beside the row, a note moves to its own line(s) under the row
NOTE_LINES = 3         # lines of a note shown without --verbose (enough for a failing case's shapes)


def table(result: dict, width: int | None = None, verbose: bool = False) -> str:
    """Plain-text report: what stopped the submission from loading (first: it explains the failures below),
    then the table (test, points, status, time, error or note), the flags, the total, and a command that
    re-runs the first failing test with the same inputs.

    Every line fits ``width`` columns (default: the terminal's, ``$COLUMNS``): a test name longer than its
    share wraps inside the name column; a note goes beside the row when at least ``MIN_NOTE`` columns are left
    there, else on the line(s) under the row; a note is wrapped, cut after ``NOTE_LINES`` lines (``verbose``:
    in full, passed tests' notes too); the re-run command is folded into shell continuation lines."""
    cols = max(40, (width or shutil.get_terminal_size((120, 24)).columns) - 1)
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
    rest = w[1] + w[2] + w[3] + 6                       # points, status, time and their separators
    w[0] = max(16, min(w[0], cols - rest))
    indent = w[0] + rest
    room = cols - indent - 2
    inline = room >= MIN_NOTE
    if not inline:
        room = cols - 4
    lines = [ln for h in head for ln in _wrap(h, cols, "      ")] + [""] if head else []
    for i, r in enumerate(rows):
        names = textwrap.wrap(r[0], w[0], subsequent_indent="  ", break_on_hyphens=False) or [""]
        left = "  ".join([names[0].ljust(w[0])] + [c.ljust(w[j]) if j != 3 else c.rjust(w[j])
                                                     for j, c in enumerate(r[1:4], 1)])
        note = r[4] if i else (r[4] if inline else "")
        parts = textwrap.wrap(note, room, break_on_hyphens=False) or [""]
        if not verbose and len(parts) > NOTE_LINES:
            parts = parts[:NOTE_LINES - 1] + [parts[NOTE_LINES - 1][: room - 3] + "..."]
        if inline:
            lines.append(f"{left}  {parts[0]}".rstrip())
            lines += names[1:]
            lines += [" " * (indent + 2) + p for p in parts[1:]]
        else:
            lines.append(left.rstrip())
            lines += names[1:]
            lines += ["    " + p for p in parts if p]
        if i == 0:
            dash = ("  " + "-" * min(room, max(len(r[4]) for r in rows))) if inline else ""
            lines.append("  ".join("-" * x for x in w) + dash)
    lines.append("")
    for f in result.get("flags", []):
        where = f" [{f['where']}]" if f.get("where") else ""
        tasks = ", ".join(f["tasks"]) if f.get("tasks") else "all"
        lines += _wrap(f"FLAG {f['id']} ({tasks}): {f['message']}{where} -- {f.get('explanation', '')}", cols, "    ")
    not_run = sum(1 for t in result["tests"] if t["status"] == "not run")
    lines += _wrap(f"score {score_line(result)} on {result['device']}"
                   + (f"; {not_run} test(s) not run (excluded)" if not_run else "")
                   + f"; graded in {result['execution_time']:.1f} s", cols, "    ")
    repro = reproduce(result)
    if repro:
        lines.append("first failure, again with the same inputs:")
        lines += fold_command(repro, cols)
    return "\n".join(lines)


def _wrap(text, cols, indent):
    return textwrap.wrap(text, cols, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False) \
        or [""]


def fold_command(cmd: str, cols: int, indent: str = "  ") -> list:
    """``cmd`` as shell lines of at most ``cols`` columns, continued with `` \\`` (an argument longer than a
    line stays whole)."""
    words = []
    for a in (shlex.quote(a) for a in shlex.split(cmd)):
        if words and words[-1].startswith("--") and " " not in words[-1] and not a.startswith("-"):
            words[-1] += " " + a                        # an option stays with its value
        else:
            words.append(a)
    lines, cur = [], indent
    for word in words:
        if cur.strip() and len(cur) + 1 + len(word) + 2 > cols:
            lines.append(cur + " \\")
            cur = indent + "    " + word
        else:
            cur = cur + (" " if cur.strip() else "") + word
    lines.append(cur)
    return lines


# failures that re-running one test would only repeat: the fix is in the notebook, not in a case
_NOT_REPRODUCIBLE = ("failed while loading", "is not defined in the submission", "not implemented yet",
                     "submission unreadable", "zeroed:")


def python_command() -> str:
    """The interpreter that runs the grader, as a command: relative (``.venv/bin/python``) when it lies under
    the current folder (the repository), else its absolute path; so the command works without an activated
    virtual environment."""
    exe = sys.executable or "python"
    try:
        rel = os.path.relpath(exe)
    except ValueError:                                  # another drive (Windows)
        rel = exe
    return shlex.quote(rel if not rel.startswith("..") and os.sep in rel else exe)


def reproduce(result: dict) -> str | None:
    """One command line that grades only the first failed test, with the seed of this run (same cases), with
    the interpreter of this run (``python_command``)."""
    first = next((t for t in result["tests"] if t["status"] in ("failed", "partial")
                  and not any(m in t["output"] for m in _NOT_REPRODUCIBLE)), None)
    if first is None or not result.get("seed") or not result.get("submission"):
        return None
    return (f"{python_command()} -m autograder grade {result['assignment']} {shlex.quote(result['submission'])} "
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
