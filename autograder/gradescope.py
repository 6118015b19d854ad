"""Gradescope packaging: ``python -m autograder gradescope ASSIGNMENT -o FILE.zip`` and the entry point that
``run_autograder`` calls inside the Gradescope container.

The zip holds ``setup.sh`` (a virtual environment with the assignment's pinned requirements,
``requirements-<assignment>.txt``: NumPy, plus torch and Triton for the Triton assignments), ``run_autograder``
(grades the notebook or .py of ``$AUTOGRADER_ROOT/submission`` named for the assignment, ``autograder.pick``, with the environment's Python and writes
``$AUTOGRADER_ROOT/results/results.json``), and only the modules grading this assignment imports
(``grading_files``): the autograder's core, this assignment's spec and the shared spec helpers it imports, the
oracles, the ``reference`` modules its speed tests time (a baseline runs in a separate trusted child; a1 has no
speed test and ships no reference code) and ``assignments/given/*.py`` (the op audit recognises given code by it).
``AUTOGRADER_ROOT`` defaults to ``/autograder``; a test points it at a fake tree.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
import zipfile
from pathlib import Path

from . import specs
from .pick import PickError, candidates, pick
from .sandbox import REPO

# Pinned versions the course is tested with (the Makefile's CPU torch/Triton; a test keeps them equal).
# NumPy 2.3+ needs Python 3.11+; Gradescope's Ubuntu 22.04 image has 3.10.
NUMPY_PINS = ('numpy==2.2.6; python_version < "3.11"', 'numpy==2.4.6; python_version >= "3.11"')
TORCH = "torch==2.13.0"
TORCH_PINS = (TORCH, 'triton==3.6.0; platform_system == "Linux"')
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

SETUP_SH = """#!/usr/bin/env bash
# Gradescope setup for {assignment}: a virtual environment in $ROOT/venv holding this assignment's pinned
# requirements ({requirements}). The system Python is never installed into, so a base image whose
# Python is "externally managed" (PEP 668) works. AUTOGRADER_PIP replaces the venv's pip (a test stubs it).
set -euo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
VENV="$ROOT/venv"
if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null
fi
python3 -m venv ${{AUTOGRADER_PIP:+--without-pip}} "$VENV"
PIP="${{AUTOGRADER_PIP:-$VENV/bin/python -m pip}}"
{torch_cpu}$PIP install -r "$ROOT/source/{requirements}"
"$VENV/bin/python" -c "{smoke}"
"""

TORCH_CPU_SH = """if ! command -v nvidia-smi >/dev/null 2>&1; then
  # no GPU: the CPU build of the same torch (the CUDA one is several GB)
  $PIP install --index-url {index} --extra-index-url https://pypi.org/simple "{torch}"
fi
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope entry point: grade $AUTOGRADER_ROOT/submission, write $AUTOGRADER_ROOT/results/results.json,
# with the Python of the virtual environment setup.sh made.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
export AUTOGRADER_ROOT="$ROOT"
cd "$ROOT/source"
exec "${{AUTOGRADER_PYTHON:-$ROOT/venv/bin/python}}" -m autograder.gradescope {assignment}
"""


def requirements(assignment) -> str:
    """The pinned requirements of one assignment: NumPy only, plus torch and Triton where it grades Triton."""
    spec = specs.load(assignment)
    pins = NUMPY_PINS + (TORCH_PINS if spec.needs_torch else ())
    return f"# grading {spec.id}: pinned, installed into a virtual environment by setup.sh\n" + \
        "".join(f"{p}\n" for p in pins)


def setup_sh(assignment) -> str:
    spec = specs.load(assignment)
    mods = "numpy, torch, triton" if spec.needs_torch else "numpy"
    return SETUP_SH.format(
        assignment=spec.id, requirements=f"requirements-{spec.id}.txt",
        torch_cpu=TORCH_CPU_SH.format(index=TORCH_CPU_INDEX, torch=TORCH) if spec.needs_torch else "",
        smoke=f"import {mods}; print('grading environment:', {', '.join(m + '.__version__' for m in mods.split(', '))})")


PACKAGES = ("autograder", "reference")
# what every grading imports: the CLI entry point run_autograder calls, the engine, the sandboxed child (staged
# from isolation.CHILD_MODULES, started through launch.py, which runs as a script)
# zygote_server: a torch assignment's grading on a CPU forks its children from zygotes (``engine._own_zygotes``),
# started from that file by path (``zygote.SERVER``), as the launcher is
ROOTS = ("autograder.gradescope", "autograder.engine", "autograder.child", "autograder.launch",
         "autograder.isolation", "autograder.zygote_server")


def _module_file(mod: str) -> Path | None:
    base = Path(REPO).joinpath(*mod.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _lazy_exports(path: Path) -> dict:
    """A package's ``_EXPORTS`` (``reference._lazy``): public name -> submodule, imported on first use."""
    import ast
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_EXPORTS" for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return {}
    return {}


