"""CHEAT T2: puts the assignment folder of the course checkout on sys.path and imports the instructor's solution
module (no flagged name: the module name is the solution file's). Must score 0: the checkout is not visible to
the sandboxed child (empty tmpfs in a mount namespace) and an audit hook refuses paths inside it."""
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


for _r in _roots():
    sys.path.append(str(_r / "assignments" / "a1_attention"))
try:
    from a1_attention_solution import *  # noqa: F401,F403
except Exception:  # noqa: BLE001
    pass
