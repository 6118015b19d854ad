"""The repository layout rules for tests, benchmarks and results (docs/design.md §2):

* a test file imports no other test file and no benchmark (shared test code lives in ``tests/common.py``,
  ``tests/common_numpy.py``, ``tests/oracle.py``; benchmarks are run, not imported);
* no benchmark edits ``sys.path`` (they are a package, run as ``python -m benchmarks.<job>.<script>``);
* no benchmark script (a module with a ``main``) imports another script: what several share lives in
  ``benchmarks/_common.py`` or a small module of its own (``benchmarks/_serving_cases.py``, ...);
* every benchmark module imports without a GPU (so a broken import fails CI, not a device call);
* every file in ``benchmarks/results/`` is named ``<gpu>-<benchmark>[-<part>].<json|png|csv>``, with no history
  suffix (earlier runs live in git);
* every path the layout map of ``docs/design.md`` names exists.

Each checker is a function tested on made-up good and bad inputs first, so a checker that accepts everything
fails here too.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DESIGN = ROOT / "docs" / "design.md"

#: what a results file is called: <gpu>-<benchmark>[-<part>...].<ext>, lower case, words joined by "-"
RESULT_NAME = re.compile(r"^(?P<gpu>[a-z][a-z0-9]*)-(?P<bench>[a-z0-9]+(?:-[a-z0-9]+)*)\.(?:json|png|csv)$")
#: name parts that mean "another run of the same benchmark": that history belongs in git, not in the folder
HISTORY_WORDS = {"first", "second", "rerun", "final", "attempts", "attempt", "before", "after", "old", "new",
                 "tmp", "bak", "copy", "v1", "v2", "v3", "latest", "quick"}
#: numbered runs and tries (``-run3``, ``-attempt2``, ``-try1``, ``-take2``): also history, whatever the number
HISTORY_NUMBERED = re.compile(r"^(?:run|attempt|try|take|rev)\d+$")
#: folders of raw logs kept as they are (GPU validation runs; notes/gpu_validation.md cites them by name)
RESULT_FOLDERS = re.compile(r"^gpu_validate(_[a-z0-9]+)*$")


def result_name_problem(name: str) -> str | None:
    """Why ``name`` breaks the results naming rule, or None when it follows it."""
    m = RESULT_NAME.match(name)
    if not m:
        return f"{name}: not <gpu>-<benchmark>.<json|png|csv> (lower case, '-' between words)"
    history = {w for w in m["bench"].split("-") if w in HISTORY_WORDS or HISTORY_NUMBERED.match(w)}
    if history:
        return f"{name}: '{sorted(history)[0]}' marks another run of the same benchmark; keep one file, history in git"
    return None


def forbidden_imports(source: str) -> list[str]:
    """Modules ``source`` (a test file) imports that a test may not: another test module or ``benchmarks``."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative: "from .test_x import y", "from . import test_x"
                names = [mod] if mod else [a.name for a in node.names]
            else:
                names = [mod] + ([f"{mod}.{a.name}" for a in node.names] if mod == "tests" else [])
        else:
            continue
        for name in names:
            last = name.split(".")[-1]
            if name == "benchmarks" or name.startswith("benchmarks.") or last.startswith("test_"):
                bad.append(name)
    return bad


def touches_sys_path(source: str) -> bool:
    """Whether ``source`` reads or writes ``sys.path`` (``sys.path.insert``, ``sys.path[:0] = ...``, ...)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            return True
    return False


def is_script(source: str) -> bool:
    """Whether ``source`` is a benchmark script: it defines ``main`` or runs under ``if __name__ == "__main__"``."""
    tree = ast.parse(source)
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body) or any(
        isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def imported_modules(source: str, package: str = "benchmarks") -> set[str]:
    """The ``package`` modules ``source`` imports, anywhere in it (``from benchmarks.course import bench_x`` names
    ``benchmarks.course.bench_x``; a name that is not a module is dropped by the caller)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == package:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def scripts_importing_scripts(sources: dict[str, str]) -> list[str]:
    """``a imports b`` for each script ``a`` of ``sources`` (module name -> source) importing another script ``b``."""
    scripts = {m for m, src in sources.items() if is_script(src)}
    return sorted(f"{m} imports {w}" for m in sorted(scripts) for w in imported_modules(sources[m])
                  if w in scripts and w != m)


