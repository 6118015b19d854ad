"""Unit tests of the autograder's parts: oracle, comparison rules, protocol, static scan, submission reading,
the in-notebook check, and the sandbox's kill/timeout/network behaviour."""
import io
import json
import textwrap
import time

import numpy as np
import pytest

from autograder import oracles
from autograder.check import check
from autograder.compare import judge, rel_error
from autograder.protocol import ProtocolError, decode_array, pack
from autograder.scan import scan
from autograder.submission import Cell, load_cells
from tests.oracle import attention_grads, attention_ref

pytestmark = pytest.mark.autograder


def _qkv(rng, b=2, hq=4, hkv=2, nq=13, nk=29, d=8):
    return (rng.standard_normal((b, hq, nq, d)), rng.standard_normal((b, hkv, nk, d)),
            rng.standard_normal((b, hkv, nk, d)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(13, 29), (29, 13), (1, 17), (1, 1)])
def test_oracle_matches_torch_autograd(rng, causal, nq, nk):
    q, k, v = _qkv(rng, nq=nq, nk=nk)
    do = rng.standard_normal(q.shape)
    o, lse = oracles.attention(q, k, v, causal)
    o_t, lse_t, _ = attention_ref(q, k, v, causal)
    np.testing.assert_allclose(o, o_t.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_t.numpy()))
    fin = np.isfinite(lse)
    np.testing.assert_allclose(lse[fin], lse_t.numpy()[fin], rtol=1e-12)
    for mine, ref in zip(oracles.attention_grads(q, k, v, do, causal), attention_grads(q, k, v, do, causal)):
        np.testing.assert_allclose(mine, ref.numpy(), rtol=1e-10, atol=1e-10)


