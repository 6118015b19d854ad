"""a7_gluon (optional, Hopper): the solution's turn passes the CPU checks; the zoo's mutants (a missing wait, a
missing arrive, a wrong phase) lose them without a GPU and without hanging (compile-only checks and the phase
model never run the kernel). The checks run the submission only inside a sandboxed compile child
(``Sandbox(compile_only=True)``) and are judged in the grading parent: forged artifacts and the zoo's cheats
(a patched compile function, a shell started through a library) are caught."""
import runpy
from pathlib import Path

import numpy as np
import pytest

from autograder.engine import ChildChecks, Grader
from autograder.gluon_compile import KERNEL, MAXNREG, judge_compile, judge_phases, signature, usage
from autograder.selftest import materialise_mutant
from autograder.submission import load_cells

ROOT = Path(__file__).resolve().parent.parent
SOLUTION = ROOT / "assignments" / "a7_gluon" / "a7_gluon_solution.py"
ZOO = ROOT / "autograder" / "submissions" / "a7_gluon"
TID = "a7.flash_attention_forward_pingpong"
MUTANTS = {
    "missing wait": ("    mbarrier.wait(turn_bars.index(WG), _turn_phase(r, WG))\n", "    _turn_phase(r, WG)\n"),
    "missing arrive": ("    mbarrier.arrive(turn_bars.index(1 - WG))\n", "    turn_bars.index(1 - WG)\n"),
    "wrong phase": ("    return (r & 1) ^ (1 - WG)\n", "    return (r & 1) ^ WG\n"),
    "empty no flip": ("    return ((t // STAGES) & 1) ^ 1\n", "    return (t // STAGES) & 1\n"),
    "ready flipped": ("    return (t // STAGES) & 1\n", "    return ((t // STAGES) & 1) ^ 1\n"),
    "score wait all": ("    return warpgroup_mma_wait(1, deps=(s,))\n", "    return warpgroup_mma_wait(0, deps=(s,))\n"),
}


def _mutant(tmp_path, name):
    old, new = MUTANTS[name]
    text = SOLUTION.read_text()
    assert text.count(old) == 1, name
    path = tmp_path / f"{name.replace(' ', '_')}.py"
    path.write_text(text.replace(old, new))
    return path


def _phases(path):
    ns = runpy.run_path(str(path))
    rng = np.random.default_rng()
    r, w = rng.integers(0, 1000, 64), rng.integers(0, 2, 64)
    return ns, np.array_equal(ns["turn_phases"](r, w), (r & 1) ^ (1 - w))


def test_solution_phases_and_turn_order():
    ns, ok = _phases(SOLUTION)
    assert ok
    assert ns["turn_order"](4) == [f"WG{w} r{r}" for r in range(4) for w in (0, 1)]


def test_ring_order_plays_the_solution_and_names_each_wrong_parity(tmp_path):
    """The notebook's given ``ring_order`` (its own mbarrier model) runs the solution's ring to the end for 2-4
    slots, and reports a hang, a race or rounds out of turn for the zoo's wrong parities; the grader's model
    (``reference.simulators.mbarrier.run_pingpong``) agrees on each."""
    from reference.simulators import mbarrier as mb
    ns = runpy.run_path(str(SOLUTION))
    for stages in (2, 3, 4):
        n = 5
        assert ns["ring_order"](n, stages) == [f"WG{w} r{r}" for r in range(n + 1) for w in (0, 1)]
        mb.run_pingpong(n, stages, ready_phase_fn=ns["_ready_phase"].fn, empty_phase_fn=ns["_empty_phase"].fn,
                        turn_phase_fn=ns["_turn_phase"].fn)
    for name, tag in (("empty no flip", "HANG"), ("ready flipped", "HANG"), ("wrong phase", "OUT OF TURN")):
        m = runpy.run_path(str(_mutant(tmp_path, name)))
        assert m["ring_order"](4, 2)[-1].startswith(tag), (name, m["ring_order"](4, 2))
        with pytest.raises(mb.ProtocolError):
            mb.run_pingpong(4, 2, ready_phase_fn=m["_ready_phase"].fn, empty_phase_fn=m["_empty_phase"].fn,
                            turn_phase_fn=m["_turn_phase"].fn)
    # an empty barrier that always lets the producer through: the model sees the overwrite
    ns["ring_order"].__globals__["_empty_phase"] = type("F", (), {"fn": staticmethod(lambda t, s: 1)})
    assert ns["ring_order"](4, 2)[-1].startswith("RACE")


