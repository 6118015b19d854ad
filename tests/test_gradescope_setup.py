"""The Gradescope zip's setup: a virtual environment (never the system Python, PEP 668), per-assignment pinned
requirements, and a run in a clean container-like folder: a scrubbed environment, a bare python3 (the
system's, or for the stubbed grade the running interpreter's base, whose packages the stub lends the venv),
the zip extracted to AUTOGRADER_ROOT/source. pip is stubbed (it records its arguments and points the venv at the
course's installed packages) so the test is fast and offline; one real install of a NumPy-only assignment
runs when the package index answers."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from autograder import specs
from autograder.gradescope import NUMPY_PINS, TORCH_PINS, build_zip, requirements, setup_sh

pytestmark = pytest.mark.autograder
REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "autograder" / "examples" / "a1_attention_example.ipynb"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
STUB_PIP = """#!/usr/bin/env bash
# records its arguments; "install -r FILE" makes the course's installed packages visible to the venv instead
echo "$*" >> "$AUTOGRADER_ROOT/pip.log"
if [ "$1" = install ] && [ "$2" = -r ]; then
  site=$("$AUTOGRADER_ROOT/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "{packages}" > "$site/course_packages.pth"
fi
"""


# The stubbed install points the venv at this interpreter's packages, so the venv must be made by a python3 of
# the same version: the base interpreter of the running one, first on PATH (else the system's).
_BASE = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable))).parent
SAME_PYTHON_PATH = f"{_BASE}:{SYSTEM_PATH}" if (_BASE / "python3").exists() else SYSTEM_PATH


def _has_venv(path):
    try:
        return subprocess.run(["env", "-i", f"PATH={path}", "python3", "-c", "import venv, ensurepip"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_venv = pytest.mark.skipif(not _has_venv(SYSTEM_PATH), reason="no system python3 with venv/ensurepip")


def _container(tmp_path, aid):
    """AUTOGRADER_ROOT with the zip in source/, run_autograder at the top, like Gradescope's image."""
    root = tmp_path / "autograder"
    z = build_zip(aid, tmp_path / f"{aid}.zip")
    with zipfile.ZipFile(z) as f:
        f.extractall(root / "source")
    for name in ("setup.sh", "run_autograder"):
        os.chmod(root / "source" / name, 0o755)
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    (tmp_path / "home").mkdir()
    env = {"PATH": SYSTEM_PATH, "HOME": str(tmp_path / "home"), "AUTOGRADER_ROOT": str(root), "LANG": "C.UTF-8"}
    for k in ("PIP_FIND_LINKS", "PIP_CERT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "HTTPS_PROXY", "https_proxy",
              "PIP_DEFAULT_TIMEOUT"):
        if k in os.environ:
            env[k] = os.environ[k]
    return root, env


def _stub_pip(tmp_path, env):
    stub = tmp_path / "pip"
    stub.write_text(STUB_PIP.format(packages=sysconfig.get_paths()["purelib"]))
    stub.chmod(0o755)
    return dict(env, AUTOGRADER_PIP=str(stub))


def _grade_example(root, env):
    (root / "submission").mkdir()
    shutil.copy(EXAMPLE, root / "submission" / "hw.ipynb")
    p = subprocess.run([str(root / "run_autograder")], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads((root / "results" / "results.json").read_text())


def test_requirements_are_per_assignment_and_pinned():
    make = (REPO / "Makefile").read_text()
    for pin in TORCH_PINS:            # the same torch/Triton as `make setup` on a CPU machine
        assert pin.split(";")[0] in make, pin
    for aid in specs.ASSIGNMENTS:
        lines = [x for x in requirements(aid).splitlines() if x and not x.startswith("#")]
        assert lines and all(re.match(r"^[a-z]+==[\d.]+(;.*)?$", x) for x in lines), lines
        torch = any(x.startswith(("torch", "triton")) for x in lines)
        assert torch == specs.load(aid).needs_torch, (aid, lines)
        sh = setup_sh(aid)
        assert "set -euo pipefail" in sh and "-m venv" in sh and f"requirements-{aid}.txt" in sh
        assert "python3 -m pip" not in sh and "pip3 " not in sh            # never the system Python's pip
        assert ("download.pytorch.org/whl/cpu" in sh) == torch
        p = subprocess.run(["bash", "-n"], input=sh, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    # exactly one NumPy pin applies to any Python
    assert len(NUMPY_PINS) == 2 and "< \"3.11\"" in NUMPY_PINS[0] and ">= \"3.11\"" in NUMPY_PINS[1]
    with zipfile.ZipFile(build_zip("a2", REPO / "build" / "test_gs_a2.zip")) as f:
        names = set(f.namelist())
    assert "requirements-a2_flash_numpy.txt" in names and "requirements.txt" not in names


@pytest.mark.skipif(not _has_venv(SAME_PYTHON_PATH), reason="no python3 with venv/ensurepip")
def test_setup_in_a_clean_folder_with_stubbed_pip_then_grade(tmp_path):
    root, env = _container(tmp_path, "a1_attention")
    env = _stub_pip(tmp_path, dict(env, PATH=SAME_PYTHON_PATH))
    p = subprocess.run([str(root / "source" / "setup.sh")], env=env, capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (root / "venv" / "bin" / "python").exists() and "grading environment:" in p.stdout
    calls = (root / "pip.log").read_text().splitlines()
    assert calls == [f"install -r {root}/source/requirements-a1_attention.txt"]      # NumPy only, no torch
    res = _grade_example(root, env)                              # run_autograder uses the venv's Python
    assert 0 < res["score"] < 100 and res["tests"]


@needs_venv
def test_setup_of_a_triton_assignment_installs_cpu_torch_without_a_gpu(tmp_path):
    root, env = _container(tmp_path, "a3_triton")
    env = _stub_pip(tmp_path, env)
    if shutil.which("nvidia-smi", path=SYSTEM_PATH):
        pytest.skip("this machine has a GPU: setup installs the default (CUDA) torch")
    p = subprocess.run([str(root / "source" / "setup.sh")], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    calls = (root / "pip.log").read_text().splitlines()
    assert len(calls) == 2 and "download.pytorch.org/whl/cpu" in calls[0] and "torch==2.13.0" in calls[0]
    assert calls[1] == f"install -r {root}/source/requirements-a3_triton.txt"


def _index_reachable():
    if os.environ.get("PIP_FIND_LINKS") or os.environ.get("PIP_INDEX_URL"):
        return True
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
@needs_venv
@pytest.mark.skipif(not _index_reachable(), reason="no package index reachable")
def test_real_setup_of_a_numpy_assignment(tmp_path):
    """setup.sh with the real pip (NumPy only: one wheel), then a grade with the environment it made."""
    root, env = _container(tmp_path, "a1_attention")
    p = subprocess.run([str(root / "source" / "setup.sh")], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    py = root / "venv" / "bin" / "python"
    listed = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            env=env, timeout=120)
    got = {d["name"].lower(): d["version"] for d in json.loads(listed.stdout)}
    new_python = subprocess.run([str(py), "-c", "import sys; print(sys.version_info >= (3, 11))"],
                                capture_output=True, text=True).stdout.strip() == "True"
    assert "torch" not in got and got["numpy"] == NUMPY_PINS[new_python].split("==")[1].split(";")[0]
    res = _grade_example(root, env)
    assert 0 < res["score"] < 100


UNZIPPED_GRADE = r"""
import sys
# the course's editable install must not fill in a module the zip lacks: only the unzipped tree counts
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")
                    and "editable" not in getattr(type(f), "__module__", "")]
root = sys.argv[1]
import autograder
assert autograder.__file__.startswith(root), autograder.__file__
from autograder.gradescope import run
run(sys.argv[2])
from autograder import specs
from autograder.engine import _reference_source
spec = specs.load(sys.argv[2])
timed = {t.task for t in spec.tests if t.kind == "speed"}
for task in spec.tasks.values():          # what the trusted reference child imports for a speed test
    if task.id in timed:
        exec(_reference_source(task)[1], {})
outside = [n for n, m in list(sys.modules.items()) if n.split(".")[0] in ("autograder", "reference")
           and not (getattr(m, "__file__", None) or root).startswith(root)]
assert not outside, outside
print("reference modules:", sorted(n for n in sys.modules if n.split(".")[0] == "reference"))
"""


@pytest.mark.parametrize("aid,most", [("a1_attention", 47), ("a3_triton", 60)])   # its own given modules only
def test_zip_carries_only_what_grading_imports_and_grades_the_solution(tmp_path, aid, most):
    """The zip holds the modules grading imports (no other assignment's spec, no reference code beyond the speed
    baselines, no cheat zoo or examples); unzipped alone, with nothing of the course on the import path, it
    grades the solution at 100% (a3 on a CPU: 80 / 80 plus the interpreter-run FP8 bonus)."""
    z = build_zip(aid, tmp_path / f"{aid}.zip")
    with zipfile.ZipFile(z) as f:
        names = set(f.namelist())
        f.extractall(tmp_path / "root" / "source")
    assert len(names) <= most, sorted(names)
    other = [n for n in names if re.match(r"autograder/specs/a\d", n) and aid not in n]
    assert not other and not [n for n in names if "submissions/" in n or "examples/" in n]
    spec = specs.load(aid)
    refs = {n for n in names if n.startswith("reference/")}
    if aid == "a1_attention":
        assert not refs                       # no speed test: the NumPy assignment ships no reference code
    else:
        assert "reference/triton/flash_fwd.py" in refs and "reference/triton/paged.py" not in refs
    from autograder.gradescope import given_modules
    assert {f"assignments/given/{n}.py" for n in given_modules(aid)} <= names
    root = tmp_path / "root"
    (root / "submission").mkdir()
    shutil.copy(REPO / "assignments" / aid / f"{aid}_solution.py", root / "submission" / "sub.py")
    env = {"PATH": SYSTEM_PATH, "HOME": str(tmp_path), "AUTOGRADER_ROOT": str(root), "LANG": "C.UTF-8",
           "PYTHONPATH": str(root / "source")}
    p = subprocess.run([sys.executable, "-c", UNZIPPED_GRADE, str(root / "source"), aid], cwd=root / "source",
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((root / "results" / "results.json").read_text())
    required = sum(t["max_score"] for t in res["tests"] if not t["name"].endswith("[bonus]"))
    assert required == 100 or (aid == "a3_triton" and required == 80)   # a3 on a CPU: GPU speed tests not run
    assert [t for t in res["tests"] if t["score"] != t["max_score"]] == []
    assert res["score"] == sum(t["max_score"] for t in res["tests"])  # 100% (+ the bonus on top)
    assert spec.needs_torch == ("reference.triton" in p.stdout)


def test_zip_carries_only_its_own_given_modules():
    """An assignment's zip carries the given modules its notebook embeds, not every assignment's
    (a1 needs no Triton set-up cell, a3 no split-KV merge kernel); each embedded one is there."""
    from autograder.gradescope import grading_files, given_modules
    for aid in ("a1_attention", "a3_triton", "a4_decoding"):
        given = {f for f in grading_files(aid) if f.startswith("assignments/given/")}
        assert given == {f"assignments/given/{n}.py" for n in given_modules(aid)}, aid
    assert "assignments/given/merge_splits.py" not in grading_files("a3_triton")
    assert "assignments/given/triton_setup.py" not in grading_files("a1_attention")
    assert "assignments/given/merge_splits.py" in grading_files("a4_decoding")
