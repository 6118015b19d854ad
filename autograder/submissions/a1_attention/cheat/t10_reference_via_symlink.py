"""CHEAT T10: reaches the course's reference package under another name: a symlink made with pathlib in its
own directory, named from string pieces, then a plain import of that name. Must score 0 (the checkout is
hidden; the audit hook refuses a link into it)."""
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


_alias = pathlib.Path.cwd() / ("ref" + "impl")
for _r in _roots():
    if not (_r / ("refer" + "ence") / "__init__.py").exists():
        continue
    try:
        _alias.symlink_to(_r / ("refer" + "ence"), target_is_directory=True)
        break
    except OSError:
        pass
sys.path.insert(0, str(_alias.parent))
try:
    from refimpl.numpy.attention import *  # noqa: F401,F403
    from refimpl.numpy.merge import *  # noqa: F401,F403
    from refimpl.numpy.softmax import *  # noqa: F401,F403
except Exception:  # noqa: BLE001
    pass
