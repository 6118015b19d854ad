"""The data an assignment spec is made of (docs/design.md §5-6): tasks, tests, cases, tolerances, points.

A *task* is one graded name (``"a1.attention"``): how to build a call from case parameters, the float64 oracle
that gives the expected outputs, the output types it must return. A *test* is one line of the score table: a
group of cases of one task that share a purpose ("causal, Nq != Nk"), all-or-nothing, worth ``points``. Visible
cases (fixed, small) feed the in-notebook ``check``; hidden cases are drawn from a secret generator in the
grading parent. Both come from the same test, so they exercise the same thing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

# Relative error on the whole tensor, by the dtype of the inputs (docs/design.md §6 "dtype-aware relative tolerances").
# float64 is tight on purpose: computing a float64 case in float32 (T12) gives ~1e-7 and fails.
TOL = {"float64": 1e-10, "float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}
# Triton kernels: fp32 tl.dot runs in TF32 on NVIDIA GPUs by default, and fp16/bf16 keep P in low precision.
TOL_TRITON = {"float32": 5e-3, "float16": 5e-3, "bfloat16": 3e-2}
TOL_TRITON_GRAD = {"float32": 1e-2, "float16": 2e-2, "bfloat16": 8e-2}


@dataclass
class Arg:
    """One argument. Arrays travel as NumPy; ``torch_dtype`` set means "hand the function a torch tensor".

    ``value`` for a torch bfloat16 argument is a float32 array holding bf16-representable values (``.npy``
    has no bfloat16); it is cast exactly on the receiving side.
    """
    value: Any
    torch_dtype: str | None = None
    requires_grad: bool = False
    blocks: bool = False      # hand the function a read-only block source (``runner.block_source``), not the array

    @property
    def is_array(self) -> bool:
        return isinstance(self.value, np.ndarray)


@dataclass
class Out:
    """One expected output: its name, the types and dtypes it may have, and its tolerance."""
    name: str
    dtypes: tuple            # allowed dtype names, e.g. ("float32",) or ("float32", "float64")
    tol: float
    framework: str = "numpy"  # "numpy": exactly np.ndarray; "torch": exactly torch.Tensor


@dataclass
class Call:
    """A fully built case: arguments, expected outputs (float64 oracle, parent side only) and how to call.

    ``mode``: ``"call"`` (``fn(*args, **kwargs)``), ``"autograd"`` (``o = fn(*args[:-1]); o.backward(args[-1])``,
    outputs ``o`` and the gradients of the ``requires_grad`` args) or ``"script"`` (drive a class through the
    JSON ``script``; see ``autograder.runner.run_script``).
    """
    args: list
    kwargs: dict
    outs: list
    expected: list | None = None
    mode: str = "call"
    script: list | None = None
    label: str = ""
    arg_names: list | None = None   # names of the positional args, for messages ("q" instead of "argument 0")
    block_limit: int | None = None   # block-source arguments: widest slice (last axis) the call may read at once

    def arrays(self):
        """(key, Arg) for every array argument, in a fixed order (positional, then keyword)."""
        items = [(str(i), a) for i, a in enumerate(self.args)]
        items += [(k, a) for k, a in self.kwargs.items()]
        return [(k, a) for k, a in items if isinstance(a, Arg) and a.is_array]


@dataclass
class Test:
    """One graded line: ``points`` if every case passes (correctness, memory, behaviour), ramped for speed.
    ``optional``: a bonus test, outside the denominator (``Spec.max_bonus``)."""
    name: str
    task: str
    points: float
    visible: list = field(default_factory=list)
    hidden: Callable[[np.random.Generator], list] | None = None
    kind: str = "correctness"       # correctness | memory | speed | behaviour
    gpu_only: bool = False
    # on a GPU: the least compute capability the test needs, e.g. (9, 0) for FP8 tensor cores; an older GPU
    # reports the test "not run" (excluded from max_score). CPU grading (the interpreter) is not affected.
    min_capability: tuple | None = None
    # an optional part (bonus): its points add on top of the required total and stay out of max_score, so a
    # submission with every required test right scores 100% whether or not it tries the bonus (docs/design.md §6)
    optional: bool = False
    memory_limit: Callable[[dict], int] | None = None
    # speed: ratio student/reference -> full points at <= full, linear to 0 at zero
    speed_full: float = 1.25
    speed_zero: float = 3.0
    reps: int = 5
    # evidence(params, audit) -> why the call lacks the task's defining property, or None; ``audit`` is the
    # op audit's record of the call (``launches``: kernel, grid, float8 arguments). Checked on passing cases.
    evidence: Callable[[dict, dict], str | None] | None = None
    # the defining property of its task (a1: online_softmax streams): if this test fails, every test of the task
    # scores 0 (``engine.apply_gates``), so a plain softmax posing as the online one earns nothing
    gate: bool = False
    # a check the grading PARENT judges from what a *compile child* computed: ``parent_check(checks) -> (passed,
    # message)``, ``checks`` an ``engine.ChildChecks`` (``probe``: a helper evaluated as plain Python; ``compile``:
    # a Gluon kernel compiled for sm_90a, PTX and cubin back). The compile child is a sandboxed child like every
    # other with Triton's interpreter off and no GPU (``gluon_child``); a7's compile-only checks. All-or-nothing.
    parent_check: Callable[[object], tuple] | None = None

    def hidden_cases(self, rng):
        return list(self.hidden(rng)) if self.hidden else list(self.visible)


def spans_tiles(n: int, tile: int) -> bool:
    """``n`` covers at least two whole tiles plus a ragged (partial) last tile."""
    return tile >= 1 and n > 2 * tile and n % tile != 0


@dataclass(frozen=True)
class Tiled:
    """One tiled axis of a task: every grading draws at least one hidden case (outside ``gpu`` cases) whose
    ``length(params)`` spans >= 2 tiles of ``tile(params)`` plus a ragged tail (``spans_tiles``;
    ``tests/test_hidden_tiles.py``). ``tile`` is the spec's ``MAX_TILE`` (the largest tile it expects a kernel
    to use, e.g. 64 for a3's BLOCK_M/BLOCK_N) or, for NumPy functions tiled by an argument, the call's own block."""
    axis: str                                   # for messages, e.g. "key length Nk"
    length: Callable[[dict], int]
    tile: Callable[[dict], int]


def tiled(axis: str, key: str, tile) -> Tiled:
    """``Tiled`` for a case parameter ``key`` cut into ``tile`` (an int) or the case's own ``tile`` parameter."""
    size = (lambda p: int(tile)) if isinstance(tile, int) else (lambda p: int(p[tile]))
    return Tiled(axis, lambda p: int(p[key]), size)


