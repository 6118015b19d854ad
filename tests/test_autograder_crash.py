"""A crash is a failed test with a diagnosis, never a flag (docs/design.md §6, T17/T20), in the grader, in
``check()`` and in ``make check``; and a ``Grader`` carries nothing from one grading run to the next."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder import diagnose
from autograder.specs._base import Tiled

ROOT = Path(__file__).resolve().parent.parent
OWN = ROOT / "autograder/submissions/a1_attention/correct/own_numpy.py"
# reads 64 elements 2**40 bytes apart: a segmentation fault, with no process trick (no ctypes, no signal)
SEGFAULT = ("    import numpy as _np\n"
            "    _np.lib.stride_tricks.as_strided(_np.zeros(4), shape=(64,), strides=(1 << 40,)).sum()\n")


def _crashing_a1(tmp_path) -> Path:
    """a1's correct submission whose ``safe_softmax`` segfaults on every call."""
    src = OWN.read_text().replace("def safe_softmax(x, axis=-1):\n", "def safe_softmax(x, axis=-1):\n" + SEGFAULT, 1)
    assert SEGFAULT in src
    path = tmp_path / "crashing.py"
    path.write_text(src)
    return path


def test_diagnosis_names_the_case_the_ragged_axis_and_the_mask():
    tiled = (Tiled("row length", lambda p: p["shape"][-1], lambda p: 4096),)
    msg = diagnose.crash("softmax", "shape=(5, 37)", "crash", "the sandboxed process exited -- killed by SIGSEGV",
                         True, tiled, {"shape": (5, 37)})
    assert "softmax crashed on shape=(5, 37)" in msg and "segmentation fault" in msg
    assert "row length = 37, not a multiple of a block of 64" in msg and "tl.load/tl.store missing its mask" in msg
    # a whole number of tiles: no axis named, the generic out-of-bounds hint
    whole = diagnose.crash("softmax", "", "crash", "killed by SIGABRT", True, tiled, {"shape": (2, 128)})
    assert "row length" not in whole and "abort" in whole and "outside its tensor" in whole
    hang = diagnose.crash("flash_decode", "N=300", "timeout", "timed out", True, (), {}, 120)
    assert "did not return within 120 s on N=300" in hang and "loop" in hang
    cuda = diagnose.crash("flash_decode", "", "crash", "RuntimeError: CUDA error: an illegal memory access was "
                          "encountered", True, (), {})
    assert diagnose.is_cuda_fault(cuda) and "CUDA fault" in cuda and "fresh process" in cuda
    assert not diagnose.is_cuda_fault("ValueError: q must be 4-D")


def test_grader_fails_the_crashing_function_without_a_flag(tmp_path):
    """The segfaulting function fails with the diagnosis; no flag; the other functions keep every point (each
    test after the crash runs in a fresh child)."""
    from autograder.engine import Grader
    g = Grader("a1_attention", device="cpu", seed=5, only=["safe_softmax: basic", "safe_softmax: fully",
                                                           "merge_states", "attention: basic"])
    r = g.grade(_crashing_a1(tmp_path))
    assert r["flags"] == [], r["flags"]
    soft = [t for t in r["tests"] if t["task"] == "a1.safe_softmax"]
    assert soft and all(t["score"] == 0 for t in soft)
    assert "safe_softmax crashed" in soft[0]["output"] and "segmentation fault" in soft[0]["output"]
    others = [t for t in r["tests"] if t["task"] != "a1.safe_softmax"]
    assert others and all(t["status"] == "passed" for t in others), [(t["name"], t["output"]) for t in others]