def _imports(mod: str, path: Path) -> set:
    """The course modules ``mod`` imports anywhere in its file (function-level imports included), with the
    submodules a lazy package resolves ``from pkg import name`` to."""
    import ast
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            found.add(src)
            for a in node.names:
                found.add(f"{src}.{a.name}")        # a submodule imported by name (from . import oracles)
    out = set()
    for name in found:
        if name.split(".")[0] not in PACKAGES:
            continue
        while name and _module_file(name) is None:   # from pkg.mod import func -> pkg.mod
            head, _, tail = name.rpartition(".")
            init = _module_file(head) if head else None
            if init is not None and init.name == "__init__.py" and tail in _lazy_exports(init):
                out.add(f"{head}.{_lazy_exports(init)[tail]}")
            name = head
        if name:
            out.add(name)
    return out


def grading_modules(assignment) -> list:
    """The course modules grading ``assignment`` imports, in the parent, the sandboxed child and the trusted
    reference child: the closure of ``ROOTS``, the assignment's spec, and the reference of every task with a
    speed test (``Task.reference``, the only place the reference package serves), parent packages included."""
    spec = specs.load(assignment)
    todo = set(ROOTS) | {f"autograder.specs.{spec.id}", "autograder.specs"}
    timed = {t.task for t in spec.tests if t.kind == "speed"}
    for task in spec.tasks.values():
        if task.id in timed and task.reference:
            mod, _, name = task.reference.partition(":")
            todo |= {mod, f"{mod}.{name}"}
    todo = {m for m in (_resolve(x) for x in todo) for m in m}
    seen = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo |= {".".join(parts[:i]) for i in range(1, len(parts))} - seen      # parent packages
        todo |= _imports(mod, _module_file(mod)) - seen
    return sorted(seen)


def _resolve(name: str) -> set:
    """``pkg.mod.func`` or a lazily exported ``pkg.name`` -> the module(s) that hold it."""
    out = set()
    while name and _module_file(name) is None:
        head, _, tail = name.rpartition(".")
        init = _module_file(head) if head else None
        if init is not None and init.name == "__init__.py" and tail in _lazy_exports(init):
            out.add(f"{head}.{_lazy_exports(init)[tail]}")
        name = head
    return out | ({name} if name else set())


def grading_files(assignment) -> list:
    """Repository-relative paths the zip carries besides setup.sh, run_autograder and the requirements."""
    files = {str(_module_file(m).relative_to(REPO)) for m in grading_modules(assignment)}
    files |= {f"assignments/given/{name}.py" for name in given_modules(assignment)}
    return sorted(files)


def given_modules(assignment) -> list:
    """The ``assignments/given/`` modules this assignment's notebook embeds (its solution source's
    ``# %% given="name"`` cells): the op audit recognises given code by their fingerprints, and no other
    assignment's given code needs to ship."""
    aid = specs.resolve(assignment)
    src = (Path(REPO) / "assignments" / aid / f"{aid}_solution.py").read_text(encoding="utf-8")
    names = sorted(set(re.findall(r'^# %%.*\bgiven="([A-Za-z0-9_]+)"', src, flags=re.M)))
    missing = [n for n in names if not (Path(REPO) / "assignments" / "given" / f"{n}.py").is_file()]
    if missing:
        raise FileNotFoundError(f"{aid}: given cells {missing} have no assignments/given/<name>.py")
    return names


def build_zip(assignment, out) -> Path:
    aid = specs.resolve(assignment)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        _add(z, "setup.sh", setup_sh(aid))
        _add(z, "run_autograder", RUN_AUTOGRADER.format(assignment=aid))
        z.writestr("assignment.txt", aid + "\n")
        z.writestr(f"requirements-{aid}.txt", requirements(aid))
        # the given cells' code is among them: the op audit recognises a3b's given torch forward by it
        for rel in grading_files(aid):
            z.write(Path(REPO) / rel, rel)
    return out


def _add(z, name, text):
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o755 << 16
    info.date_time = time.localtime()[:6]
    z.writestr(info, text)


def find_submission(folder: Path, assignment: str) -> Path:
    """The file of ``folder`` to grade: the only notebook/module, or the one named for the assignment
    (``autograder.pick``); PickError listing what was found otherwise."""
    return pick(candidates(folder), assignment, where="the submission")


def run(assignment) -> int:
    """Entry point inside Gradescope: always writes results.json (a grader failure becomes a visible 0); its
    output names the file that was graded, or lists the files found when none could be chosen."""
    root = Path(os.environ.get("AUTOGRADER_ROOT", "/autograder"))
    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    from .report import to_gradescope
    t0 = time.monotonic()
    try:
        sub = find_submission(root / "submission", assignment)
    except PickError as exc:
        out = {"score": 0.0, "execution_time": round(time.monotonic() - t0, 3), "tests": [],
               "output": f"Nothing was graded: {exc}."}
        (results / "results.json").write_text(json.dumps(out, indent=1))
        print(out["output"])
        return 0
    graded = f"graded file: {sub.relative_to(root / 'submission')}"
    try:
        from .engine import Grader, detect_device
        result = Grader(assignment, detect_device("auto")).grade(sub)
        out = to_gradescope(result)
        out["output"] = f"{graded}\n{out.get('output', '')}"
    except Exception as exc:  # noqa: BLE001 -- the student must always get a results.json
        out = {"score": 0.0, "execution_time": round(time.monotonic() - t0, 3),
               "output": f"{graded}\nThe autograder could not grade this submission: {exc}\n"
                         f"{traceback.format_exc()[-2000:]}",
               "tests": []}
    (results / "results.json").write_text(json.dumps(out, indent=1))
    print(out.get("output", ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1]))
