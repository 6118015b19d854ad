"""No false accusation (issue: grader integrity, docs/design.md §6 T20): correct but unusual Triton submissions
are never judged "not computed by Triton", on 200 seeds of every hidden generator; a torch-compute + copy-kernel
cheat is judged so on every case of 25 of them.

The authorship verdict rests on the host policy (``autograder.host_policy``: the cells compile under it as in
the grading child, and a refusal is an accusation) and the op audit (``autograder.audit``): which torch ops the
call made on input-derived data, and whether a Triton kernel ran. It does not depend on values, so the sweep runs each
submission's wrapper code in-process on the real hidden cases of 200 seeds with the kernels' bodies skipped
(``LaunchHook.dry``: the launch is recorded and taints its arguments, nothing is computed): seconds instead of
hours of interpreter time. That the same submissions also score full with their kernels running is the
selftest's job (``autograder/submissions/*/correct/own_zeros_alloc``, graded on fresh seeds in every run).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import reference.triton  # noqa: E402,F401 -- the interpreter switch on CPU, before any kernel is defined
from autograder import specs  # noqa: E402
from autograder import host_policy  # noqa: E402
from autograder.audit import LaunchHook, OpAudit  # noqa: E402
from autograder.host_policy import CellCompiler  # noqa: E402
from autograder.evaluate import audit_verdict  # noqa: E402
from autograder.given import given_functions  # noqa: E402
from autograder.runner import call_to_wire, execute  # noqa: E402
from autograder.selftest import SUB, materialise_mutant  # noqa: E402
from autograder.submission import load_cells  # noqa: E402

pytestmark = pytest.mark.autograder
ROOT = Path(__file__).resolve().parents[1]
SEEDS = 200           # honest submissions: every hidden generator, 200 grading seeds
CHEAT_SEEDS = 25      # the cheat is caught by the same code path on every case; fewer seeds keep CI short
# (submission, seeds): the unusual correct submissions (zeros-allocated outputs, prints) on 200 seeds, the plain
# solutions on 50 (the same code path with empty-allocated outputs)
HONEST = {
    "a3_triton": [("assignments/a3_triton/a3_triton_solution.py", 50), ("a3_triton/correct/own_zeros_alloc", SEEDS)],
    "a3b_triton_backward": [("assignments/a3b_triton_backward/a3b_triton_backward_solution.py", 50),
                            ("a3b_triton_backward/correct/own_zeros_alloc", SEEDS)],
    "a4_decoding": [("assignments/a4_decoding/a4_decoding_solution.py", 50),
                    ("a4_decoding/correct/own_zeros_alloc", SEEDS), ("a4_decoding/correct/own_alloc_variants", SEEDS)],
    "a5_paged": [("assignments/a5_paged/a5_paged_solution.py", 50), ("a5_paged/correct/own_zeros_alloc", SEEDS),
                 ("a5_paged/correct/own_index_assign", SEEDS)],
}
CHEATED = {"a3_triton": "a3.flash_attention_forward", "a3b_triton_backward": "a3b.flash_bwd_dkdv",
           "a4_decoding": "a4.flash_decode", "a5_paged": "a5.paged_decode"}
# the host policy's cheats (one per attack class): refused on every case of a few seeds
POLICY_CHEATS = [("a4_decoding", f"a4_decoding/cheat/{name}", "a4.flash_decode") for name in (
    "t10_no_dispatch_context", "t10_pop_mode_alias", "t10_exclude_python_key", "t10_torch_on_thread",
    "t10_duck_pointer_copy", "t10_grid_clone", "t10_saved_tensor_methods", "t10_numpy_view")] + [
    ("a3b_triton_backward", "a3b_triton_backward/cheat/t10_harness_autograd", "a3b.flash_attention")]
POLICY_CHEAT_SEEDS = 3


def _path(entry):
    if entry.startswith("assignments/"):
        return ROOT / entry
    return materialise_mutant(SUB / f"{entry}.mutant.json")


def _load(path, aid):
    """The submission's namespace, each cell compiled as ``<cell N>`` under the host policy as the grader's
    child does; ``(ns, given functions, compiler, refusals reported)``."""
    import sys
    import types
    stub = types.ModuleType("autograder.check")
    stub.check = lambda *a, **k: True
    saved = sys.modules.get("autograder.check")
    sys.modules["autograder.check"] = stub
    cells = load_cells(path)
    ns = {"__name__": "__main__"}
    refusals = []
    cc = CellCompiler(ns, host_policy.config(specs.load(aid), cells), lambda threat, what: refusals.append(what))
    try:
        for c in cells:
            try:
                exec(cc.compile(c.index, c.source, f"<cell {c.index}>"), ns)  # noqa: S102
            except host_policy.PolicyError as exc:     # a load error naming the rule (as in grading)
                refusals.append(f"cell {c.index} failed to load: {exc}")
    finally:
        if saved is not None:
            sys.modules["autograder.check"] = saved
    return ns, given_functions(cells), cc, refusals


class _Dry:
    """Kernel launches are recorded and taint their arguments but run nothing."""

    def __enter__(self):
        LaunchHook.install()
        self.saved = LaunchHook.dry
        LaunchHook.dry = True
        return self

    def __exit__(self, *exc):
        LaunchHook.dry = self.saved


class _NoGC:
    """``runner.execute`` collects garbage before each call (memory tests); 0.1 s a call, not needed here."""

    def __enter__(self):
        import types
        from autograder import runner
        self.saved, runner.gc = runner.gc, types.SimpleNamespace(collect=lambda: 0)

    def __exit__(self, *exc):
        from autograder import runner
        runner.gc = self.saved


def _verdicts(aid, path, tasks=None, seeds=SEEDS):
    """task id -> list of verdicts (None = no finding) over every correctness case of SEEDS seeds; a graded
    function that a load-time refusal left undefined is refused on each of its cases."""
    spec = specs.load(aid)
    ns, given, cc, refusals = _load(path, aid)
    at_load = list(refusals)
    audit = OpAudit(given)
    LaunchHook.audit = audit
    out = {}
    try:
        with _Dry(), _NoGC():
            for seed in range(seeds):
                rng = np.random.default_rng([seed, 7])
                for test in spec.tests:
                    task = spec.tasks[test.task]
                    if task.framework != "torch" or test.kind != "correctness" or test.gpu_only:
                        continue
                    if tasks and task.id not in tasks:
                        continue
                    for params in test.hidden_cases(rng):
                        if params.get("gpu"):
                            continue
                        call = task.build(params, rng)
                        header, arrays = call_to_wire(call)
                        launches = [0]
                        LaunchHook.count = lambda: launches.__setitem__(0, launches[0] + 1)
                        if task.name not in ns:
                            out.setdefault(task.id, []).append((f"host policy: {at_load}", test.name, params))
                            continue
                        refusals.clear()
                        fn = cc.wrap(ns[task.name], task.name, header["mode"])
                        try:
                            res = execute(fn, header, arrays, "cpu", audit=audit)
                        except Exception as exc:  # noqa: BLE001 -- dry kernels may leave garbage a later step rejects
                            res = {"audit": audit.end() if audit.on else None, "error": repr(exc)}
                        finally:
                            cc.end()
                        why = audit_verdict(task, res.get("audit"))
                        if refusals:
                            why = f"host policy: {refusals[0]}"
                        if why is None and launches[0] == 0 and "error" not in res:
                            why = "no Triton kernel was launched"
                        out.setdefault(task.id, []).append((why, test.name, params))
    finally:
        LaunchHook.audit, LaunchHook.count = None, None
    return out


@pytest.mark.parametrize("aid", sorted(HONEST))
def test_unusual_correct_submissions_are_never_accused(aid):
    for entry, seeds in HONEST[aid]:
        verdicts = _verdicts(aid, _path(entry), seeds=seeds)
        assert verdicts, f"{entry}: no Triton case was drawn"
        n = sum(len(v) for v in verdicts.values())
        accused = [(t, name, why) for t, vs in verdicts.items() for why, name, _ in vs if why]
        assert not accused, f"{entry}: {len(accused)} of {n} cases accused, first: {accused[0]}"


@pytest.mark.parametrize("aid", sorted(CHEATED))
def test_torch_compute_copy_kernel_cheat_is_caught_on_every_seed(aid):
    task = CHEATED[aid]
    verdicts = _verdicts(aid, _path(f"{aid}/cheat/t10_torch_compute_copy_kernel"), tasks={task}, seeds=CHEAT_SEEDS)
    cases = verdicts[task]
    assert len(cases) >= CHEAT_SEEDS
    missed = [(name, p) for why, name, p in cases if why is None]
    assert not missed, f"{len(missed)} of {len(cases)} cases not flagged, first: {missed[0]}"


@pytest.mark.parametrize("aid, entry, task", POLICY_CHEATS, ids=[e.rsplit("/", 1)[-1] for _, e, _ in POLICY_CHEATS])
def test_host_policy_cheats_are_refused_on_every_case(aid, entry, task):
    cases = _verdicts(aid, _path(entry), tasks={task}, seeds=POLICY_CHEAT_SEEDS)[task]
    missed = [(name, p) for why, name, p in cases if why is None or "host policy" not in why]
    assert cases and not missed, f"{len(missed)} of {len(cases)} cases not refused, first: {missed[0]}"