def test_oracle_decode_and_paged_agree(rng):
    b, hq, hkv, n, d, bs = 3, 4, 2, 37, 8, 5
    q = rng.standard_normal((b, hq, d))
    k, v = rng.standard_normal((b, hkv, n, d)), rng.standard_normal((b, hkv, n, d))
    lens = np.array([37, 11, 0])
    o, lse = oracles.decode(q, k, v, lens)
    assert np.all(o[2] == 0) and np.all(np.isneginf(lse[2]))
    o1, _, _ = attention_ref(q[1][:, None, :], k[1][:, :11], v[1][:, :11])
    np.testing.assert_allclose(o[1], o1.numpy()[:, 0], rtol=1e-12)
    # the same keys scattered over a paged cache
    nblk = -(-n // bs)
    perm = rng.permutation(b * nblk)
    kc = np.zeros((b * nblk, bs, hkv, d))
    vc = np.zeros_like(kc)
    tables = np.full((b, nblk), -1)
    for i in range(b):
        for j in range(-(-lens[i] // bs)):
            blk = perm[i * nblk + j]
            tables[i, j] = blk
            sl = slice(j * bs, min((j + 1) * bs, lens[i]))
            kc[blk, : sl.stop - sl.start] = np.moveaxis(k[i, :, sl], 0, 1)
            vc[blk, : sl.stop - sl.start] = np.moveaxis(v[i, :, sl], 0, 1)
    np.testing.assert_allclose(oracles.paged(q, kc, vc, tables, lens), o, rtol=1e-12)


def test_compare_rules():
    ref = np.array([1.0, -np.inf, 2.0])
    assert judge(np.array([1.0, -np.inf, 2.0]), ref, 1e-12)[0]
    assert not judge(np.array([1.0, np.nan, 2.0]), ref, 1e-12)[0]          # NaN where the reference has none
    assert not judge(np.array([1.0, 0.0, 2.0]), ref, 1e-12)[0]             # -inf positions must match
    assert not judge(np.array([1.0, np.inf, 2.0]), ref, 1e-12)[0]          # and their sign
    assert not judge(np.ones((2, 3)), np.ones((3, 2)), 1.0)[0]              # shapes exactly
    err, _ = rel_error(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-3]))
    assert err == pytest.approx(1e-3 / np.sqrt(5 + 4e-3), rel=1e-6)
    # exact outputs (tolerance 0: byte counts, block tables) also say how many entries differ and where
    ok, _, msg = judge(np.array([[8, 8], [0, 4]]), np.array([[8.0, 8.0], [0.0, 2.0]]), 0.0)
    assert not ok and msg.endswith("1 of 4 entries differ, the first at index (1, 1)")
    assert "entries differ" not in judge(np.array([1.0, 2.0]), np.array([1.0, 2.1]), 1e-3)[2]


def test_protocol_roundtrip_and_no_pickles():
    a = np.arange(12, dtype=np.float16).reshape(3, 4)
    frame = pack({"t": "x"}, {"a": a})
    n = int.from_bytes(frame[:4], "big")
    h = json.loads(frame[4:4 + n])
    np.testing.assert_array_equal(decode_array(frame[4 + n:]), a)
    assert h["_payload"] == [["a", len(frame) - 4 - n]]
    buf = io.BytesIO()
    np.save(buf, np.array([object()], dtype=object), allow_pickle=True)
    with pytest.raises(ProtocolError):
        decode_array(buf.getvalue())


def _findings(src, names=("attention",), extra=("torch",)):
    f, attr = scan([Cell(0, textwrap.dedent(src))], list(names), extra)
    return [(x.threat, x.message, sorted(a)) for x, a in zip(f, attr)]


def test_scan_flags_and_attribution():
    found = _findings('''
        """Docstrings may say reference, softmax( and importlib freely."""
        import numpy as np

        def helper(x):
            return getattr(np, "soft" + "max")(x)

        def attention(q, k, v):
            return helper(q)

        def safe_softmax(x):
            return x
    ''', names=("attention", "safe_softmax"))
    assert found == [("T10", "getattr() with a computed attribute name", ["attention"])]
    found = _findings("import torch\nimport numpy as np\nnp.allclose = lambda *a: True\n", extra=("torch",))
    assert ("T10", "imports torch, which this assignment does not allow", ["attention"]) in found
    assert any(t == "T3" and "numpy.allclose" in m for t, m, _ in found)
    found = _findings("import time\ntime.perf_counter = lambda: 0.0\n")
    assert [t for t, _, _ in found] == ["T15"]
    found = _findings("def attention(q):\n    return q.softmax(-1)\n")
    assert found[0][0] == "T10"
    # the given Triton-interpreter helper of a3 (patching a triton module) is not monkeypatching a protected one
    assert _findings("from triton.runtime import interpreter\ninterpreter._patch_lang_tensor = None\n") == []


def test_submission_cells(tmp_path):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# hi"), nbformat.v4.new_code_cell("!pip install x\nx = 1\n%time y = 2"),
                nbformat.v4.new_code_cell("%%timeit\nz = 3"), nbformat.v4.new_code_cell("check('a1.attention', f)")]
    nb.cells[-1].metadata["tags"] = ["check"]
    p = tmp_path / "s.ipynb"
    nbformat.write(nb, p)
    cells = load_cells(p)
    assert [c.source for c in cells] == ["\nx = 1\n"]
    py = tmp_path / "s.py"
    py.write_text('# %% [markdown]\n# text\n# %%\na = 1\n# %% tags=["skip"]\nb = 2\n# %% tags=["check"]\nc = 3\n')
    assert [c.source.strip() for c in load_cells(py)] == ["a = 1"]


def test_check_pass_fail_and_stub(capsys):
    from reference.numpy.attention import attention

    def stub(*a, **k):
        raise NotImplementedError

    assert check("a1.attention", attention) is True
    assert check("a1.attention", stub) is False
    assert "not implemented yet" in capsys.readouterr().out
    assert check("a1.nope", attention) is False


