"""GPU speed tests compare like with like: the baseline, as the grader binds and times it, makes exactly as many
host reads of device values (each one a device sync on a GPU, 100-150 us in a grading child on an H100) as the
assignment's solution source makes with its *given* input checks. A reference timed without checks beat the
a4/a5 solutions by two syncs per call (1.24-1.26x with the same kernel); one timed with its own fuller checks
took twice as long as the solution (notes/speed_calibration.md).

The reads are counted on CPU tensors in the Triton interpreter: ``int()``, ``float()``, ``bool()``, ``.item()``
and ``.tolist()`` on a tensor, called from outside Triton's own code.
"""
from __future__ import annotations

import functools
import linecache
import sys
from pathlib import Path

import numpy as np
import pytest

import reference.triton  # noqa: F401  (first: sets TRITON_INTERPRET=1 without a GPU)
import torch

from autograder import specs
from autograder.engine import _reference_source
from autograder.runner import call_to_wire, materialise
from autograder.submission import load_cells

ROOT = Path(__file__).resolve().parents[1]
SMALL = {  # a speed test's case, shrunk for the interpreter (same arguments, same kinds of checks)
    "a4.flash_decode": [dict(B=1, Hq=4, Hkv=2, N=70, d=16, dtype="float16", torch=True),
                        dict(B=3, Hq=4, Hkv=2, N=40, d=16, dtype="float16", torch=True, lens=[40, 17, 3])],
    "a5.paged_decode": [dict(Hq=4, Hkv=2, d=16, dtype="float16", block_size=16, lens=[50], torch=True),
                        dict(Hq=4, Hkv=2, d=16, dtype="float16", block_size=16, lens=[30, 9, 16], torch=True)],
    "a3.softmax": [dict(shape=(8, 100), dtype="float16")],
    "a3.flash_attention_forward_basic": [dict(B=1, Hq=2, Hkv=2, Nq=20, Nk=20, d=16, dtype="float16")],
    "a3.flash_attention_forward": [dict(B=1, Hq=2, Hkv=2, Nq=20, Nk=20, d=16, dtype="float16", causal=True)],
    "a3.flash_attention_forward_fp8": [dict(B=1, Hq=2, Hkv=1, Nq=40, Nk=40, d=32, dtype="bfloat16", causal=True)],
    "a3b.flash_attention_backward": [dict(B=1, Hq=4, Hkv=2, Nq=20, Nk=20, d=16, dtype="float16", causal=True,
                                          timing_only=True)],
}
READS = ("__int__", "__float__", "__bool__", "__index__", "item", "tolist")


class HostReads:
    """Counts reads of tensor values by the host made from outside ``triton`` (the interpreter reads too)."""

    def __init__(self):
        self.n, self._orig = 0, {}

    def __enter__(self):
        for name in READS:
            orig = getattr(torch.Tensor, name)
            self._orig[name] = orig

            @functools.wraps(orig)
            def counted(t, *a, __orig=orig, **k):
                caller = sys._getframe(1).f_globals.get("__name__", "")
                if not caller.startswith(("triton", "torch")):
                    self.n += 1
                return __orig(t, *a, **k)
            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc):
        for name, orig in self._orig.items():
            setattr(torch.Tensor, name, orig)


def _solution(aid):
    ns = {"__name__": f"solution_{aid}"}
    for cell in load_cells(ROOT / "assignments" / aid / f"{aid}_solution.py"):
        fname = f"<{aid}_solution cell {cell.index}>"      # registered so that Triton's @jit finds the source
        linecache.cache[fname] = (len(cell.source), None, cell.source.splitlines(True), fname)
        exec(compile(cell.source, fname, "exec"), ns)  # noqa: S102
    return ns


def _graded_reference(task):
    """The baseline exactly as the grader's reference child binds it (``engine._reference_source``): the child
    calls it by the task's name (bound under another name, a3's basic and FP8 speed tests were "not run: the
    reference failed" on a GPU)."""
    name, src = _reference_source(task)
    ns = {}
    exec(compile(src, f"<reference for {task.id}>", "exec"), ns)
    assert name == task.name and callable(ns.get(name)), (task.id, src)
    return ns[name]


def _reads(fn, args, kwargs):
    fn(*args, **kwargs)                                      # compile / warm up outside the count
    with HostReads() as h:
        fn(*args, **kwargs)
    return h.n


@pytest.mark.parametrize("task_id", sorted(SMALL))
def test_reference_baseline_does_the_given_input_checks(task_id):
    aid = next(a for a in specs.ASSIGNMENTS if a.startswith(task_id.split(".")[0] + "_"))
    spec = specs.load(aid)
    task = spec.tasks[task_id]
    assert any(t.kind == "speed" and t.task == task_id for t in spec.tests), f"{task_id} has no speed test"
    solution = _solution(aid)[task.name]
    reference = _graded_reference(task)
    rng = np.random.default_rng(0)
    for params in SMALL[task_id]:
        template = task.build(params, rng)
        seeds = {key: int(rng.integers(1 << 62)) for key, _ in template.arrays()}
        header, arrays = call_to_wire(template, gen_seeds=seeds)
        args, kwargs = materialise(header, arrays, "cpu")
        student, ref = _reads(solution, args, kwargs), _reads(reference, args, kwargs)
        assert ref == student, (f"{task_id} {params}: the baseline as timed ({task.reference}, "
                                f"{task.reference_kwargs}) reads device values {ref} time(s), the solution's given "
                                f"checks {student}: the speed test would not compare the same work")


def test_host_reads_are_counted():
    x = torch.arange(4)
    with HostReads() as h:
        int(x[0]), bool(x[1]), x[2].item(), x.tolist()
    assert h.n == 4
