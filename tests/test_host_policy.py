"""Deny by default in Triton parts' host code (autograder/host_policy.py, docs/design.md §6 T10/T20).

In-process: cells compile through ``host_policy.CellCompiler`` under ``<cell N>`` names, as the grading child
and ``make check`` load a submission; graded calls go through ``CellCompiler.wrap``. Every refused spelling
must raise ``PolicyError`` and, inside a graded call, report T10; every honest spelling must pass silently.
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from autograder import host_policy  # noqa: E402
from autograder.host_policy import CellCompiler, PolicyError  # noqa: E402

pytestmark = pytest.mark.autograder

PRELUDE = "import math\nimport numpy as np\nimport torch\nimport triton\nimport triton.language as tl\n"


def _load(src, allow=(), name="f"):
    """A namespace with ``src`` compiled under the policy (cell 2; cell 1 the imports); ``(ns, compiler,
    reports)``."""
    import linecache
    reports = []
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    cc = CellCompiler(ns, {"tasks": {name: list(allow)}}, lambda t, w: reports.append((t, w)))
    for i, s in enumerate((PRELUDE, textwrap.dedent(src)), 1):
        fname = f"<cell {i}>"
        # as the grading child does: the interpreter reads a kernel's source by its file name, and another
        # test of this process (a notebook loaded by ``adapter.load``) may have left its own "<cell 2>" there
        linecache.cache[fname] = (len(s), None, s.splitlines(True), fname)
        exec(cc.compile(i, s, fname), ns)  # noqa: S102
    return ns, cc, reports


def _call(src, *args, allow=(), mode="call"):
    ns, cc, reports = _load(src, allow)
    fn = cc.wrap(ns["f"], "f", mode)
    try:
        return fn(*args), reports
    finally:
        cc.end()


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, 5, 16, generator=g) for _ in range(3)]


HONEST = """
def f(q, k, v):
    B, H, N, d = q.shape
    o = torch.empty_like(q)
    o2 = q.new_zeros(q.shape)
    o3 = torch.full((B, H, N), float("-inf"), device=q.device, dtype=torch.float32)
    o4 = torch.empty_strided((B, H, N, d), (H * N * d, N * d, d, 1), dtype=q.dtype)
    buf = torch.zeros(B, H, N, d, dtype=torch.float32).float()
    bi, hi = torch.tensor([0, 0]), torch.tensor([1, 0])
    rows = q[0, :2].contiguous()
    o[bi, hi] = rows                                   # indexing assignment
    o[0, 1, 1:3] = k[0, 1, 1:3].to(torch.float32).to(q.dtype)
    o2.copy_(q.flip(-1).roll(1, dims=2))
    seq = torch.tensor([3, 5], dtype=torch.int32)
    n_max = int(seq.max()) + 1                          # integer metadata arithmetic
    grid = (triton.cdiv(N, 16), B * H, max(1, triton.next_power_of_2(n_max)))
    scale = 1.0 / math.sqrt(d)
    print("shapes", q.shape, grid, scale)
    assert o.stride(-1) == 1 and q.dtype == torch.float32 and q.is_floating_point()
    if q.shape != k.shape or not all(t.is_contiguous() for t in (q, k, v)):
        raise ValueError("shapes")
    return o, o2, o3, o4, buf