def test_sandbox_kills_escaped_grandchildren_and_times_out():
    from autograder.sandbox import Limits, Sandbox, SandboxDied
    sb = Sandbox("cpu", Limits(address_space=2 << 30))
    sb.start()
    try:
        src = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(120)\n    os._exit(0)\n"
               "while True:\n    pass\n")
        sb.send({"t": "load", "cells": [[0, src]], "names": [], "trusted": True})
        t0 = time.monotonic()
        with pytest.raises(SandboxDied) as exc:
            sb.recv(2.0, expect="loaded")
        assert exc.value.kind == "timeout" and time.monotonic() - t0 < 10
        assert sb._members() == []                      # the setsid grandchild was found by its token and killed
        assert sb.network.startswith(("off", "on"))
    finally:
        sb.stop()


def test_timed_inputs_from_seeds_and_native_bf16_outputs():
    """Timed calls ship seeds, not data: the same seed gives the same values in any process (so the student and
    reference children agree), a new seed new values (T5/T16); bf16 outputs travel as int16 bits and come back
    exactly; a sample is the same elements for the same seed."""
    import torch
    from autograder.runner import call_to_wire, describe, from_wire, gen_array, materialise
    from autograder.specs._gen import arr
    from autograder.specs._base import Call, Out
    c = Call([arr(np.zeros((3, 5), np.float32), "bfloat16"), arr(np.arange(3, dtype=np.int32), "int32")], {},
             [Out("o", ("bfloat16",), 1e-2, "torch")])
    header, arrays = call_to_wire(c, gen_seeds={"0": 7, "1": 8})
    assert list(arrays) == ["1"] and header["args"][0]["gen"] == 7      # floats as seeds, ints as data
    (a1, i1), _ = materialise(header, arrays)
    (a2, _), _ = materialise(header, arrays)
    assert a1.dtype == torch.bfloat16 and torch.equal(a1, a2) and a1.std() > 0.3 and i1.tolist() == [0, 1, 2]
    other = gen_array(dict(header["args"][0], gen=9))
    assert not torch.equal(a1, other)
    info, bits = describe(a1, native=True)
    assert info["wire"] == "bf16" and bits.dtype == np.int16
    np.testing.assert_array_equal(from_wire(info, bits), a1.float().numpy())
    assert from_wire(info, bits.astype(np.float32)) is None                 # payload that does not fit its tag
    _, s1 = describe(a1, native=True, sample=(3, 6))
    _, s2 = describe(a1.clone(), native=True, sample=(3, 6))
    np.testing.assert_array_equal(s1, s2)
    assert s1.shape == (6,)
    np_arg = gen_array({"gen": 4, "shape": [4, 2], "dtype": "float16"})
    assert np_arg.dtype == np.float16 and np.array_equal(np_arg, gen_array({"gen": 4, "shape": [4, 2],
                                                                             "dtype": "float16"}))


CACHE_CHEAT = """
# %%
_honest = flash_decode
_C = {}
def flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None):
    if tuple(q.shape) not in _C:
        _C[tuple(q.shape)] = _honest(q, k, v, seq_lens, num_splits, scale)
    return _C[tuple(q.shape)].clone()
"""


def test_the_report_takes_its_sandbox_facts_from_the_student_child(monkeypatch):
    """Network and isolation in the report come from the child that loaded the submission; a separate probe child
    starts only when no student child ever did."""
    from pathlib import Path
    from autograder import engine
    monkeypatch.setattr(engine, "_NET", {})
    monkeypatch.setattr(engine, "_ISO", {})
    started = []
    real = engine.Sandbox

    def counting(device, limits, label="student", **kw):
        started.append(label)
        return real(device, limits, label, **kw)
    monkeypatch.setattr(engine, "Sandbox", counting)
    g = engine.Grader("a1_attention", device="cpu", seed=1)
    g.cells = load_cells(Path(__file__).resolve().parent.parent / "assignments/a1_attention/a1_attention_solution.py")
    sb = g._start_student()
    try:
        network, isolation = sb.network, engine.isolation.describe(sb.isolation)
    finally:
        sb.stop()
    assert g.sandbox_network() == network and network.startswith(("off", "on"))
    assert g.sandbox_isolation() == isolation
    assert started == ["student"]
    fresh = engine.Grader("a1_attention", device="cpu", seed=1)
    engine._NET.clear()
    engine._ISO.clear()
    assert fresh.sandbox_network() == network and fresh.sandbox_isolation() == isolation
    assert started == ["student", "probe"]