def test_judge_phases_runs_the_ring_through_the_model():
    """The grader's verdict on the ring parities: right values pass; a producer without the free first pass is
    reported as the model's deadlock, a value off at a large tile index by name."""
    from reference.simulators import mbarrier as mb
    from autograder.gluon_compile import RING
    n = max(k for k, _ in RING)
    args = [[r, w] for r in range(n + 1) for w in (0, 1)]
    turn = [mb.turn_phase(r, w) for r, w in args]
    ring = [[t, s] for _, s in RING for t in range(n)] + [[1001, 3]]
    ready = [mb.ready_phase(t, s) for t, s in ring]
    empty = [mb.empty_phase(t, s) for t, s in ring]
    assert judge_phases(args, turn, ring, ready, empty)[0]
    ok, msg = judge_phases(args, turn, ring, ready, ready)
    assert not ok and "deadlock" in msg, msg
    ok, msg = judge_phases(args, turn, ring, ready, empty[:-1] + [1 - empty[-1]])
    assert not ok and "_empty_phase(t=1001, STAGES=3)" in msg, msg


def test_wrong_phase_mutant_fails_the_phase_check_and_the_order(tmp_path):
    ns, ok = _phases(_mutant(tmp_path, "wrong phase"))
    assert not ok
    assert ns["turn_order"](4)[0] == "WG1 r0"


@pytest.fixture(scope="module", autouse=True)
def _zygotes(zygote_env):
    """The worker's zygotes (``zygote_env``) for this module's CPU gradings: their grading and compile children
    are forked with torch and Triton imported, not started afresh (about 1.2 s of CPU each); nothing changes
    where namespaces are off (the children are spawned as before)."""
    with pytest.MonkeyPatch.context() as mp:
        for var, value in zygote_env.items():
            mp.setenv(var, value)
        yield


def _cpu_tests(path):
    """``{test name prefix: (status, output)}`` of the two CPU tests, and the report's flags."""
    rep = Grader("a7_gluon", device="cpu", only=["parities and turn order", "compiles for sm_90a"]).grade(path)
    return {t["name"].split(": ")[1][:12]: (t["status"], t["output"]) for t in rep["tests"]}, rep


def test_solution_passes_both_cpu_tests_in_the_compile_child():
    res, rep = _cpu_tests(SOLUTION)
    assert res["parities and"][0] == "passed", res
    assert res["compiles for"][0] == "passed", res
    assert "+6 mbarrier waits, +6 arrivals" in res["compiles for"][1]
    assert not rep["flags"]


@pytest.mark.parametrize("name", ["missing wait", "missing arrive"])
def test_missing_barrier_mutants_lose_the_compile_check(tmp_path, name):
    res, _ = _cpu_tests(_mutant(tmp_path, name))
    assert res["parities and"][0] == "passed", res          # the phase formula itself is right
    assert res["compiles for"][0] == "failed" and "expected 6" in res["compiles for"][1], res


@pytest.mark.parametrize("name", ["wrong phase", "empty no flip"])
def test_wrong_parity_mutants_lose_the_phase_check(tmp_path, name):
    res, _ = _cpu_tests(_mutant(tmp_path, name))
    assert res["parities and"][0] == "failed", res
    assert res["compiles for"][0] == "passed", res          # same instructions, another parity


def test_a_score_wait_for_everything_loses_the_compile_check(tmp_path):
    res, _ = _cpu_tests(_mutant(tmp_path, "score wait all"))
    assert res["parities and"][0] == "passed", res
    assert res["compiles for"][0] == "failed" and "overlaps" in res["compiles for"][1], res


@pytest.fixture(scope="module")
def artifacts():
    """The solution's kernel with and without turns, compiled by a compile child (the grader's own path)."""
    g = Grader("a7_gluon", device="cpu")
    g.cells = load_cells(SOLUTION)
    sb = g.compile_child()
    try:
        assert sb.compile_only
        if sb.isolation.get("mountns"):                  # where namespaces exist, the checkout is hidden from it
            assert sb.isolation.get("hidden"), sb.isolation
        checks = ChildChecks(g, sb, g.spec.tasks[TID])
        out = {}
        for turns in (True, False):
            cx = dict(HEAD_DIM=128, BLOCK_M=128, BLOCK_N=128, STAGES=2, CAUSAL=False, TURNS=turns, num_warps=4)
            out[turns] = checks.compile(KERNEL, signature(), cx, 4, maxnreg=MAXNREG)
        phases = checks.probe("_turn_phase", [[r, w] for r in range(6) for w in (0, 1)])
    finally:
        sb.stop()
    return out, phases


