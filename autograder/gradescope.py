"""Gradescope packaging: ``python -m autograder gradescope ASSIGNMENT -o FILE.zip`` and the entry point that
``run_autograder`` calls inside the Gradescope container.

The zip holds ``setup.sh`` (installs requirements), ``run_autograder`` (grades the notebook or .py found in
``$AUTOGRADER_ROOT/submission`` and writes ``$AUTOGRADER_ROOT/results/results.json``), the ``autograder`` and
``reference`` packages (the reference only serves speed baselines, in a separate sandboxed child) and the
requirements. ``AUTOGRADER_ROOT`` defaults to ``/autograder``; a test points it at a fake tree.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
import zipfile
from pathlib import Path

from . import specs
from .sandbox import REPO

SETUP_SH = """#!/usr/bin/env bash
# Gradescope setup: Python 3.10+ with the course requirements (CPU torch unless the image has a GPU).
set -euxo pipefail
apt-get update -qq && apt-get install -y -qq python3 python3-pip python3-venv >/dev/null
cd /autograder/source
python3 -m pip install --upgrade pip
if ! command -v nvidia-smi >/dev/null 2>&1; then
  python3 -m pip install --index-url https://download.pytorch.org/whl/cpu torch
fi
python3 -m pip install -r requirements.txt
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope entry point: grade $AUTOGRADER_ROOT/submission, write $AUTOGRADER_ROOT/results/results.json.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
export AUTOGRADER_ROOT="$ROOT"
cd "$ROOT/source"
exec "${{AUTOGRADER_PYTHON:-python3}}" -m autograder.gradescope {assignment}
"""

PACKAGES = ("autograder", "reference")


def build_zip(assignment, out) -> Path:
    aid = specs.resolve(assignment)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        _add(z, "setup.sh", SETUP_SH)
        _add(z, "run_autograder", RUN_AUTOGRADER.format(assignment=aid))
        z.writestr("assignment.txt", aid + "\n")
        req = Path(REPO) / "requirements.txt"
        z.write(req, "requirements.txt")
        for pkg in PACKAGES:
            for p in sorted((Path(REPO) / pkg).rglob("*")):
                rel = p.relative_to(REPO)
                if p.is_dir() or "__pycache__" in rel.parts or p.suffix in (".pyc",):
                    continue
                if pkg == "autograder" and rel.parts[1:2] == ("submissions",):
                    continue            # the cheat zoo stays home
                z.write(p, str(rel))
    return out


def _add(z, name, text):
    info = zipfile.ZipInfo(name)
    info.external_attr = 0o755 << 16
    info.date_time = time.localtime()[:6]
    z.writestr(info, text)


def find_submission(folder: Path):
    files = sorted(folder.rglob("*.ipynb")) + sorted(folder.rglob("*.py"))
    files = [f for f in files if ".ipynb_checkpoints" not in f.parts]
    return files[0] if files else None


def run(assignment) -> int:
    """Entry point inside Gradescope: always writes results.json (a grader failure becomes a visible 0)."""
    root = Path(os.environ.get("AUTOGRADER_ROOT", "/autograder"))
    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    sub = find_submission(root / "submission")
    from .report import to_gradescope
    t0 = time.monotonic()
    try:
        if sub is None:
            raise FileNotFoundError("no .ipynb or .py file was submitted")
        from .engine import Grader, detect_device
        result = Grader(assignment, detect_device("auto")).grade(sub)
        out = to_gradescope(result)
    except Exception as exc:  # noqa: BLE001 -- the student must always get a results.json
        out = {"score": 0.0, "execution_time": round(time.monotonic() - t0, 3),
               "output": f"The autograder could not grade this submission: {exc}\n{traceback.format_exc()[-2000:]}",
               "tests": []}
    (results / "results.json").write_text(json.dumps(out, indent=1))
    print(out.get("output", ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(run(sys.argv[1]))
