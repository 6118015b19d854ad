"""The autograder's command line: grade (exit codes, JSON), grade-all on a folder of 20 mixed submissions
(CSV + one JSON each, a broken one does not stop the rest), and a Gradescope zip run against a fake
/autograder tree (AUTOGRADER_ROOT)."""
import csv
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.autograder
REPO = Path(__file__).resolve().parent.parent
SUB = REPO / "autograder" / "submissions" / "a1_attention"


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=kw.pop("timeout", 600), **kw)


def test_grade_exit_codes_and_json(tmp_path):
    out = tmp_path / "r.json"
    from autograder.selftest import materialise_mutant
    sub = materialise_mutant(SUB / "wrong" / "w_missing_gqa.mutant.json", tmp_path / "mutants")
    p = _run("grade", "a1", str(sub), "--json", str(out), "--device", "cpu")
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert set(r) >= {"assignment", "score", "max_score", "tests", "flags", "device"}
    assert r["assignment"] == "a1_attention" and r["device"] == "cpu" and r["max_score"] == 100
    for t in r["tests"]:
        assert set(t) >= {"name", "score", "max_score", "status", "output"}
    gqa = [t for t in r["tests"] if "GQA" in t["name"]]
    assert gqa and all(t["score"] == 0 for t in gqa) and r["score"] == 100 - sum(t["max_score"] for t in gqa)
    assert "GQA" in p.stdout and "score" in p.stdout                   # the table
    bad = tmp_path / "broken.ipynb"
    bad.write_text("{not json")
    p = _run("grade", "a1", str(bad), "--json", str(out), "--device", "cpu")
    assert p.returncode == 0 and json.loads(out.read_text())["score"] == 0       # a low score is not an error
    assert _run("grade", "a1", str(tmp_path / "missing.py")).returncode != 0     # the grader cannot run: error
    assert _run("grade", "a9", str(bad)).returncode != 0


def test_grade_all_twenty_mixed(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    from autograder.selftest import materialise_mutant

    def real(p):  # a bundled mutant (*.mutant.json) is written out as the .py it describes
        return materialise_mutant(p, tmp_path / "mutants") if p.name.endswith(".mutant.json") else p
    wrong = sorted((SUB / "wrong").glob("*.py")) + sorted((SUB / "wrong").glob("*.mutant.json"))
    cheat = sorted((SUB / "cheat").glob("t0*.py")) + sorted((SUB / "cheat").glob("t0*.mutant.json"))
    picks = [real(p) for p in (wrong + cheat)[:14]]        # 14 + 2 below + 4 broken = 20
    picks += [SUB / "correct" / "own_numpy.py", REPO / "autograder" / "examples" / "a1_attention_example.ipynb"]
    expected = {}
    for i, p in enumerate(picks):
        name = f"student{i:02d}{p.suffix}"
        shutil.copy(p, subs / name)
        expected[f"student{i:02d}"] = p
    (subs / "student90.py").write_text("this is not python (\n")
    (subs / "student91.ipynb").write_text("{}")
    (subs / "student92.py").write_text("")
    (subs / "student93.py").write_text("def attention(q, k, v, causal=False, scale=None, return_lse=False):\n"
                                       "    raise SystemExit(3)\n")
    while len(list(subs.iterdir())) < 20:
        n = len(list(subs.iterdir()))
        shutil.copy(SUB / "correct" / "own_numpy.py", subs / f"student{n + 50}.py")
    assert len(list(subs.iterdir())) == 20
    grades = tmp_path / "grades.csv"
    out = tmp_path / "json"
    # one of the picks never returns: --case-timeout stops its case after 2 s instead of the spec's 10 s
    hangs = [s for s, p in expected.items() if p.name.startswith("w_attention_never_returns")]
    assert hangs
    p = _run("grade-all", "a1_attention", str(subs), "-j", "2", "--csv", str(grades), "--out", str(out),
             "--device", "cpu", "--case-timeout", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = list(csv.DictReader(grades.open()))
    assert len(rows) == 20 and sorted(r["student"] for r in rows) == sorted(f.stem for f in subs.iterdir())
    for r in rows:
        j = json.loads((out / f"{r['student']}.json").read_text())
        assert float(r["score"]) == pytest.approx(j["score"]) and r["status"] in ("ok", "load-error", "unreadable")
        assert r["flags"] == " ".join(sorted({f["id"] for f in j["flags"]}))
    by = {r["student"]: r for r in rows}
    own = [s for s, p in expected.items() if p.name == "own_numpy.py"][0]
    assert float(by[own]["percent"]) == 100.0
    # unparsable, empty notebook, empty module, SystemExit inside the function: 0 points, grader fine
    assert all(float(by[s]["score"]) == 0 for s in ("student90", "student91", "student92", "student93"))
    assert [by[s]["status"] for s in ("student90", "student91", "student92", "student93")] == \
        ["load-error", "unreadable", "ok", "ok"]
    assert by[own]["status"] == "ok"
    j93 = json.loads((out / "student93.json").read_text())
    assert any("SystemExit" in t["output"] for t in j93["tests"])
    assert "submission(s)" in p.stdout
    j = json.loads((out / f"{hangs[0]}.json").read_text())
    assert any("did not return within 2 s" in t["output"] for t in j["tests"]), [t["output"] for t in j["tests"]]


def test_gradescope_zip_runs_against_fake_root(tmp_path):
    z = tmp_path / "ag.zip"
    assert _run("gradescope", "a1_attention", "-o", str(z)).returncode == 0
    root = tmp_path / "autograder"
    with zipfile.ZipFile(z) as f:
        names = f.namelist()
        assert {"setup.sh", "run_autograder", "requirements-a1_attention.txt"} <= set(names)
        assert "autograder/specs/a1_attention.py" in names
        assert not any(n.startswith("reference/") for n in names)     # a1 has no speed test: no reference code
        assert not any("submissions/" in n for n in names)
        f.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    os.chmod(root / "run_autograder", 0o755)
    (root / "submission").mkdir()
    shutil.copy(REPO / "autograder" / "examples" / "a1_attention_example.ipynb", root / "submission" / "hw.ipynb")
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable)
    p = subprocess.run([str(root / "run_autograder")], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads((root / "results" / "results.json").read_text())
    assert set(res) >= {"score", "execution_time", "tests"}
    assert 0 < res["score"] < 100
    for t in res["tests"]:
        assert set(t) >= {"name", "score", "max_score", "status", "output", "visibility"}
        assert t["status"] in ("passed", "failed")
    assert sum(t["score"] for t in res["tests"]) == pytest.approx(res["score"])