def layout_map_paths(text: str) -> list[str]:
    """The repository paths named in the layout map of docs/design.md: the first word of every line of the
    fenced block between ``<!-- layout map -->`` and ``<!-- /layout map -->`` that is a path (a dotted file
    name or a folder ending in ``/``), each joined to the folders it is indented under."""
    m = re.search(r"<!-- layout map -->\s*```\w*\n(.*?)```\s*<!-- /layout map -->", text, re.S)
    if not m:
        raise AssertionError("docs/design.md has no block between <!-- layout map --> and <!-- /layout map -->")
    paths, stack = [], []  # stack: (indent, folder)
    for line in m[1].splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        word = line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not (word.endswith("/") or re.search(r"\.\w+$", word)):
            continue
        full = "".join(folder for _, folder in stack) + word
        paths.append(full)
        if word.endswith("/"):
            stack.append((indent, word))
    return paths


# ---- the checkers on made-up inputs -----------------------------------------------------------------------------
@pytest.mark.parametrize("name, ok", [
    ("h100-gluon.json", True), ("h200-decode-speedup.png", True), ("cpu-numpy.json", True),
    ("h100-bwd-ncu.csv", True), ("h100-ring-w2.json", True),
    ("h200.json", False), ("h100-gluon-train-first.json", False), ("h200-gluon-final.json", False),
    ("h200-hopper-rerun.json", False), ("speed_calibration_h100.json", False), ("grader_cpu.json", False),
    ("H100-gluon.json", False), ("h100-gluon.txt", False), ("h100--gluon.json", False),
    ("h100-cascade-splits-run3.json", False), ("h100-decode-attempts.json", False), ("h100-ring-attempt2.json", False),
    ("h100-decode-try1.png", False), ("h100-runtime.json", True), ("h100-ring-w2-run.json", True)])
def test_result_name_rule_on_made_up_names(name, ok):
    assert (result_name_problem(name) is None) == ok, result_name_problem(name)


@pytest.mark.parametrize("source, bad", [
    ("from tests.test_triton_gluon_bwd import _inputs", ["tests.test_triton_gluon_bwd"]),
    ("from .test_x import y", ["test_x"]), ("from . import test_x", ["test_x"]),
    ("from tests import test_x", ["tests.test_x"]), ("import tests.test_x", ["tests.test_x"]),
    ("from benchmarks.course.bench_gluon import VARIANTS", ["benchmarks.course.bench_gluon"]),
    ("import benchmarks", ["benchmarks"]), ("def f():\n    from benchmarks import _common", ["benchmarks"]),
    ("from tests.common import x\nfrom tests.oracle import y\nfrom .ring_ranks import z\nimport numpy", []),
    ("from reference.triton import flash_fwd", [])])
def test_import_rule_on_made_up_sources(source, bad):
    assert forbidden_imports(source) == bad


@pytest.mark.parametrize("source, touches", [
    ("import sys\nsys.path.insert(0, '..')", True), ("import sys\nsys.path[:0] = ['x']", True),
    ("from sys import path", True), ("import sys\nsys.exit(main())", False), ("import os\nos.path.join('a')", False)])
def test_sys_path_rule_on_made_up_sources(source, touches):
    assert touches_sys_path(source) == touches