"""


def test_honest_host_code_passes():
    out, reports = _call(HONEST, *_qkv())
    assert reports == [] and torch.equal(out[0][0, 0], _qkv()[0][0, 1])


@pytest.mark.parametrize("body, what", [
    ("return torch.exp(q)", "torch.exp"),
    ("return q.exp()", "Tensor.exp"),
    ("return q @ k.mT", "operator @"),
    ("return q * 2", "operator *"),
    ("return -q", "unary -"),
    ("return q > 0", "comparing"),
    ("o = torch.empty_like(q)\n    o += q\n    return o", "operator +="),
    ("return torch.tensor(float(q[0, 0, 0, 0]))", "float()"),
    ("return sum([q, k])", "sum()"),
    ("return sum(t for t in (q, k))", "sum()"),
    ("return getattr(torch, 'exp')(q)", "torch.exp"),
    ("return torch.Tensor.exp(q)", "Tensor.exp"),
    ("return torch.ops.aten.exp(q)", "torch.ops"),
    ("return q.view(torch.int32)", "bit reinterpretation"),
    ("return torch.nn.functional.softmax(q, -1)", "torch.nn.functional.softmax"),
    ("return torch.from_numpy(q.numpy())", "Tensor.numpy"),
    ("return torch.tensor(np.ctypeslib.as_array(q))", "numpy.ctypeslib"),
    ("return vars()", "vars()"),
    ("g = globals\n    return g()", "globals()"),
    ("return torch.utils.dlpack.to_dlpack(q)", "torch.utils"),
    ("return torch.autograd.grad(q, q)", "torch.autograd.grad"),
    ("torch.exp = abs\n    return q", "patching"),
    ("o = torch.zeros_like(q)\n    o.index_put_((torch.tensor([0]),), q[:1], True)\n    return o", "accumulate"),
    ("return torch.exp._fn(q)", "private attribute"),
    ("return torch.from_numpy(np.exp(q))", "numpy.exp"),
    ("return torch.tensor(math.exp(q[0, 0, 0, 0]))", "math.exp"),
    ("import typing\n    return typing.sys.modules", "typing.sys"),
    ("import dataclasses\n    return dataclasses.inspect.stack()", "dataclasses.inspect"),
    ("return tl.standard.jit(f)", "triton.language.standard.jit"),
    ("return tl.core.builtins.eval('q')", "triton.language.core.builtins"),
    ("return torch.cuda.threading.Thread", "torch.cuda.threading"),
])
def test_refused_spellings_raise_and_report(body, what):
    src = f"def f(q, k, v):\n    {body}\n"
    with pytest.raises(PolicyError) as exc:
        _call(src, *_qkv())
    assert what.split()[-1] in str(exc.value), exc.value
    ns, cc, reports = _load(src)
    with pytest.raises(PolicyError):
        cc.wrap(ns["f"], "f")(*_qkv())
    assert reports and reports[0][0] == "T10" and "host policy" in reports[0][1]


def test_refusal_says_what_is_allowed():
    with pytest.raises(PolicyError) as exc:
        _call("def f(q, k, v):\n    return torch.exp(q)\n", *_qkv())
    assert str(exc.value) == ("torch.exp on a floating-point tensor is not available in a Triton part: torch may "
                              "allocate, view, copy and cast here; the math goes in your kernel")


def test_saved_at_load_time_is_refused_when_used():
    """A method or function saved before any call (the attack on the op audit's method guards) is the refused
    object itself: calling it later raises and reports."""
    src = """
    E = torch.exp
    M = torch.Tensor.exp
    from torch import exp as E2
    def f(q, k, v):
        return E(q), M(q), E2(q)
    """
    with pytest.raises(PolicyError):
        _call(src, *_qkv())


def test_load_time_refusal_reports_nothing():
    """A scratch cell comparing with torch fails to load (the message says why) and accuses nobody."""
    reports = []
    ns = {"__name__": "__main__"}
    cc = CellCompiler(ns, {"tasks": {"f": []}}, lambda t, w: reports.append((t, w)))
    exec(cc.compile(1, PRELUDE, "<cell 1>"), ns)  # noqa: S102
    with pytest.raises(PolicyError):
        exec(cc.compile(2, "x = torch.ones(3)\nprint((x - x).abs().max())\n", "<cell 2>"), ns)  # noqa: S102
    assert reports == []


@pytest.mark.parametrize("src, rule", [
    ("import threading\n", "import threading"),
    ("import ctypes\n", "import ctypes"),
    ("import os\n", "import os"),
    ("from torch.utils import _python_dispatch\n", "from torch.utils import"),
    ("from torch import _C\nt = _C._pop_torch_dispatch_stack\n", None),
    ("x = torch.ones(1).__class__\n", ".__class__"),
    ("t = torch._C\n", None),
    ("k = '__array_interface__'\n", "dunder"),
    ("p = torch.ones(1).data_ptr()\n", ".data_ptr"),
    ("def f(x):\n    return super(torch.Tensor, x).exp()\n", "super(...)"),
    ("class P:\n    __array_interface__ = {}\n", "__array_interface__"),
    ("def host(x):\n    return x\n@triton.jit\ndef kern(p):\n    tl.store(p, host(tl.load(p)))\n", "host(...)"),
    ("@triton.jit\ndef kern(p):\n    tl.store(p, torch.exp(tl.load(p)))\n", "torch.exp(...)"),
    ("@triton.jit\ndef kern(p):\n    x = tl.load(p)\n    x.handle.data[:] = 1\n", ".handle"),
])
def test_static_refusals(src, rule):
    ns = {"__name__": "__main__"}
    cc = CellCompiler(ns, {"tasks": {}})
    exec(cc.compile(1, PRELUDE, "<cell 1>"), ns)  # noqa: S102
    try:
        code = cc.compile(2, src, "<cell 2>")
    except PolicyError as exc:
        assert rule is None or rule in str(exc), exc
        return
    with pytest.raises(PolicyError) as exc:        # refused where it runs (imports, torch._C)
        exec(code, ns)  # noqa: S102
        ns["t"]()
    assert rule is None or rule in str(exc.value), exc.value


def test_import_inside_a_graded_call_is_reported():
    with pytest.raises(PolicyError, match="import posix is not available"):
        _call("def f(q, k, v):\n    import posix\n    return posix.getpid()\n", *_qkv())
    ns, cc, reports = _load("def f(q, k, v):\n    import posix\n    return q\n")
    with pytest.raises(PolicyError):
        cc.wrap(ns["f"], "f")(*_qkv())
    assert reports and reports[0][0] == "T10"


def test_private_names_of_own_classes_pass():
    """``self._free`` in the student's own class (a5's BlockAllocator) is the student's business."""
    src = """
    class OutOfBlocks(RuntimeError):
        def __init__(self, msg):
            super().__init__(msg)

    class Alloc:
        def __init__(self, n):
            self._free = list(range(n))
        def _take(self):
            return self._free.pop()
    def f(q, k, v):
        a = Alloc(3)
        return a._take()
    """
    out, reports = _call(src, *_qkv())
    assert out == 2 and reports == []


