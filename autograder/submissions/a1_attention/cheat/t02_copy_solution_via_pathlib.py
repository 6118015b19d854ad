"""CHEAT T2: copies the instructor's solution source out of the course checkout with pathlib (io.open under the
hood, never the open() builtin the caller-aware trap watches), writes it into its own temp dir under another
name and imports that. Must score 0 (the checkout is hidden; the audit hook refuses the read)."""
import pathlib
import sys

import numpy as np


def _roots():
    """Where the course checkout may be: above numpy, the interpreter, the import path, and the directories
    the grader names on the child's command line."""
    import sys
    import json
    cands = [pathlib.Path(np.__file__), pathlib.Path(sys.executable), *map(pathlib.Path, sys.path)]
    try:
        cands += [pathlib.Path(d) for d in json.loads(sys.argv[1]).get("hide", [])]
    except (IndexError, ValueError, AttributeError):
        pass
    seen = []
    for c in cands:
        for p in [c, *c.parents]:
            if p not in seen and str(p) != "/":
                seen.append(p)
    return seen


_dst = pathlib.Path.cwd() / "helpers_mod.py"
for _r in _roots():
    try:
        _dst.write_text((_r / "assignments" / "a1_attention" / "a1_attention_solution.py").read_text())
        break
    except OSError:
        pass
sys.path.insert(0, str(_dst.parent))
try:
    from helpers_mod import *  # noqa: F401,F403
except Exception:  # noqa: BLE001
    pass