def test_a_grader_carries_nothing_between_runs(tmp_path):
    """Grading a flagged submission, then a clean one, with the same object: the second has no flag, no zeroed
    task, no restarts (``Grader._new_run``)."""
    from autograder.engine import Grader
    cheat = tmp_path / "cheat.py"
    cheat.write_text(OWN.read_text() + "\nimport scipy\n")
    g = Grader("a1_attention", device="cpu", seed=1, only=["merge_states"])
    first = g.grade(cheat)
    assert first["flags"] and first["score"] == 0
    second = g.grade(OWN)
    assert second["flags"] == [] and second["score"] == second["max_score"] > 0 and not g.zeroed
    again = g.grade(cheat)
    assert [f["id"] for f in again["flags"]] == [f["id"] for f in first["flags"]]


def test_check_survives_a_crashing_function(capfd):
    """``check()`` runs the cases in a forked worker: a segfault fails each case with a diagnosis, the caller
    lives on, and no raw crash output ("Fatal Python error") reaches the screen."""
    from autograder.check import check

    def safe_softmax(x, axis=-1):
        import numpy as _np
        _np.lib.stride_tricks.as_strided(_np.zeros(4), shape=(64,), strides=(1 << 40,)).sum()

    assert check("a1.safe_softmax", safe_softmax) is False
    out = capfd.readouterr()
    assert "safe_softmax crashed" in out.out and "Fatal Python error" not in out.out + out.err


def test_make_check_exits_nonzero_with_the_diagnosis_and_no_raw_crash(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "autograder/tests_visible"), "-q", "-p",
                        "no:cacheprovider", "-p", "no:xdist", "--assignment", "a1", "--submission",
                        str(_crashing_a1(tmp_path)), "-m", "safe_softmax or merge_states"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert "safe_softmax crashed" in out and "segmentation fault" in out, out
    assert "Fatal Python error" not in out and "Segmentation fault" not in out, out
    assert " passed" in out and "merge_states" not in out.split("short test summary")[-1], out


A4 = ROOT / "assignments/a4_decoding/a4_decoding_solution.py"
A4_TESTS = ["flash_decode: basic", "flash_decode: GQA", "lpt_schedule"]


def _a4_grader():
    from autograder.engine import Grader
    return Grader("a4_decoding", device="cpu", seed=11, only=A4_TESTS)


def test_a_hanging_kernel_fails_its_function_with_a_diagnosis_and_no_flag(tmp_path, monkeypatch):
    """The bundled ``w_decode_hangs`` (a key loop that never advances; on a GPU in the selftest), graded with a
    short case time limit: flash_decode fails with "did not return", its next test is skipped, no flag, and the
    pure-Python bonus part keeps its points."""
    from autograder.selftest import SUB, materialise_mutant
    sub = materialise_mutant(SUB / "a4_decoding/wrong/w_decode_hangs.mutant.json", tmp_path)
    g = _a4_grader()
    monkeypatch.setattr(g.spec.tasks["a4.flash_decode"], "case_timeout", 3)
    r = g.grade(sub)
    assert r["flags"] == [], r["flags"]
    dec = [t for t in r["tests"] if t["task"] == "a4.flash_decode"]
    assert dec and all(t["score"] == 0 for t in dec)
    assert "flash_decode did not return within 3 s" in dec[0]["output"] and "loop" in dec[0]["output"]
    assert dec[1]["output"].startswith("skipped: flash_decode hung on an earlier test")
    lpt = [t for t in r["tests"] if t["task"] == "a4.lpt_schedule"]
    assert lpt and all(t["status"] == "passed" for t in lpt), lpt


def test_after_a_cuda_fault_the_next_test_runs_in_a_fresh_child(tmp_path):
    """A CUDA fault is sticky (the child's CUDA context is broken): simulated here by the error a GPU raises. The
    test fails with the diagnosis, the child is replaced, and the independent bonus part keeps its points."""
    src = A4.read_text() + ("\n# %%\ndef flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None):\n"
                            "    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n")
    sub = tmp_path / "fault.py"
    sub.write_text(src)
    r = _a4_grader().grade(sub)
    assert r["flags"] == [], r["flags"]
    dec = [t for t in r["tests"] if t["task"] == "a4.flash_decode"]
    assert all(t["score"] == 0 and "CUDA fault" in t["output"] for t in dec), [t["output"] for t in dec]
    assert r["sandbox"]["restarts"] >= len(dec)
    assert all(t["status"] == "passed" for t in r["tests"] if t["task"] == "a4.lpt_schedule")


