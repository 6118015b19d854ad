"""Which file of a student's upload is the submission: used by the Gradescope runner (the files of
``/autograder/submission``) and by ``grade-all`` (one subfolder per student, as an LMS download has them).

Candidates are the ``.ipynb`` and ``.py`` files, except Jupyter's checkpoints and hidden or ``_``-prefixed
files. One candidate is the submission, whatever its name. Among several, the ones named for the assignment
count (``a3_triton.ipynb``, ``a3.ipynb``, ``alice-a3.py``: the full id, or the short id as a word of the file
name: ``a3`` is not ``a3b``); among those, a notebook wins over a ``.py``. Anything else (no candidate, several
and none named for the assignment, two notebooks named for it) is refused with the list of what was found: a
stray ``Untitled.ipynb`` beside ``a3_triton.ipynb`` is never graded instead of it.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import specs

SUFFIXES = (".ipynb", ".py")


class PickError(ValueError):
    """No single submission file could be chosen; the message lists what was found."""


def candidates(folder) -> list[Path]:
    """Submission-like files under ``folder`` (recursively), sorted."""
    folder = Path(folder)
    found = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).parts
        if not p.is_file() or p.suffix not in SUFFIXES:
            continue
        if any(part.startswith((".", "_")) or part == ".ipynb_checkpoints" for part in rel):
            continue
        found.append(p)
    return found


def named_for(path: Path, aid: str) -> bool:
    """Whether the file name names assignment ``aid``: its full id, or its short id as a word of the stem."""
    aid = specs.resolve(aid)
    stem = path.stem.lower()
    short = aid.split("_")[0]
    return aid in stem or re.search(rf"(?<![a-z0-9]){re.escape(short)}(?![a-z0-9])", stem) is not None


def pick(files, aid: str, where: str = "the submission") -> Path:
    """The submission among ``files`` for assignment ``aid`` (rules in the module docstring); PickError else."""
    files = [Path(f) for f in files]
    aid = specs.resolve(aid)
    listing = ", ".join(f.name for f in files) or "nothing"
    if not files:
        raise PickError(f"no .ipynb or .py file in {where} (found: nothing)")
    if len(files) == 1:
        return files[0]
    named = [f for f in files if named_for(f, aid)]
    notebooks = [f for f in named if f.suffix == ".ipynb"]
    if len(named) == 1:
        return named[0]
    if len(notebooks) == 1:
        return notebooks[0]
    short = aid.split("_")[0]
    if not named:
        raise PickError(f"{len(files)} files in {where} and none is named for {aid} (found: {listing}); "
                        f"submit one file, or name it {aid}.ipynb (or with {short} in its name)")
    raise PickError(f"{len(named)} files in {where} are named for {aid} (found: {listing}); submit only one")