@pytest.mark.parametrize("cheat", [False, True])
def test_timed_protocol_on_cpu_catches_cached_answers(tmp_path, cheat):
    """The GPU speed path (seeded inputs drawn in both children, bf16 outputs, whole + sampled re-checks against
    the reference child, reference_kwargs bound) run on CPU on a tiny case: an honest solution
    gets a ratio, a shape-keyed cache fails with T16."""
    from pathlib import Path
    from autograder.engine import Grader
    from autograder.specs._base import Test
    src = Path(__file__).resolve().parent.parent / "assignments/a4_decoding/a4_decoding_solution.py"
    sub = tmp_path / "sub.py"
    sub.write_text(src.read_text() + (CACHE_CHEAT if cheat else ""))
    g = Grader("a4_decoding", device="cpu", seed=3)
    g.results, g.dead_tasks, g._flooded = [], {}, set()
    g.cells = load_cells(sub)
    task = g.spec.tasks["a4.flash_decode"]
    test = Test("a4.flash_decode: speed probe", "a4.flash_decode", 10, [],
                lambda r: [dict(B=2, Hq=4, Hkv=2, N=37, d=16, dtype="bfloat16", torch=True, lens=[37, 20])],
                kind="speed", reps=3)
    try:
        r = g.run_test(test, task)
    finally:
        for sb in (g.sandbox, g.ref_sandbox):
            if sb is not None:
                sb.stop()
    if cheat:
        assert r.score == 0 and "wrong result" in r.output and any(f["id"] == "T16" for f in g.flags), r.output
    else:
        assert r.status in ("passed", "partial", "failed") and "ratio" in r.extra and not g.flags, r.output


@pytest.mark.selftest
def test_mutant_submissions_apply_exactly_and_fail_loudly_when_stale(tmp_path):
    """A wrong submission stored as a mutant of a solution source: edits must match exactly ``count`` times."""
    import json
    from pathlib import Path

    from autograder.selftest import SUB, materialise_mutant
    for spec_path in sorted(SUB.glob("*/*/*.mutant.json")):
        out = materialise_mutant(spec_path, tmp_path)
        spec = json.loads(spec_path.read_text())
        base = (Path(__file__).resolve().parent.parent / spec["base"]).read_text()
        assert out.read_text() != base and all(e["new"] in out.read_text() for e in spec["edits"])
    stale = tmp_path / "wrong" / "w_stale.mutant.json"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text(json.dumps({"base": "assignments/a3_triton/a3_triton_solution.py", "why": "x",
                                 "edits": [{"old": "this line is not in the solution", "new": "y"}]}))
    with pytest.raises(ValueError, match="occurs 0 times"):
        materialise_mutant(stale, tmp_path)


def test_check_prints_failing_case_parameters_and_a_reproducing_call(capsys):
    """A failing case shows its shapes/dtypes/scalars and a line re-running it on the kept inputs."""
    from reference.numpy.attention import attention

    def wrong_when_causal(q, k, v, causal=False, **kw):
        return attention(q, k, v, causal=False, **kw)

    assert check("a1.attention", wrong_when_causal) is False
    out = capsys.readouterr().out
    assert check.failed and all(c.mode == "call" for c in check.failed)
    first = check.failed[0]
    assert f"failed case 0 ({first.label}): q: " in out and "causal=True" in out
    assert "reproduce: out = wrong_when_causal(*check.failed[0].args, **check.failed[0].kwargs)" in out
    q = first.args[0] if first.args else first.kwargs["q"]
    assert f"{q.dtype} {tuple(q.shape)}" in first.params
    again = first.run(wrong_when_causal)                     # the kept inputs reproduce the failure
    good = first.run(attention)
    again, good = (x[0] if isinstance(x, tuple) else x for x in (again, good))
    assert again.shape == good.shape and not np.allclose(again, good)
    assert check("a1.attention", attention) is True and check.failed == []