@dataclass
class Task:
    """A graded name. ``build(params, rng) -> Call`` makes inputs; ``oracle(call) -> list of float64 arrays``."""
    id: str
    name: str
    build: Callable[[dict, np.random.Generator], Call]
    oracle: Callable[[Call], list]
    framework: str = "numpy"        # numpy | torch | class
    reference: str = ""            # "module:name" of the reference implementation (speed baseline only)
    reference_kwargs: dict = field(default_factory=dict)   # bound into the reference when timing it (keep its
    #                                                        input checks: tests/test_speed_fairness.py)
    case_timeout: float = 20.0
    # Triton parts (framework "torch"): torch ops the op audit lets pass on input-derived data (``"op"`` or
    # ``"op:N"``, at most N operands derived from the inputs; ``autograder.evaluate.audit_verdict``)
    audit_allow: tuple = ()
    audit_given: tuple = ()   # given functions (``autograder.given``) whose torch ops count as given code
    tiled: tuple = ()              # ``Tiled`` axes (hidden cases must span >= 2 tiles + a ragged tail in each)


@dataclass
class Spec:
    """An assignment: its tasks and tests plus the names a submission must not use."""
    id: str
    short: str
    tasks: dict
    tests: list
    forbidden_imports: tuple = ()
    needs_torch: bool = False
    load_timeout: float = 60.0
    total_timeout: float = 900.0
    address_space: int = 3 << 30     # RLIMIT_AS of the child when grading on CPU (NumPy children)
    rss_limit: int = 3 << 29         # the parent kills a child whose processes hold more resident memory
    # modules the grading process itself (not its child) imports for a ``Test.parent_check`` (a7: the sm_90a
    # skeleton's signature needs Gluon, hence torch): a fork server (``grade_forks``) imports them once
    parent_imports: tuple = ()
    # ungraded warm-up functions: ``check()`` runs their visible cases (``warmup_tests``, 0 points, no hidden
    # cases), while the grader, which reads ``tasks`` and ``tests`` only, never sees them
    warmups: dict = field(default_factory=dict)
    warmup_tests: list = field(default_factory=list)

    def tests_of(self, task_id):
        return [t for t in self.tests + self.warmup_tests if t.task == task_id]

    @property
    def max_points(self) -> float:
        """Points of the required tests (100 on a GPU for a1, a3, a3b, a4); the optional ones are ``max_bonus``."""
        return float(sum(t.points for t in self.tests if not t.optional))

    @property
    def max_bonus(self) -> float:
        """Points of the optional (bonus) tests, on top of ``max_points``."""
        return float(sum(t.points for t in self.tests if t.optional))


class ChildError(Exception):
    """A compile child's check could not be made (the submission raised, or sent back something malformed): the
    message is the test's output (``engine.ChildChecks``)."""