def test_task_allowances_open_only_their_ops():
    """a3b's GQA ``sum`` and a3 FP8's ``mm`` pass while their task runs (the op audit still counts operands)."""
    out, _ = _call("def f(q, k, v):\n    return q.sum(1), q @ k.mT\n", *_qkv(), allow=("sum", "mm:1"))
    assert out[0].shape == (1, 5, 16)
    with pytest.raises(PolicyError):
        _call("def f(q, k, v):\n    return q.sum(1)\n", *_qkv(), allow=("mm:1",))


def test_task_allow_table_matches_the_specs():
    from autograder import specs
    want = {}
    for aid in host_policy.POLICY_ASSIGNMENTS:
        for t in specs.load(aid).tasks.values():
            if t.framework == "torch" and t.audit_allow:
                want[t.id] = tuple(t.audit_allow)
    assert host_policy.TASK_ALLOW == want


def test_kernel_arguments_must_be_tensors_and_numbers():
    """A duck-typed pointer object (``data_ptr`` + ``dtype``) would hand the kernel any memory (or compute
    when read): refused at the launch."""
    src = """
    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    class Ptr:
        def __init__(self, t):
            self.t = t
            self.dtype = t.dtype
        def data_ptr(self):
            return 0

    def f(q, k, v):
        o = torch.empty_like(q)
        copy_kernel[(1,)](Ptr(q), o, q.numel(), BLOCK=256)
        return o

    def g(q, k, v):
        o = torch.empty_like(q)
        copy_kernel[(triton.cdiv(q.numel(), 256),)](q, o, q.numel(), BLOCK=256)
        return o
    """
    # ``data_ptr`` as a method name of the student's class is refused statically already
    with pytest.raises(PolicyError, match="data_ptr"):
        _load(src)
    ns, cc, reports = _load(src.replace("def data_ptr", "def pointer").replace(", BLOCK=256)\n        return o\n\n"
                                        "    def g", ", BLOCK=256)\n        return o\n\n    def g", 1))
    with pytest.raises(PolicyError, match="kernel argument of type Ptr"):
        cc.wrap(ns["f"], "f")(*_qkv())
    cc.end()
    q = _qkv()[0]
    assert torch.equal(cc.wrap(ns["g"], "f")(q, q, q), q)
    cc.end()


class _Function(torch.autograd.Function):
    pass


AUTOGRAD = """
class Attn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q)
        return q.clone()
    @staticmethod
    def backward(ctx, do):
        return do.clone(), None, None

def f(q, k, v):
    return Attn.apply(q, k, v).view(q.shape)

def torch_forward(q, k, v):
    return given_forward(q, k, v)

def given_forward(q, k, v):
    return q.clone()
"""


def test_autograd_output_must_come_from_the_students_function():
    q, k, v = (t.requires_grad_() for t in _qkv())
    out, reports = _call(AUTOGRAD, q, k, v, mode="autograd")
    assert reports == [] and out.grad_fn is not None
    ns, cc, reports = _load(AUTOGRAD.replace("return q.clone()\n", "return q * 1.0\n", 1).replace(
        "def given_forward(q, k, v):\n    return q.clone()", "def given_forward(q, k, v):\n    return q.clone()"))
    # the harness's backward would differentiate a torch forward (here the given-style ``q * 1``: compute
    # outside the student's Function, which the policy exempts only as given code)
    ns["given_forward"] = lambda q, k, v: q * 1.0
    fn = cc.wrap(ns["torch_forward"], "f", "autograd")
    with pytest.raises(PolicyError, match="torch's autograd"):
        fn(q, k, v)
    cc.end()
    assert reports and reports[0][0] == "T10"