def test_check_reproduces_a_failing_allocator_script(capsys):
    from reference.numpy.paged import BlockAllocator

    class NoErrors(BlockAllocator):
        @property
        def num_free(self):
            return super().num_free + 1                       # off by one: the num_free checks fail

    assert check("a5.BlockAllocator", NoErrors) is False
    out = capsys.readouterr().out
    assert "script of" in out and "check.failed[0].run(NoErrors)" in out
    assert isinstance(check.failed[0].run(NoErrors), list)




@pytest.mark.parametrize("mod", ["reference.triton.hopper.flash_gluon", "experiments.gluon_schedules",
                                 "benchmarks.course.bench_gluon"])
def test_scan_flags_the_courses_own_kernels(mod):
    """A submission may not import the course's own code: the reference, the ablation kernels in
    ``experiments/`` (a7's ping-pong kernel is among them) or the benchmarks (which import both)."""
    found = _findings(f"import {mod}\n\ndef attention(q):\n    return q\n", extra=())
    assert found and found[0][0] == "T10" and mod.split(".")[0] in found[0][1], found


def test_case_timeout_caps_this_graders_limits_only():
    """``Grader(case_timeout=S)`` (``grade --case-timeout S``) lowers every task's time limit per case to at most
    ``S`` in its own copy of the spec; the cached spec other graders load keeps the spec's limits; a limit that is
    not a positive number is refused by name."""
    from autograder import specs
    from autograder.engine import Grader
    spec = specs.load("a3_triton")
    limits = {tid: t.case_timeout for tid, t in spec.tasks.items()}
    g = Grader("a3_triton", case_timeout=90)
    assert {tid: t.case_timeout for tid, t in g.spec.tasks.items()} == {tid: min(v, 90.0) for tid, v in limits.items()}
    assert any(v > 90 for v in limits.values())                 # the cap bit somewhere
    assert {tid: t.case_timeout for tid, t in specs.load("a3_triton").tasks.items()} == limits
    for bad in (0, -1, "5"):
        with pytest.raises(ValueError, match="case_timeout must be a positive number"):
            Grader("a3_triton", case_timeout=bad)


TREE = """
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(36, 1)                 # PR_SET_CHILD_SUBREAPER: orphans come back to this process
for _ in range(2):
    if os.fork() == 0:
        if os.fork() == 0:                     # a grandchild whose parent exits at once: an orphan
            time.sleep(60)
            os._exit(0)
        os._exit(0)
import threading
done = threading.Event()
def spawn():                                   # a child of a second, still running thread (listed under that task)
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    done.set()
    time.sleep(60)
threading.Thread(target=spawn, daemon=True).start()
done.wait()
print("ready", flush=True)
time.sleep(60)
"""


def test_subtree_walk_finds_what_the_scan_finds():
    """``isolation.subtree`` walks the ``children`` files; it must list the same processes as the scan of every
    process's parent link: children, orphans reparented to a subreaper, children of any thread, nothing else."""
    import os
    import signal
    import subprocess
    import sys

    from autograder import isolation
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while True:       # until the tree is still: the two intermediate children zombies, the rest asleep
            scan_ = isolation.subtree_by_scan(p.pid)
            states = sorted(scan_.values())
            if states == ["S"] * 4 + ["Z"] * 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert states == ["S"] * 4 + ["Z"] * 2, scan_    # the root, two orphans, the thread's child; two zombies
        walk = isolation.subtree(p.pid)
        assert walk == scan_ == isolation.subtree_by_scan(p.pid)
        assert os.getpid() not in walk and p.pid in isolation.subtree(os.getpid())
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
