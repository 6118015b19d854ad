"""Python reads `coding[:=]name` in a file's first two comment lines as its encoding (PEP 263).

A lecture or solution title such as "# Decoding: KV cache" on line 2 declares the encoding "KV", and the file
then fails to import. This scans every tracked Python file of the course for such an accidental declaration.
"""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEP263 = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")  # the regex PEP 263 gives


def _tracked_python_files():
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return [ROOT / p for p in out.stdout.split()]
    return [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts]


def test_regex_catches_the_bug_it_guards_against():
    assert PEP263.match("# # Lecture 7 — Decoding: KV cache")
    assert not PEP263.match("# # Lecture 7 — Decoding — the KV cache")


def test_no_accidental_encoding_declaration():
    bad = []
    for path in _tracked_python_files():
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()[:2], 1):
            m = PEP263.match(line)
            if m and m.group(1).lower().replace("_", "-") not in ("utf-8", "utf8"):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "line read as an encoding declaration:\n" + "\n".join(bad)
