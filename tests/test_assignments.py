"""Assignments: the generator, the student notebooks it writes, and the solution sources.

* ``assignments`` marker: the committed student notebooks are what ``python -m assignments.generate`` writes;
  they contain no solution text; every graded name of the grading contract is defined in each solution source
  with the docs/design.md §4 signature; the generator's parsing and stubbing rules.
* ``notebooks`` marker: every solution source, run headless as a notebook, passes every visible ``check(...)``;
  every student notebook runs top to bottom with its checks reporting failure instead of raising (the pair of
  one assignment in one kernel, the student's after a ``%reset -f``).
"""
from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path

import nbformat
import pytest

from assignments import ASSIGNMENTS, GRADED, WARMUP, written
from assignments import generate as gen
from tests import kernel_forks
from tests.common_numpy import load_solution as _load_solution

ROOT = Path(__file__).resolve().parents[1]
AIDS = list(ASSIGNMENTS)

# docs/design.md §4 signatures of the graded names (the grading contract: same as the reference API).
SIGNATURES = {
    "flash_attention_forward_fp8": "(q, k, v, causal=False, scale=None, hadamard=False, seed=0)",
    "safe_softmax": "(x, axis=-1)",
    "online_softmax": "(x, block_size=128)",
    "merge_states": "(o_a, lse_a, o_b, lse_b)",
    "attention": "(q, k, v, causal=False, scale=None, return_lse=False)",
    "flash_attention_forward": {
        "a2_flash_numpy": "(q, k, v, causal=False, scale=None, block_q=64, block_k=64)",
        "a3_triton": "(q, k, v, causal=False, scale=None)"},
    "flash_attention_forward_basic": "(q, k, v, scale=None)",
    "flash_attention_backward": {
        "a2_flash_numpy": "(q, k, v, o, lse, do, causal=False, scale=None, block_q=64, block_k=64)",
        "a3b_triton_backward": "(q, k, v, o, lse, do, causal=False, scale=None)"},
    "softmax": "(x)",
    "flash_attention": "(q, k, v, causal=False, scale=None)",
    "flash_bwd_preprocess": "(o, do)",
    "flash_bwd_dkdv": "(q, k, v, do, lse, delta, causal=False, scale=None)",
    "flash_bwd_dq": "(q, k, v, do, lse, delta, causal=False, scale=None)",
    "flash_decoding": "(q, k, v, num_splits=4, seq_lens=None, scale=None)",
    "flash_decode": "(q, k, v, seq_lens=None, num_splits=None, scale=None)",
    "BlockAllocator": "(num_blocks)",
    "cow_fork": "(refcount, block_table)",
    "lpt_schedule": "(costs, n_workers)",
    "forward_hbm_bytes": "(nq, nk, d, block_q=64, block_k=64, element_bytes=4, causal=False, order='fa2')",
    "cow_append": "(k_cache, v_cache, refcount, block_table, seq_len, k_new, v_new)",
    "paged_attention": "(q, k_cache, v_cache, block_tables, seq_lens, scale=None)",
    "paged_decode": "(q, k_cache, v_cache, block_tables, seq_lens, scale=None)",
    "ring_step": "(o, lse, q, k, v, q_pos, k_pos, causal=True, scale=None)",
    "ring_backward_step": "(dq, dk, dv, q, k, v, do, lse, delta, q_pos, k_pos, causal=True, scale=None)",
    "flash_attention_forward_pingpong": "(q, k, v, causal=False, scale=None)",
    # what the student writes where it is not the graded name (assignments.WRITTEN): @gluon.jit helpers, compared
    # without their gl.constexpr annotations
    "_turn_phase": "(r, WG)",
    "_take_turn": "(turn_bars, WG, r)",
    "_give_turn": "(turn_bars, WG)",
    # ungraded warm-ups (assignments.WARMUP)
    "scale_rows": "(x, s)",
    "_ready_phase": "(t, STAGES)",
    "_empty_phase": "(t, STAGES)",
    "_wait_scores": "(s)",
}


def _signature(obj) -> str:
    """The signature of a function, or of the Python function behind a ``@triton.jit``/``@gluon.jit`` one
    (annotations dropped there: ``WG: gl.constexpr`` prints as a module path)."""
    fn = getattr(obj, "fn", None)
    if fn is None:
        return str(inspect.signature(obj))
    sig = inspect.signature(fn)
    return str(sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()]))


def _source(aid: str) -> str:
    return (ROOT / "assignments" / aid / f"{aid}_solution.py").read_text(encoding="utf-8")


