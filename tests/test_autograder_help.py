"""``python -m autograder --help`` speaks to the user: every command, an example of each, no project history."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("grade", "grade-all", "selftest", "gradescope")


def _help(*args):
    r = subprocess.run([sys.executable, "-m", "autograder", *args, "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _no_history(text):
    assert not re.search(r"\bS[P]EC\b|issue \d|\.\./shared", text), text


def test_top_level_help_lists_commands_with_examples():
    out = _help()
    _no_history(out)
    for cmd in COMMANDS:
        assert re.search(rf"^  {re.escape(cmd)}\s+\S", out, re.M), f"{cmd} not described"
        assert f"python -m autograder {cmd} " in out, f"no example of {cmd}"


@pytest.mark.parametrize("cmd", COMMANDS)
def test_each_command_help_has_an_example_and_described_arguments(cmd):
    out = _help(cmd)
    _no_history(out)
    assert f"python -m autograder {cmd}" in out.split("example")[-1], f"{cmd} --help shows no example"
    options = out.split("options:")[-1]
    # every option line (an indented "-x" or "--xx") carries a help text on its line or the next
    lines = options.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^  (-\S.*?)(\s{2,}(\S.*))?$", line)
        if m and not m.group(3):
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            assert nxt.startswith(" " * 10) and nxt.strip(), f"{cmd}: option {m.group(1)!r} has no help"