@pytest.mark.notebooks
def test_check_in_a_jupyter_kernel_survives_a_segfault():
    """``check()`` in a real notebook kernel: the crashing function's cases fail with the diagnosis and the kernel
    runs the next cell."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import numpy as np\nfrom autograder.check import check\n"
                                          "def safe_softmax(x, axis=-1):\n" + SEGFAULT.replace("_np", "np") +
                                          "ok = check('a1.safe_softmax', safe_softmax)"),
                nbformat.v4.new_code_cell("print('alive', ok)")]
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    first = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "safe_softmax crashed" in first and "segmentation fault" in first, first
    assert "".join(o.get("text", "") for o in nb.cells[1].outputs).strip() == "alive False"


@pytest.mark.slow
def test_make_check_on_an_unmasked_triton_store(tmp_path):
    """The bundled ``w_softmax_unmasked_store`` (a3's softmax without the ragged-tail store mask) through
    ``make check``: non-zero exit, the bounds check's diagnosis naming the kernel's line, none of the interpreter's
    raw crash output (the store is stopped before it lands)."""
    from autograder.selftest import SUB, materialise_mutant
    sub = materialise_mutant(SUB / "a3_triton/wrong/w_softmax_unmasked_store.mutant.json", tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "autograder/tests_visible"), "-q", "-p",
                        "no:cacheprovider", "-p", "no:xdist", "--assignment", "a3", "--submission", str(sub),
                        "-m", "softmax"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "OutOfBoundsAccess: tl.store in `_softmax_kernel` wrote" in out, out
    assert "past the end of `y_ptr`" in out and "tl.load/tl.store missing its mask" in out and ", in _softmax_kernel)" in out, out
    for raw in ("Fatal Python error", "free(): invalid", "Segmentation fault", "core dumped", "Traceback"):
        assert raw not in out, out


def test_check_stops_a_hanging_function_once(capfd, monkeypatch):
    """A function that never returns: ``check()`` stops its first case at the time limit with the diagnosis and
    skips the others (each would wait as long)."""
    from autograder import isolated
    from autograder.check import check
    monkeypatch.setattr(isolated, "case_timeout", lambda task_id: 2.0)

    def merge_states(o_a, lse_a, o_b, lse_b):
        while True:
            pass

    assert check("a1.merge_states", merge_states) is False
    rows = [ln for ln in capfd.readouterr().out.splitlines() if " FAIL " in ln]
    assert "merge_states did not return within 2 s" in rows[0] and "loop" in rows[0]
    assert len(rows) > 1 and all("skipped: merge_states did not return" in r for r in rows[1:])


LOAD_AND_REPORT = """
import json, sys
from autograder.engine import Grader
r = Grader("a1_attention", device="cpu", seed=1, only=["safe_softmax: basic", "merge_states"]).grade(sys.argv[1])
print(json.dumps({"score": r["score"], "outputs": [t["output"] for t in r["tests"]]}))
"""


def test_a_child_that_dies_while_loading_leaves_no_folder_behind(tmp_path):
    """A submission whose cells end their process while loading fails its tests with the load error, and the
    sandbox that failed to load is stopped: no process, and no folder (home, tmp, Triton cache) left in TMPDIR."""
    sub = tmp_path / "exits_while_loading.py"
    sub.write_text(OWN.read_text() + "\n\nimport os\nos._exit(3)\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.run([sys.executable, "-c", LOAD_AND_REPORT, str(sub)], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, TMPDIR=str(tmp)), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["score"] == 0 and res["outputs"] and all("loading the submission" in o for o in res["outputs"]), res
    assert sorted(x.name for x in tmp.iterdir()) == []