def test_plain_runs_the_code_as_written_and_restores_the_guards():
    """The timed reps run without the guards (``CellCompiler.plain``); afterwards the guards are back."""
    src = "def helper(q):\n    return q * 2\n\ndef f(q, k, v):\n    return helper(q)\n"
    ns, cc, _ = _load(src)
    q = _qkv()[0]
    with cc.plain():
        assert torch.equal(ns["f"](q, q, q), q * 2)
    with pytest.raises(PolicyError):
        ns["f"](q, q, q)


def test_a_kernel_may_not_read_a_host_function():
    """Through a local alias the static call rule cannot see it; the launch checks what the kernel reads."""
    src = """
    def host(x):
        return x * 0 + 1

    @triton.jit
    def kern(p, n, BLOCK: tl.constexpr):
        h = host
        offs = tl.arange(0, BLOCK)
        tl.store(p + offs, h(tl.load(p + offs, mask=offs < n)), mask=offs < n)

    @triton.jit
    def honest(p, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(p + offs, tl.load(p + offs, mask=offs < n) * SCALE, mask=offs < n)

    SCALE = tl.constexpr(2.0)

    def f(q, k, v):
        o = q.clone()
        kern[(1,)](o, o.numel(), BLOCK=16)
        return o

    def g(q, k, v):
        o = q.clone().contiguous()
        honest[(1,)](o, 16, BLOCK=16)
        return o
    """
    ns, cc, reports = _load(src)
    with pytest.raises(PolicyError, match="reads the global host"):
        cc.wrap(ns["f"], "f")(*_qkv())
    cc.end()
    q = _qkv()[0]
    out = cc.wrap(ns["g"], "f")(q, q, q)
    cc.end()
    assert torch.equal(out.reshape(-1)[:16], 2 * q.reshape(-1)[:16])


def test_check_in_a_notebook_runs_the_same_policy(tmp_path):
    """``check()`` gets functions Jupyter compiled (no guard in their namespace): ``for_check`` recompiles them
    from their source, so the visible cases refuse what grading refuses, with the same message."""
    import importlib
    import sys

    import numpy as np

    from autograder import adapter, visible
    if not hasattr(sys.modules.get("autograder.check"), "run_case"):
        sys.modules.pop("autograder.check", None)      # another test's stub (the grading child's, in-process)
    check = importlib.import_module("autograder.check")
    nb = tmp_path / "nb.py"
    nb.write_text("import torch\n\n\n"
                  "def scale_of(q):\n    return q * 1.0\n\n\n"
                  "def flash_decode(q, k, v, seq_lens=None, num_splits=None, scale=None):\n"
                  "    return scale_of(q)\n")
    fn = adapter.load(nb).namespace["flash_decode"]    # as Jupyter would: cells compiled as written
    case = next(c for c in visible.cases("a4.flash_decode", np.random.default_rng(0)) if c.call is not None)
    ok, _, msg, _ = check.run_case(case, fn, "cpu")
    assert not ok and "the operator * on a floating-point tensor is not available in a Triton part" in msg, msg


def test_check_leaves_closures_stored_in_the_namespace_alone(tmp_path):
    """check() recompiles a notebook's own functions under the policy; a closure that some call stored in the
    namespace (Triton's interpreter keeps the given range fix's patch there) is not a cell's function and must
    not be recompiled: its source may use what only the given code may (here a dunder string)."""
    src = "def helper(x):\n    return getattr(x, '__index__')\n\n\ndef solve(x):\n    return x\n"
    path = tmp_path / "nb.py"
    path.write_text(src)
    ns = {"__name__": "__main__"}
    exec(compile(src, str(path), "exec"), ns)  # noqa: S102
    ns["helper"].__qualname__ = "fix.<locals>.helper"       # as a closure made inside a given function
    shadow = host_policy._shadow(ns)
    assert shadow["helper"] is ns["helper"] and shadow["solve"] is not ns["solve"]
    ns["helper"].__qualname__ = "helper"                     # a cell's own function with that body is refused
    with pytest.raises(PolicyError, match="dunder"):
        host_policy._shadow(ns)


# ---- the GPU-target compile check's verdicts ---------------------------------------------------------------------
class _FakeCompileChild:
    def __init__(self, answer):
        self.answer, self.sent = answer, []

    def send(self, msg):
        self.sent.append(msg)

    def recv(self, timeout, expect=None, on_trap=None):
        return self.answer, None


