"""The repository speaks of the course, not of how it was built: no development-history labels (issue, item,
session or run numbers, "the pin", "first version", "legacy", who ran what and when) in any tracked file but
``CHANGELOG.md``. Each hit is reported as ``file:line: text``.

Generated files are left out where their source is checked: ``lectures/*.ipynb`` are built from
``lectures/src/*.py`` (executed notebooks can lag their sources until the next build)."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (name, pattern): case-insensitive regular expressions of a development-history label
PATTERNS = (
    ("numbered issue/item/session",
     r"(?<![a-z])(issue|issues #|items?|sessions?)[ _-]?#?[0-9]+\b(?![.,][0-9]|%)"),
    ("numbered run", r"\bruns? ?#?[0-9]{1,2}[a-z]?\b(?![.,/][0-9]| ?/)(?! ?(rounds?|times|steps|iterations|repeats|calls|"
                     r"processes|ranks|workers|threads|tests|cases|seconds|s\b|ms|us|µs|minutes|x\b|%|GPUs?|kernels?|"
                     r"configs?|[GT]?FLOP|[KMGT]i?B\b|programs|splits|tiles|warps|CTAs|blocks|rows|tokens|heads))"),
    ("session's", r"\b(this|that|previous|earlier|next|last|a later|an earlier|first|second|third|fourth|fifth|sixth) "
                  r"session('s)?\b|\bthe session's\b"),
    ("the pin", r"\bthe pin\b|\bpin's\b"),
    ("first version", r"\bfirst version\b"),
    ("legacy", r"legacy"),
    ("this week", r"\bthis week\b"),
    ("the lead", r"\bthe lead\b|\blead's\b|(?<!\w)\(lead[,)]|\blead, session\b|\bmerged main\b"),
    ("helper name", r"\b[Hh]elper `[a-z][a-z0-9]*`|\(helper [a-z][a-z0-9]*[,;)]|\bhelpers'|\bthe helper's\b|"
                    r"\bend of (the )?session\b"),
    ("date of a run", r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b"),
)

#: paths not checked (besides CHANGELOG.md), each with its reason
EXCLUDED = {
    "CHANGELOG.md": "the one place for the project's history",
    "tests/test_no_history_labels.py": "this file names the patterns",
}
EXCLUDED_GLOBS = {
    "lectures/*.ipynb": "built from lectures/src/*.py, which is checked",
    "*.png": "binary",
    "*.csv": "profiler output",
}
#: paths where a date is data, not a label: a results file records when it was measured (``meta.date``)
DATES_ARE_DATA = ("benchmarks/results/*",)

#: allowed (path, substring of the line): legitimate uses the patterns cannot tell apart, each with its reason
ALLOWED = {
    ("tests/test_layout_tests_benchmarks.py", "run3"):
        "the layout test's own examples of a history-named results file it rejects",
    ("benchmarks/results/h100-cascade-splits.json",
     "git show c788965:benchmarks/results/h100-cascade-splits-run3.json"):
        "the path the sweep was first committed under, for `git show`",
}


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split("\0") if p]


def _checked(path: str) -> bool:
    from fnmatch import fnmatch
    return path not in EXCLUDED and not any(fnmatch(path, g) for g in EXCLUDED_GLOBS)


def find_labels(files: dict[str, str]) -> list[str]:
    """``file:line: [pattern] text`` for every line of ``files`` (path -> text) that holds a label."""
    from fnmatch import fnmatch
    compiled = [(name, re.compile(p, re.IGNORECASE)) for name, p in PATTERNS]
    hits = []
    for path, text in files.items():
        dates_ok = any(fnmatch(path, g) for g in DATES_ARE_DATA)
        for i, line in enumerate(text.splitlines(), 1):
            if any(path == p and s in line for p, s in ALLOWED):
                continue
            for name, rx in compiled:
                if dates_ok and name == "date of a run":
                    continue
                if rx.search(line):
                    hits.append(f"{path}:{i}: [{name}] {line.strip()[:160]}")
                    break
    return hits


def _read(path: str) -> str | None:
    try:
        return (ROOT / path).read_text(encoding="utf-8")
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        return None


def test_no_history_labels_outside_the_changelog():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    files = {p: t for p in _tracked() if _checked(p) and (t := _read(p)) is not None}
    assert len(files) > 100
    hits = find_labels(files)
    assert not hits, "development-history labels (say what it is, not when or by whom):\n" + "\n".join(hits)


@pytest.mark.parametrize("line", [
    "the bar of issue 25 (0.9x)", "notes/hopper.md, session 7", "Issue 25 item 4, session 5", "run 3 of the sweep",
    "Run 4b = the committed results", "within the pin's round spread", "keeps the pin", "the first version took",
    "legacy_session7", "lead, 2026-11-26 06:09", "(helper `perf`, H100)", "a later session's run",
    "the session-8 run", "(item 2)", "(helper eagerhost, two H100 calls)", "Later (lead): the loops",
])
def test_each_label_is_found(line):
    hits = find_labels({"notes/x.md": line})
    assert len(hits) == 1 and hits[0].startswith("notes/x.md:1: [")


@pytest.mark.parametrize("line", [
    "run 3 rounds in rotated order", "x.item() for x in xs", "runs 5 times", "a pinned tile", "pin_memory=True",
    "the session of a notebook kernel", "issues a TMA copy", "an SM issues 4 instructions per cycle",
    "runs 1.16-1.66x the speed", "runs 1.22x faster",
    "at B = 64 it runs 34 GFLOP", "the given helper `as_float_source` keeps",
    "(same parity, no helper call)", "stall (issue 32.5%)", "in the same run 116 / 125 us", "runs 16 programs",
    "the run's median", "lead to a spill", "runs 2 GPUs",
])
def test_legitimate_uses_pass(line):
    assert find_labels({"notes/x.md": line}) == []


def test_a_date_is_data_only_in_results_files():
    assert find_labels({"benchmarks/results/h100-x.json": '"date": "2026-11-26 03:47:17"'}) == []
    assert len(find_labels({"notes/x.md": "measured on 2026-11-26"})) == 1
    assert len(find_labels({"benchmarks/results/h100-x.json": '"note": "run 1 of session 8"'})) == 1
