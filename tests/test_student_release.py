"""The student release (``make student-release``): lectures, stub notebooks, check() with stored visible cases,
and no implementation of any graded function (no solution, no reference, no bundled correct submission, no
example notebook). check() in the release passes the solutions and reports the stubs as not implemented."""
import ast
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from assignments.release import ASSIGNMENTS, build
from autograder import specs
from autograder.percent import parse_percent

pytestmark = pytest.mark.assignments
REPO = Path(__file__).resolve().parent.parent
GRADED = sorted({t.name for aid in ASSIGNMENTS for t in specs.load(aid).tasks.values()})


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("rel") / "student-release"
    archive = build(out)
    return out, archive


def _implementations(source: str, where: str) -> list:
    """Definitions of graded names that are not stubs: a stub raises NotImplementedError, or only wraps a
    definition of the same source that does."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [f"{where}: {m.group(0)}" for m in re.finditer(r"^(?:def|class)\s+(\w+)", source, re.M)
                if m.group(1) in GRADED]
    def raises(node):
        return any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.unparse(n) for n in ast.walk(node))
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    stubs = {n.name for n in defs if raises(n)}
    found = []
    for node in defs:
        if node.name not in GRADED or node.name in stubs:
            continue
        # a given wrapper around a stub (flash_attention -> FlashAttention.apply) is a stub too
        if not {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & stubs:
            found.append(f"{where}: {node.name}")
    return found


def _scan(folder: Path) -> list:
    found = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.suffix == ".py":
            found += _implementations(p.read_text(), str(rel))
        elif p.suffix == ".ipynb":
            for i, c in enumerate(json.loads(p.read_text())["cells"]):
                if c["cell_type"] != "code":
                    continue
                src = "".join(c["source"])
                found += _implementations("\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!"))),
                                          f"{rel} cell {i}")
                for o in c.get("outputs", []):   # printed source code counts too
                    text = "".join(o.get("text", "")) + "".join((o.get("data") or {}).get("text/plain", ""))
                    found += [f"{rel} cell {i} output: {m.group(0)}" for m in
                              re.finditer(r"(?:def|class)\s+(\w+)", text) if m.group(1) in GRADED]
    return found


def test_release_holds_what_students_need_and_no_graded_implementation(release):
    out, archive = release
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    for aid in ASSIGNMENTS:
        assert f"assignments/{aid}/{aid}.ipynb" in files and f"assignments/{aid}/README.md" in files
    assert {"README.md", "requirements.txt", "pyproject.toml", "autograder/check.py",
            "autograder/visible/index.json"} <= files
    lectures = sorted(p.name for p in (REPO / "lectures").glob("[0-9][0-9]_*.ipynb"))
    assert lectures and all(f"lectures/{n}" in files for n in lectures)
    banned = re.compile(r"(^reference/|_solution\.py$|submissions/|examples/|oracles\.py$|^lectures/src/|"
                        r"^tests/|^benchmarks/|specs/a\d\w*_\w+\.py$|sandbox\.py$|engine\.py$)")
    assert not [f for f in files if banned.search(f)]
    assert _scan(out) == []
    with tarfile.open(archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames()}
    assert names == files


def test_the_scan_finds_implementations():
    """Positive controls: the scan flags a solution, a reference module and a bundled correct submission."""
    sol = REPO / "assignments" / "a1_attention" / "a1_attention_solution.py"
    assert {"safe_softmax", "attention"} <= {x.split(": ")[1] for x in _implementations(sol.read_text(), "s")}
    own = REPO / "autograder" / "submissions" / "a2_flash_numpy" / "correct"
    assert any(_implementations(p.read_text(), p.name) for p in own.glob("*.py"))
    assert _implementations((REPO / "reference" / "numpy" / "softmax.py").read_text(), "ref")
    stub = REPO / "assignments" / "a1_attention" / "a1_attention.ipynb"
    assert _implementations("def safe_softmax(x):\n    return x\n", "x") and \
        not _implementations("def safe_softmax(x):\n    raise NotImplementedError('Implement')\n", "x")
    assert stub.exists()


CHECK = r"""
import json, sys
import autograder, autograder.check as c
assert autograder.__file__.startswith(sys.argv[1]), autograder.__file__     # the release's own package
ns = {}
exec(compile(open(sys.argv[2]).read(), "solution", "exec"), ns)
out = {}
for task, name in json.loads(sys.argv[3]):
    out[task] = c.check(task, ns[name], verbose=False)