def test_the_parent_counts_from_the_cubin_and_the_ptx(artifacts):
    out, _ = artifacts
    with_turns, without = usage(out[True]), usage(out[False])
    ok, msg = judge_compile(with_turns, without)
    assert ok, msg
    assert with_turns["registers"] <= MAXNREG and with_turns["HGMMA"] > 0
    assert with_turns["ptx_wgmma_wait_1"] == 2


def test_forged_ptx_without_the_cubin_is_caught(artifacts):
    """A submission that adds the missing waits to the PTX text only (comments or dead text): the parent strips
    comments, and the cubin's SASS disagrees with a PTX that has more waits than the binary."""
    out, _ = artifacts
    real = out[False]
    commented = dict(real, ptx=real["ptx"] + "\n// mbarrier.try_wait.parity\n" * 6)
    assert not judge_compile(usage(commented), usage(real))[0]
    extra = "\n".join("\tmbarrier.try_wait.parity.shared::cta.b64 \t%p1, [%r1], %r2;" for _ in range(6))
    arrive = "\n".join("\tmbarrier.arrive.shared::cta.b64 \t_, [%r1];" for _ in range(6))
    forged = dict(real, ptx=real["ptx"] + "\n" + extra + "\n" + arrive + "\n")
    ok, msg = judge_compile(usage(forged), usage(real))
    assert not ok and "the PTX and the cubin disagree" in msg, msg
    assert "error" in usage(dict(real, cubin=b"\x7fELF not a cubin"))


def test_phase_probe_values_are_judged_by_the_parent(artifacts):
    _, phases = artifacts
    args = [[r, w] for r in range(6) for w in (0, 1)]
    assert judge_phases(args, phases)[0]
    assert not judge_phases(args, [1 - p for p in phases])[0]


@pytest.mark.parametrize("name,threat", [("t3_patch_compile_check", "T3"), ("t17_spawn_shell", "T17")])
def test_cheats_are_caught_in_the_compile_child(name, threat):
    path = materialise_mutant(ZOO / "cheat" / f"{name}.mutant.json")
    res, rep = _cpu_tests(path)
    assert rep["score"] == 0, res
    assert any(f["id"] == threat and f["source"] == "runtime" for f in rep["flags"]), rep["flags"]


class _FakeCompileChild:
    """Answers a ``compile`` request with made-up PTX and cubin bytes, and counts the requests."""

    def __init__(self):
        self.asked = 0

    def send(self, header):
        assert header["t"] == "compile"
        self.asked += 1

    def recv(self, timeout, expect=None, on_trap=None):
        arrs = {"ptx": np.frombuffer(b".entry k .target sm_90a", np.uint8), "cubin": np.arange(9, dtype=np.uint8)}
        return {"t": "result", "shared": 1024, "name": "k"}, arrs


def test_compile_artifacts_are_shared_within_a_run_only_for_the_same_code(tmp_path, monkeypatch):
    """With the run's folder set, a compile request on code that parses the same (a comment added: a selftest
    mutant's header, a cell of comments only) gets the first compile's artifacts without asking its child; other code, another request,
    or no folder asks the child; a grading that raised a flag leaves nothing behind for the others."""
    from autograder.submission import Cell
    cells = [Cell(0, "import triton\n"), Cell(1, "X = 1\n\n\ndef f():\n    return X\n")]
    commented = [Cell(0, "# a header\n"), Cell(1, "# more\nimport triton\n"), Cell(2, cells[1].source + "# end\n")]
    other = [cells[0], Cell(1, "X = 2\n\n\ndef f():\n    return X\n")]

    def compile_with(cs, flags=(), **request):
        g = Grader("a7_gluon", device="cpu")
        g.cells, g.flags = cs, list(flags)
        child = _FakeCompileChild()
        req = {"name": "k", "signature": {"O": "*bf16"}, "constexprs": {"TURNS": True}, "num_warps": 4, **request}
        out = ChildChecks(g, child, g.spec.tasks[TID]).compile(**req)
        assert out["cubin"] == bytes(range(9)) and out["shared"] == 1024 and ".target sm_90a" in out["ptx"]
        return child.asked

    monkeypatch.delenv("AUTOGRADER_COMPILE_CACHE", raising=False)
    assert [compile_with(cells), compile_with(cells)] == [1, 1]
    monkeypatch.setenv("AUTOGRADER_COMPILE_CACHE", str(tmp_path))
    assert compile_with(cells, flags=[{"id": "T3"}]) == 1 and not list(tmp_path.iterdir())
    assert [compile_with(cells), compile_with(commented), compile_with(cells)] == [1, 0, 0]
    assert compile_with(other) == 1
    assert compile_with(cells, constexprs={"TURNS": False}) == 1