# --- generation --------------------------------------------------------------------------------------------

@pytest.mark.assignments
def test_generated_notebooks_are_up_to_date(capsys):
    assert gen.main(["--check"]) == 0, capsys.readouterr().err


@pytest.mark.assignments
def test_generation_is_deterministic_and_valid():
    for aid in AIDS:
        text = gen.render(aid)
        assert text == gen.render(aid)
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata.kernelspec.name == "python3"
        assert len({c.id for c in nb.cells}) == len(nb.cells)
        assert all(c.get("outputs", []) == [] for c in nb.cells if c.cell_type == "code")


@pytest.mark.assignments
@pytest.mark.parametrize("aid", AIDS)
def test_student_notebook_has_no_solution_text(aid):
    source = _source(aid)
    nb = nbformat.read(gen.student_path(aid), as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert gen.BEGIN not in code and gen.END not in code
    # lines that occur only inside SOLUTION regions must not reach the student
    outside = set(line.strip() for line in gen.strip_solutions(source).splitlines())
    secret = [line for line in gen.solution_lines(source) if line not in outside]
    assert secret, "expected solution regions"
    student_lines = set(line.strip() for line in code.splitlines())
    leaked = [line for line in secret if line in student_lines]
    assert not leaked, f"solution lines in the student notebook: {leaked[:5]}"
    # every function the student writes is stubbed (assignments.WRITTEN, else the graded names), and there is a
    # check cell for every graded name
    short = ASSIGNMENTS[aid]
    for name in written(aid) + WARMUP.get(aid, ()):
        assert f'NotImplementedError("Implement {name}' in code, name
    for name in GRADED[aid] + WARMUP.get(aid, ()):
        assert any(f'check("{short}.{name}", {name})' in c.source and "check" in c.metadata.get("tags", [])
                   for c in nb.cells if c.cell_type == "code"), f"no check cell for {name}"


@pytest.mark.assignments
@pytest.mark.parametrize("aid", AIDS)
def test_solution_defines_graded_names_with_spec_signatures(aid, tmp_path):
    module = _load_solution(aid, tmp_path)
    for name in dict.fromkeys(GRADED[aid] + written(aid) + WARMUP.get(aid, ())):
        assert hasattr(module, name), f"{aid} does not define {name}"
        want = SIGNATURES[name]
        want = want[aid] if isinstance(want, dict) else want
        assert _signature(getattr(module, name)) == want, name
    if aid == "a5_paged":
        cls = module.BlockAllocator
        for meth, sig in (("allocate", "(self)"), ("free", "(self, block)"), ("incref", "(self, block)"),
                          ("refcount", "(self, block)")):
            assert str(inspect.signature(getattr(cls, meth))) == sig
        assert isinstance(inspect.getattr_static(cls, "num_free"), property)


@pytest.mark.assignments
def test_solution_sources_do_not_use_forbidden_names():
    for aid in AIDS:
        cells = [c for c in gen.parse_percent(_source(aid)) if c.kind == "code"]
        code = "\n".join(c.source for c in cells)
        # an ungraded ("skip") cell may compare with the course's model, guarded: the release has no reference/
        graded = "\n".join(c.source for c in cells if "skip" not in c.tags)
        assert not re.search(r"(^|\s)(import|from)\s+reference|\breference\.", graded), f"{aid} uses reference"
        for c in cells:
            if "skip" in c.tags and re.search(r"(^|\s)(import|from)\s+reference", c.source):
                assert "except ImportError" in c.source, f"{aid}: a skip cell imports reference unguarded"
        for bad in ("scaled_dot_product", ".softmax(", "F.softmax", "scipy", "importlib",
                    "exec(", "eval("):
            assert bad not in code, f"{aid} uses {bad!r}"
        if aid in ("a1_attention", "a2_flash_numpy"):
            assert "torch" not in code, f"{aid} is a NumPy assignment"


# --- the generator's rules -----------------------------------------------------------------------------------

@pytest.mark.assignments
def test_strip_solutions_keeps_code_around_regions():
    src = ("class A:\n    def f(self, x):\n        y = x + 1\n        ### BEGIN SOLUTION\n        z = y * 2\n"
           "        return z\n        ### END SOLUTION\n        return None\n\n\n"
           "def g(x):\n    if x:\n        ### BEGIN SOLUTION\n        return 1\n        ### END SOLUTION\n"
           "    return 0\n")
    out = gen.strip_solutions(src)
    assert out.splitlines() == [
        "class A:", "    def f(self, x):", "        y = x + 1",
        '        raise NotImplementedError("Implement A.f")', "        return None", "", "",
        "def g(x):", "    if x:", '        raise NotImplementedError("Implement g")', "    return 0"]
    assert gen.solution_lines(src) == ["z = y * 2", "return z", "return 1"]


@pytest.mark.assignments
@pytest.mark.parametrize("bad", [
    "def f():\n    ### BEGIN SOLUTION\n    pass\n",                       # not closed
    "def f():\n    pass\n    ### END SOLUTION\n",                          # not opened
    "### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n",                        # not in a function
    "def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    ### END SOLUTION\n",  # nested
])
def test_strip_solutions_rejects_malformed_regions(bad):
    with pytest.raises(ValueError):
        gen.strip_solutions(bad)


@pytest.mark.assignments
def test_solutions_dir_option(tmp_path):
    assert gen.main(["a1_attention", "--check", "--solutions", str(tmp_path)]) == 0
    nb = nbformat.read(tmp_path / "a1_attention_solution.ipynb", as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "### BEGIN SOLUTION" in code


# --- executed headless -----------------------------------------------------------------------------------------

def _check_results(nb) -> list:
    """The value shown by each check cell (the return value of its last ``check(...)``)."""
    out = []
    for c in nb.cells:
        if c.cell_type == "code" and "check" in c.metadata.get("tags", []):
            shown = [o["data"]["text/plain"] for o in c.outputs if o.output_type == "execute_result"]
            text = "".join(o.get("text", "") for o in c.outputs if o.output_type == "stream")
            out.append((shown[-1] if shown else None, text))
    return out


def _execute_in_one_kernel(first: str, second: str, timeout: int = 300):
    """Both notebooks top to bottom in one kernel, the second after ``%reset -f`` (the first's names gone: a name
    the second uses without defining is a NameError, as in a fresh kernel); the kernel's start is paid once for the
    pair, and the kernel is forked from a template that has imported torch and Triton (``tests/kernel_forks.py``)."""
    from nbclient import NotebookClient

    a, b = nbformat.reads(first, as_version=4), nbformat.reads(second, as_version=4)
    second = [nbformat.from_dict({**c, "id": f"second-{i}"}) for i, c in enumerate(b.cells)]  # ids unique
    reset = nbformat.v4.new_code_cell("%reset -f")
    both = nbformat.v4.new_notebook(metadata=a.metadata, cells=a.cells + [reset] + second)
    NotebookClient(both, timeout=timeout, kernel_name="python3", kernel_manager_class=kernel_forks.manager_class(),
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    a.cells, b.cells = both.cells[:len(a.cells)], both.cells[len(a.cells) + 1:]
    return a, b


@pytest.mark.notebooks
@pytest.mark.parametrize("aid", AIDS)
def test_solution_passes_visible_checks_and_student_notebook_reports_not_implemented(aid):
    """The solution source, run as a notebook, passes every visible check; then, in the same kernel after
    ``%reset -f``, the student notebook runs top to bottom with every check reporting failure instead of raising
    (what the solution left behind is only imported modules and caches: its own code sits in function bodies,
    and a stub raises before reaching any of it)."""
    solution, student = _execute_in_one_kernel(gen.render(aid, student=False),
                                               gen.student_path(aid).read_text(encoding="utf-8"))
    results = _check_results(solution)
    assert len(results) == len(GRADED[aid]) + len(WARMUP.get(aid, ()))
    for shown, text in results:
        assert shown == "True", text
    results = _check_results(student)
    assert len(results) == len(GRADED[aid]) + len(WARMUP.get(aid, ()))
    for shown, text in results:
        assert shown == "False" and ("not implemented" in text or "NotImplementedError" in text), text


@pytest.mark.notebooks
def test_the_second_notebook_does_not_see_the_first_ones_names():
    """The pair shares a kernel, not a namespace: a name the student notebook uses but only the solution defined
    (a variable, an imported module) is not there, as in a fresh kernel."""
    def nb(code):
        return nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]))

    a, b = _execute_in_one_kernel(nb("import math\nx = 1\nprint(sorted({'x', 'math'} & set(globals())))"),
                                  nb("print(sorted({'x', 'math'} & set(globals())))"))
    assert a.cells[0].outputs[0]["text"] == "['math', 'x']\n"
    assert b.cells[0].outputs[0]["text"] == "[]\n"
