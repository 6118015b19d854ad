"""Instructor tooling around many submissions: which file of an upload is graded (autograder/pick.py, used by
the Gradescope runner and by grade-all's one-subfolder-per-student layout), grade-all's exit status when it
finds nothing, its per-student text reports and score histogram, and how it spreads gradings over GPUs."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autograder import grade_all
from autograder.grade_all import GpuSlots, choose_gpus, collect, visible_gpus
from autograder.histogram import counts
from autograder.pick import PickError, named_for, pick

REPO = Path(__file__).resolve().parents[1]
OWN = REPO / "autograder" / "submissions" / "a1_attention" / "correct" / "own_numpy.py"
EXAMPLE = REPO / "autograder" / "examples" / "a1_attention_example.ipynb"


def _grader(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "autograder", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=600)


def test_pick_prefers_the_file_named_for_the_assignment():
    P = Path
    assert pick([P("Untitled.ipynb"), P("a3_triton.ipynb")], "a3") == P("a3_triton.ipynb")
    assert pick([P("Untitled.ipynb")], "a3") == P("Untitled.ipynb")              # the only file is the one
    assert pick([P("alice-a3.py"), P("scratch.py")], "a3_triton") == P("alice-a3.py")
    assert pick([P("a3.py"), P("a3.ipynb")], "a3") == P("a3.ipynb")             # a notebook over a module
    assert not named_for(P("a3b_triton_backward.ipynb"), "a3")                # a3 is not a3b
    assert named_for(P("A3B.ipynb"), "a3b") and named_for(P("my_a4_decoding_v2.ipynb"), "a4")
    with pytest.raises(PickError, match=r"none is named for a3_triton \(found: Untitled.ipynb, notes.py\)"):
        pick([P("Untitled.ipynb"), P("notes.py")], "a3")
    with pytest.raises(PickError, match="2 files .* are named for a3_triton"):
        pick([P("a3.ipynb"), P("a3_triton.ipynb")], "a3")
    with pytest.raises(PickError, match="no .ipynb or .py file"):
        pick([], "a1")


def test_gradescope_grades_the_named_file_and_says_which(tmp_path, monkeypatch):
    from autograder.gradescope import run
    root = tmp_path / "ag"
    (root / "submission" / ".ipynb_checkpoints").mkdir(parents=True)
    shutil.copy(EXAMPLE, root / "submission" / "a1_attention.ipynb")
    (root / "submission" / "Untitled.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, '
                                                        '"nbformat_minor": 5}')
    shutil.copy(EXAMPLE, root / "submission" / ".ipynb_checkpoints" / "x-checkpoint.ipynb")
    monkeypatch.setenv("AUTOGRADER_ROOT", str(root))
    run("a1_attention")
    out = json.loads((root / "results" / "results.json").read_text())
    assert out["output"].startswith("graded file: a1_attention.ipynb\n") and out["score"] > 0
    # two files, neither named for the assignment: nothing graded, and the output lists what was found
    (root / "submission" / "a1_attention.ipynb").rename(root / "submission" / "mine.ipynb")
    run("a1_attention")
    out = json.loads((root / "results" / "results.json").read_text())
    assert out["score"] == 0 and not out["tests"]
    assert "Nothing was graded" in out["output"] and "Untitled.ipynb, mine.ipynb" in out["output"]


def test_collect_reads_one_subfolder_per_student(tmp_path):
    (tmp_path / "alice_123_assignsubmission_file_").mkdir()
    shutil.copy(OWN, tmp_path / "alice_123_assignsubmission_file_" / "a1_attention.py")
    (tmp_path / "alice_123_assignsubmission_file_" / "Untitled.ipynb").write_text("{}")
    (tmp_path / "bob").mkdir()
    (tmp_path / "bob" / "nested").mkdir()
    shutil.copy(OWN, tmp_path / "bob" / "nested" / "whatever.py")
    (tmp_path / "carol").mkdir()
    (tmp_path / "carol" / "x.py").write_text("")
    (tmp_path / "carol" / "y.py").write_text("")
    (tmp_path / "empty").mkdir()
    shutil.copy(OWN, tmp_path / "dave.py")
    paths, names, problems = collect(tmp_path, "a1")
    assert sorted(names.values()) == ["alice_123_assignsubmission_file_", "bob", "dave"]
    assert {names[p]: p.name for p in paths}["alice_123_assignsubmission_file_"] == "a1_attention.py"
    assert set(problems) == {"carol", "empty"} and "x.py, y.py" in problems["carol"]


def test_grade_all_on_an_lms_download_writes_reports_and_a_histogram(tmp_path):
    subs = tmp_path / "download"
    for name in ("alice", "bob"):
        (subs / name).mkdir(parents=True)
        shutil.copy(OWN, subs / name / "a1_attention.py")
    (subs / "alice" / "Untitled.ipynb").write_text("{}")                # a stray notebook is not graded
    (subs / "carol").mkdir()
    (subs / "carol" / "a.py").write_text("")
    (subs / "carol" / "b.py").write_text("")
    (subs / "bob" / "a1_attention.py").write_text((subs / "bob" / "a1_attention.py").read_text().replace(
        "def attention(", "def _unused(", 1))                          # bob loses the attention tests
    out, grades = tmp_path / "out", tmp_path / "g.csv"
    p = _grader("grade-all", "a1", str(subs), "-j", "2", "--csv", str(grades), "--out", str(out), "--device", "cpu")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["student"]: r for r in csv.DictReader(grades.open())}
    assert float(rows["alice"]["percent"]) == 100.0 and rows["alice"]["submission"].endswith("a1_attention.py")
    assert 0 < float(rows["bob"]["percent"]) < 100.0
    assert rows["carol"]["status"] == "unreadable" and float(rows["carol"]["score"]) == 0
    assert "carol: 2 files in carol/ and none is named for a1_attention (found: a.py, b.py)" in p.stderr
    alice = (out / "alice.txt").read_text()
    assert alice.startswith("student: alice\nfile: ") and "a1_attention.py" in alice.splitlines()[1]
    assert "score 100 / 100" in alice or "(100.0%)" in alice
    bob = (out / "bob.txt").read_text()
    assert "attention" in bob and "failed" in bob
    assert "SUBMISSION UNREADABLE" in (out / "carol.txt").read_text()
    png = (out / "histogram.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert "histogram: " in p.stdout


def test_grade_all_fails_when_it_finds_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    p = _grader("grade-all", "a1", str(empty), "--csv", str(tmp_path / "g.csv"), "--device", "cpu")
    assert p.returncode == 1 and "no submissions in" in p.stderr and "an empty folder" in p.stderr
    (empty / "readme.txt").write_text("hi")
    p = _grader("grade-all", "a1", str(empty), "--csv", str(tmp_path / "g.csv"), "--device", "cpu")
    assert p.returncode == 1 and "readme.txt" in p.stderr
    (empty / "alice").mkdir()                              # a student folder without a notebook: nothing graded
    (empty / "alice" / "notes.txt").write_text("")
    p = _grader("grade-all", "a1", str(empty), "--csv", str(tmp_path / "g.csv"), "--out", str(tmp_path / "o"),
                "--device", "cpu")
    assert p.returncode == 1 and "alice: no .ipynb or .py file in alice/" in p.stderr


def test_histogram_bins():
    assert counts([0, 9.99, 10, 55, 99.9, 100, 100, 120, -5]) == [3, 1, 0, 0, 0, 1, 0, 0, 0, 1, 3]


def test_gpus_option_and_visible_gpus():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 5"}) == ["2", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert choose_gpus("all", ["0", "1", "2"]) == ["0", "1", "2"]
    assert choose_gpus("2", ["0", "1", "2"]) == ["0", "1"]
    assert choose_gpus("2,0", ["0", "1", "2"]) == ["2", "0"]
    for bad in ("4", "0", "1,5", "1,1", "x"):
        with pytest.raises(ValueError, match="--gpus"):
            choose_gpus(bad, ["0", "1", "2"])
    with pytest.raises(ValueError, match="no GPU is visible"):
        choose_gpus("all", [])


def test_grade_many_spreads_gradings_over_the_gpus(tmp_path, monkeypatch):
    """Each grading process gets one GPU (``CUDA_VISIBLE_DEVICES``), the least busy when it starts: 4 workers
    on 2 GPUs at most 2 gradings share a GPU at a time, never 3."""
    running, most, seen, lock = {"0": 0, "1": 0}, {"0": 0, "1": 0}, [], threading.Lock()

    def fake(assignment, path, json_path, device="auto", timeout=None, extra=(), gpu=None, forks=None):
        with lock:
            running[gpu] += 1
            most[gpu] = max(most[gpu], running[gpu])
            seen.append(gpu)
        time.sleep(0.05)
        with lock:
            running[gpu] -= 1
        return {"assignment": assignment, "submission": str(path), "score": 1.0, "max_score": 1.0,
                "tests": [], "flags": [], "device": device, "execution_time": 0.0, "gpu": gpu}
    monkeypatch.setattr(grade_all, "grade_one", fake)
    paths = [tmp_path / f"s{i}.py" for i in range(12)]
    res = grade_all.grade_many("a1", paths, tmp_path / "o", jobs=4, device="cuda", progress=False, gpus=["0", "1"])
    assert len(res) == 12 and sorted(set(seen)) == ["0", "1"] and most == {"0": 2, "1": 2}
    assert all((tmp_path / "o" / f"s{i}.txt").read_text().startswith(f"student: s{i}\n") for i in range(12))
    slots = GpuSlots(["a", "b"])
    assert [slots.take(), slots.take(), slots.take()] == ["a", "b", "a"]


def test_grade_one_runs_the_grading_on_its_gpu(tmp_path, monkeypatch):
    """The grading process sees exactly its GPU (``CUDA_VISIBLE_DEVICES``), and the result records it."""
    seen = {}

    def fake_run(cmd, **kw):
        seen["env"] = kw["env"]
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"score": 1.0, "tests": []}))
        return subprocess.CompletedProcess(cmd, 0, "", "")
    monkeypatch.setattr(grade_all.subprocess, "run", fake_run)
    r = grade_all.grade_one("a1", OWN, tmp_path / "r.json", device="cuda", gpu="3")
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "3" and r["gpu"] == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    r = grade_all.grade_one("a1", OWN, tmp_path / "r.json", device="cpu")
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0,1" and "gpu" not in r



def test_grade_all_forks_triton_children_from_zygotes_on_a_cpu_only():
    """Several Triton gradings on a CPU share the selftest's zygotes (children start with torch and Triton
    imported), several NumPy gradings the NumPy zygote (children start with NumPy and no torch); a single
    submission or a GPU starts none."""
    import contextlib
    import os

    from autograder import grade_all
    names = ("AUTOGRADER_ZYGOTE", "AUTOGRADER_ZYGOTE_COMPILE", "AUTOGRADER_ZYGOTE_NUMPY")
    assert isinstance(grade_all._zygote("a3_triton", "cpu", 1), contextlib.nullcontext)
    assert isinstance(grade_all._zygote("a1_attention", "cuda", 5), contextlib.nullcontext)
    for aid, want in (("a3_triton", names[:2]), ("a1_attention", names[2:])):
        with grade_all._zygote(aid, "cpu", 2) as why:          # None: the zygotes answered
            if why is None:
                assert [n for n in names if os.environ.get(n)] == list(want)
            else:
                assert why == "switched off"                    # no namespaces here: the zygote is off
        assert not any(n in os.environ for n in names)


def test_a_single_triton_grading_on_a_cpu_starts_its_own_zygotes():
    """``Grader.grade`` of a torch assignment on a CPU forks its children from zygotes of its own (torch and
    compile), unless a caller's are named in the environment; a NumPy assignment or a GPU grading starts none."""
    import contextlib
    import os

    from autograder import engine, specs
    names = ("AUTOGRADER_ZYGOTE", "AUTOGRADER_ZYGOTE_COMPILE", "AUTOGRADER_ZYGOTE_NUMPY")
    assert isinstance(engine._own_zygotes(specs.load("a1_attention"), "cpu"), contextlib.nullcontext)
    assert isinstance(engine._own_zygotes(specs.load("a3_triton"), "cuda"), contextlib.nullcontext)
    with engine._own_zygotes(specs.load("a3_triton"), "cpu") as why:
        if why is None:
            assert [n for n in names if os.environ.get(n)] == list(names[:2])
            named = os.environ["AUTOGRADER_ZYGOTE"]
            with engine._own_zygotes(specs.load("a4_decoding"), "cpu") as inner:   # the caller's serve it
                assert inner is None and os.environ["AUTOGRADER_ZYGOTE"] == named
        else:
            assert why == "switched off"                        # no namespaces here: the zygote is off
    assert not any(n in os.environ for n in names)