def stub(*a, **k):
    raise NotImplementedError("Implement")
out["stub"] = [r[2][2] for r in c.run_visible("a1.attention", stub)]
print(json.dumps(out))
"""


def test_release_check_passes_solutions_and_reports_stubs(release, tmp_path):
    out, _ = release
    cases = {"a1_attention": [["a1.safe_softmax", "safe_softmax"], ["a1.online_softmax", "online_softmax"],
                              ["a1.merge_states", "merge_states"], ["a1.attention", "attention"]],
             "a5_paged": [["a5.BlockAllocator", "BlockAllocator"], ["a5.paged_attention", "paged_attention"]],
             # Triton in the interpreter; stored lse with -inf rows; an autograd call on a given torch forward
             "a3b_triton_backward": [["a3b.flash_bwd_dq", "flash_bwd_dq"], ["a3b.flash_attention", "flash_attention"]]}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(out)
    for aid, tasks in cases.items():
        # the solution without its own check() calls (they would print and re-run the same cases)
        path = REPO / "assignments" / aid / f"{aid}_solution.py"
        cells = parse_percent(path.read_text(), str(path))  # with the given cells filled in
        src = "\n\n".join(c.source for c in cells if c.kind == "code")
        sol = tmp_path / f"{aid}.py"
        sol.write_text("\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("check(", "from autograder"))))
        p = subprocess.run([sys.executable, "-c", CHECK, str(out), str(sol), json.dumps(tasks)], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        res = json.loads(p.stdout.strip().splitlines()[-1])
        assert all(res[t] is True for t, _ in tasks), res
        assert res["stub"] and set(res["stub"]) == {"not implemented yet"}


MAKE_CHECK = r"""
import sys
import pytest
rc = pytest.main(sys.argv[2:])
import autograder
assert autograder.__file__.startswith(sys.argv[1]), autograder.__file__     # the release's own package
print("RC", int(rc))
"""


def test_make_check_in_the_release_fails_stubs_and_passes_the_solution(release, tmp_path):
    """``make check`` (issue 23): the visible cases as pytest tests on the student's own file, one marker per
    function; shipped in the release and run there with ``reference`` unimportable."""
    out, _ = release
    assert (out / "Makefile").read_text().count("autograder/tests_visible") == 1
    noref = tmp_path / "noref" / "reference"
    noref.mkdir(parents=True)
    (noref / "__init__.py").write_text("raise ImportError('reference/ is not part of the student release')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ASSIGNMENT", "SUBMISSION")}
    env["PYTHONPATH"] = str(noref.parent)
    path = REPO / "assignments" / "a1_attention" / "a1_attention_solution.py"
    sol = tmp_path / "a1_solved.py"           # the solution as a student's .py: given cells filled in
    sol.write_text("\n\n".join(("# %% tags=" + json.dumps(c.tags) if c.tags else "# %%") + "\n" + c.source
                               for c in parse_percent(path.read_text(), str(path)) if c.kind == "code") + "\n")

    def run(*args):
        p = subprocess.run([sys.executable, "-c", MAKE_CHECK, str(out), "autograder/tests_visible", "-q",
                            "-p", "no:cacheprovider", "--assignment", "a1", *args], cwd=out, env=env,
                           capture_output=True, text=True, timeout=300)
        assert "RC" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
        return int(p.stdout.rsplit("RC", 1)[1].split()[0]), p.stdout
    rc, text = run("-m", "online_softmax")                 # the untouched stub notebook
    assert rc == 1 and "online_softmax: not implemented yet" in text and "merge_states" not in text, text[-2000:]
    assert re.search(r"(\d+) failed, (\d+) deselected", text)
    rc, text = run("--submission", str(sol))
    assert rc == 0 and re.search(r"\d+ passed", text) and "failed" not in text, text[-2000:]