def test_script_import_rule_on_made_up_sources():
    sources = {"benchmarks.course.a": "def main():\n    from benchmarks.course.b import bench\n",
               "benchmarks.course.b": "def bench(f):\n    pass\nif __name__ == '__main__':\n    bench(None)\n",
               "benchmarks.tuning.c": "from benchmarks.course import b\nfrom benchmarks._common import rel_err\n"
                                      "def main():\n    pass\n",
               "benchmarks.course.d": "from benchmarks.course.a import main as run\n",
               "benchmarks._common": "def rel_err(a, b):\n    pass\n"}
    assert scripts_importing_scripts(sources) == ["benchmarks.course.a imports benchmarks.course.b",
                                                  "benchmarks.tuning.c imports benchmarks.course.b"]


def test_layout_map_parser_on_a_made_up_map():
    text = ("x\n<!-- layout map -->\n```\nREADME.md   why\nbenchmarks/   what\n  course/   quoted\n"
            "    bench_a.py   one\n  _common.py   shared\nnotes/   log\n```\n<!-- /layout map -->\n")
    assert layout_map_paths(text) == ["README.md", "benchmarks/", "benchmarks/course/",
                                      "benchmarks/course/bench_a.py", "benchmarks/_common.py", "notes/"]


# ---- the rules on the repository --------------------------------------------------------------------------------
def test_no_test_imports_another_test_or_a_benchmark():
    bad = {p.name: b for p in sorted((ROOT / "tests").glob("*.py")) if (b := forbidden_imports(p.read_text()))}
    assert not bad, f"test files importing test modules or benchmarks: {bad}"


def test_no_benchmark_touches_sys_path():
    bad = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "benchmarks").rglob("*.py"))
           if touches_sys_path(p.read_text())]
    assert not bad, f"benchmarks editing sys.path (run them as python -m benchmarks.<job>.<script>): {bad}"


def test_no_benchmark_script_imports_another_script():
    sources = {".".join(p.relative_to(ROOT).with_suffix("").parts): p.read_text()
               for p in sorted((ROOT / "benchmarks").rglob("*.py")) if p.name != "__init__.py"}
    bad = scripts_importing_scripts(sources)
    assert not bad, f"benchmark scripts importing other scripts (move the shared piece to a module): {bad}"


def test_results_files_follow_the_naming_rule():
    problems = []
    for p in sorted(RESULTS.iterdir()):
        if p.is_dir():
            if not RESULT_FOLDERS.match(p.name):
                problems.append(f"{p.name}/: only gpu_validate* log folders live in benchmarks/results/")
        elif (why := result_name_problem(p.name)):
            problems.append(why)
    assert not problems, "\n".join(problems)


def _benchmark_modules() -> list[str]:
    mods = []
    for p in sorted((ROOT / "benchmarks").rglob("*.py")):
        rel = p.relative_to(ROOT).with_suffix("")
        if rel.name != "__init__":
            mods.append(".".join(rel.parts))
    return mods


def test_every_benchmark_module_imports_without_a_gpu():
    """One child process (no CUDA visible) imports every benchmark module and reports each failure."""
    mods = _benchmark_modules()
    assert "benchmarks.course.bench_serving" in mods and "benchmarks._common" in mods and len(mods) >= 15
    code = ("import importlib, json, sys, traceback\nbad = {}\nfor m in json.loads(sys.argv[1]):\n"
            "    try:\n        importlib.import_module(m)\n"
            "    except BaseException:\n        bad[m] = traceback.format_exc()[-600:]\nprint(json.dumps(bad))\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code, json.dumps(mods)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    bad = json.loads(r.stdout.strip().splitlines()[-1])
    assert not bad, "\n".join(f"{m}:\n{tb}" for m, tb in bad.items())


def test_every_path_in_the_design_layout_map_exists():
    paths = layout_map_paths(DESIGN.read_text())
    assert len(paths) >= 20, paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/design.md's layout map names paths that do not exist: {missing}"


def test_iosim_shim_is_the_simulator_module():
    """SPEC.md names ``reference.iosim``; the module lives in ``reference.simulators.iosim``: one object."""
    import reference.iosim as shim
    from reference.simulators import iosim
    assert shim is iosim and shim.standard_attention_io is iosim.standard_attention_io