class _FakeGrader:
    """What ``gpu_compile_check`` reads of a grader: one kernel launched by two tasks of a3."""
    device = "cpu"

    def __init__(self, key, answer):
        from autograder import specs
        self.spec = specs.load("a3_triton")
        self.zeroed, self.logged, self.children = {}, [], []
        self._policy_kernels = {key: ({"kernel": "k", "signature": {"x": "*fp32"}, "constexprs": {}},
                                      {"a3.softmax", "a3.flash_attention_forward"})}
        self.answer = answer

    def compile_child(self):
        self.children.append(_FakeCompileChild(self.answer))
        return self.children[-1]

    def log(self, m):
        self.logged.append(m)

    def _on_trap(self, h):
        pass


def test_compile_verdicts_are_shared_through_the_folder_and_only_there(tmp_path, monkeypatch):
    """With ``CACHE_ENV`` set, a kernel's verdict is compiled once and read back by the next grader process (here:
    the per-process memo emptied); the zeroing is the same either way. Without it nothing is written."""
    bad = {"t": "error", "exc": "CompilationError", "msg": "at 3:4:\nPython call in a kernel\n   ^"}
    key = "0123456789abcdef01234567"
    memo, saved = host_policy._COMPILED, dict(host_policy._COMPILED)      # this process's verdicts: put back after
    try:
        _verdicts_shared_through_the_folder(tmp_path, monkeypatch, bad, key, memo)
    finally:
        memo.clear()
        memo.update(saved)


def _verdicts_shared_through_the_folder(tmp_path, monkeypatch, bad, key, memo):
    memo.clear()
    monkeypatch.delenv(host_policy.CACHE_ENV, raising=False)
    g = _FakeGrader(key, bad)
    host_policy.gpu_compile_check(g)
    assert len(g.children) == 1 and not list(tmp_path.iterdir())
    want = {t: "the kernel k does not compile for a GPU (sm_90a): CompilationError: Python call in a kernel"
            for t in ("a3.softmax", "a3.flash_attention_forward")}
    assert g.zeroed == want

    monkeypatch.setenv(host_policy.CACHE_ENV, str(tmp_path))
    for answer, compiles in ((bad, 1), ({"t": "result"}, 0)):      # the second grader never asks its child
        memo.clear()
        g = _FakeGrader(key, answer)
        host_policy.gpu_compile_check(g)
        assert len(g.children) == compiles and g.zeroed == want
    assert [p.name for p in tmp_path.iterdir()] == [f"{key}.json"]
    memo.clear()
    g = _FakeGrader("f" * 24, {"t": "result"})                      # another kernel: compiled, compiles
    host_policy.gpu_compile_check(g)
    assert len(g.children) == 1 and g.zeroed == {}


def test_a_kernels_compile_key_covers_the_constants_it_reads():
    """Two launches of one kernel source that reads a global constant share a key only when the constant is the
    same (the compiler folds it in); a global the kernel does not read changes nothing."""
    from autograder.host_guard import launch_signature
    src = """
    @triton.jit
    def k(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK) * SCALE
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
    """
    keys = []
    for scale, other in ((1, 0), (1, 5), (2, 0)):
        ns, _, _ = _load(f"SCALE = {scale}\nOTHER = {other}\n" + textwrap.dedent(src))
        rec = launch_signature(ns["k"], (torch.zeros(8), 8), {"BLOCK": 8})
        keys.append(rec["key"])
    assert keys[0] == keys[1] != keys[2]


def test_a_kernels_compile_key_covers_the_helpers_it_calls():
    """A helper the kernel calls (and what that helper calls) is in its key; a kernel of the same cells that it
    does not call is not."""
    from autograder.host_guard import launch_signature
    src = """
    @triton.jit
    def inner(x):
        return x * {inner}

    @triton.jit
    def helper(x):
        return inner(x) + 1

    @triton.jit
    def unrelated(x_ptr):
        tl.store(x_ptr, {unrelated})

    @triton.jit
    def k(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, helper(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)
    """
    import linecache
    keys = []
    try:
        for inner, unrelated in ((2, 0), (2, 7), (3, 0)):
            cell = textwrap.dedent(src).format(inner=inner, unrelated=unrelated)
            ns, _, _ = _load(cell)
            linecache.cache["<cell 2>"] = (len(cell), None, cell.splitlines(True), "<cell 2>")   # as the child does
            keys.append(launch_signature(ns["k"], (torch.zeros(8), 8), {"BLOCK": 8})["key"])
    finally:
        linecache.cache.pop("<cell 2>", None)
    assert keys[0] == keys[1] != keys[2]
