"""The op audit (autograder/audit.py, docs/design.md §6 T10/T19/T20): what it finds, what it must not.

In-process: code is compiled under a ``<cell N>`` file name, as the grader's child runs a submission, and
called under ``OpAudit.begin/end``. Each verdict goes through ``evaluate.audit_verdict`` as in the parent.
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from autograder.audit import LaunchHook, OpAudit  # noqa: E402
from autograder.evaluate import audit_verdict  # noqa: E402
from autograder.specs._base import Task  # noqa: E402

pytestmark = pytest.mark.autograder


def _cell(src, index=3, ns=None):
    import linecache
    ns = {} if ns is None else ns
    ns.setdefault("torch", torch)
    ns.setdefault("np", np)
    src, fname = textwrap.dedent(src), f"<cell {index}>"
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)   # a kernel's source, as the child has it
    exec(compile(src, fname, "exec"), ns)  # noqa: S102
    return ns


def _audit(fn, *args, given=None):
    a = OpAudit(given)
    a.begin(args)
    try:
        out = fn(*args)
    finally:
        rec = a.end()
    return out, rec


TASK = Task("t", "f", None, None, framework="torch")


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, 5, 16, generator=g) for _ in range(3)]


@pytest.mark.parametrize("body, op", [
    ("return q @ k.transpose(-1, -2)", "aten.bmm"),
    ("return torch.einsum('bhnd,bhmd->bhnm', q, k)", "aten.bmm"),
    ("return torch.exp(q)", "aten.exp"),
    ("return q.sum(-1)", "aten.sum"),
    ("return q * 2", "aten.mul"),
    ("return torch.where(q > 0, q, k)", "aten.gt"),
    ("return q.masked_fill(q > 0, 0.0)", "aten.gt"),
    ("return torch.ops.aten.mm(q[0, 0], k[0, 0].t())", "aten.mm"),
    ("x = q.float().contiguous().view(-1)\n    return x.cumsum(0)", "aten.cumsum"),
])
def test_compute_on_inputs_is_found_and_named(body, op):
    ns = _cell(f"def f(q, k, v):\n    {body}\n")
    _, rec = _audit(ns["f"], *_qkv())
    why = audit_verdict(TASK, rec)
    assert why is not None and op in why and "cell 3, line " in why and ", in f" in why


@pytest.mark.parametrize("body, op", [
    ("return torch.from_numpy(q.numpy() * 2)", "Tensor.numpy"),
    ("return torch.tensor(np.asarray(q))", "Tensor.__array__"),
    ("return torch.tensor(q.tolist())", "Tensor.tolist"),
    ("return torch.tensor([q[0, 0, 0, 0].item()])", "Tensor.item"),
    ("return torch.tensor(q.untyped_storage().tolist())", "Tensor.untyped_storage"),
])
def test_escapes_to_numpy_or_python_are_found(body, op):
    ns = _cell(f"def f(q, k, v):\n    {body}\n")
    _, rec = _audit(ns["f"], *_qkv())
    why = audit_verdict(TASK, rec)
    assert why is not None and op in why, why


def test_structural_and_allocation_ops_pass():
    """What an honest Triton wrapper does: allocate (empty, zeros_like, full), view, copy, cast, index."""
    ns = _cell("""
    def f(q, k, v):
        o = torch.zeros_like(q)
        lse = torch.full(q.shape[:3], float("-inf"))
        qc, kc = q.contiguous(), k.transpose(-1, -2).contiguous().transpose(-1, -2)
        x = q.float().to(torch.float16).view(-1, q.shape[-1]).reshape(q.shape)[:, :1]
        y = torch.cat([k, v], dim=2)[..., :8].clone()
        o.copy_(qc)                       # a copy of input data into the output buffer
        o.zero_()
        o.fill_(0.0)
        n = int(torch.tensor([3, 4]).max())   # metadata arithmetic on clean tensors
        print("shapes", q.shape, k.shape, n)
        return o * 1 + lse.sum()           # compute on buffers that hold no input data any more
    """)
    _, rec = _audit(ns["f"], *_qkv())
    assert audit_verdict(TASK, rec) is None, rec["findings"]


def test_data_movement_is_never_compute():
    """Indexing assignment (``o[bi, hi] = rows``: index_put_), masked assignment, index_copy_, flip, roll and
    in-place views move input data without computing on it: no finding (an a5 that merges rows this way was
    accused before)."""
    ns = _cell("""
    def f(q, k, v):
        o = torch.empty_like(q)
        bi, hi = torch.tensor([0, 0]), torch.tensor([1, 0])
        o[bi, hi] = q[0, :2]                      # index_put_
        mask = torch.zeros(q.shape[2], dtype=torch.bool)
        mask[1:3] = True
        o[0, 0, mask] = k[0, 0, mask]             # masked assignment
        o.index_copy_(2, torch.tensor([4]), v[:, :, :1])
        f2 = k.flip(-1).roll(1, dims=2)
        f2.transpose_(-1, -2).unsqueeze_(0).squeeze_(0)
        o[0, 1].masked_fill_(mask[:, None], 0.0)
        return o, f2
    """)
    _, rec = _audit(ns["f"], *_qkv())
    assert audit_verdict(TASK, rec) is None, rec["findings"]


def test_accumulating_index_put_is_compute():
    ns = _cell("""
    def f(q, k, v):
        o = torch.zeros_like(q)
        o.index_put_((torch.tensor([0]),), q[:1], accumulate=True)
        return o
    """)
    _, rec = _audit(ns["f"], *_qkv())
    why = audit_verdict(TASK, rec)
    assert why is not None and "index_put" in why, why


def test_compute_after_copy_into_clean_buffer_is_found():
    ns = _cell("""
    def f(q, k, v):
        o = torch.empty_like(q)
        o.copy_(q)
        return o.exp()
    """)
    _, rec = _audit(ns["f"], *_qkv())
    assert "aten.exp" in audit_verdict(TASK, rec)


def test_freed_tainted_storage_reused_by_a_clean_tensor_is_clean():
    """Taint is by storage address; a new allocation at a freed input-derived address starts clean (no false
    accusation from the allocator reusing memory)."""
    ns = _cell("""
    def f(q, k, v):
        for _ in range(20):
            t = q.clone()                  # tainted, freed at once
            del t
            c = torch.ones(q.shape).clone()  # clean, often at the same address
            c.mul_(2)
        return c
    """)
    _, rec = _audit(ns["f"], *_qkv())
    assert audit_verdict(TASK, rec) is None, rec["findings"]


def test_integer_inputs_are_metadata():
    ns = _cell("""
    def f(q, lens):
        n = int(lens.max()) + int(lens.sum())
        return torch.empty(n)
    """)
    _, rec = _audit(ns["f"], _qkv()[0], torch.tensor([3, 5], dtype=torch.int32))
    assert audit_verdict(TASK, rec) is None


def test_harness_ops_are_not_the_submissions():
    """Ops made where no submission frame is on the stack (the harness, autograd's accumulation) are not
    judged; ops of a function the submission calls are."""
    q = _qkv()[0]
    a = OpAudit()
    a.begin([q])
    (q * 2).sum()                          # this test file is not a <cell>
    rec = a.end()
    assert audit_verdict(TASK, rec) is None
    ns = _cell("def helper(x):\n    return x.exp()\n", index=1)
    ns2 = _cell("def f(q):\n    return helper(q)\n", index=2, ns=ns)
    _, rec = _audit(ns2["f"], q)
    assert "cell 1, line 2, in helper" in audit_verdict(TASK, rec)


def test_the_verdict_names_the_cell_as_jupyter_shows_it():
    """The grader's child registers each cell's label (``where.CELL_LABELS``: ``cell [n]``, the n-th code cell,
    Jupyter's In [n] after Run All), and the audit's place uses it."""
    from autograder import where
    where.CELL_LABELS["<cell 7>"] = "cell [4]"
    try:
        ns = _cell("def f(q, k, v):\n    return torch.exp(q)\n", index=7)
        _, rec = _audit(ns["f"], *_qkv())
        assert "aten.exp at cell [4], line 2, in f" in audit_verdict(TASK, rec)
    finally:
        where.CELL_LABELS.pop("<cell 7>", None)


def test_given_function_is_exempt_only_for_tasks_that_allow_it():
    ns = _cell("""
    def attention_forward(q, k, v):
        s = q @ k.transpose(-1, -2)
        return s.exp() @ v

    def f(q, k, v):
        return attention_forward(q, k, v)
    """)
    given = {3: [(2, 4, "attention_forward")]}
    _, rec = _audit(ns["f"], *_qkv(), given=given)
    assert audit_verdict(TASK, rec) is not None
    allowed = Task("t", "f", None, None, framework="torch", audit_given=("attention_forward",))
    assert audit_verdict(allowed, rec) is None
    # compute on the given function's output, outside it, is the student's
    ns = _cell("""
    def attention_forward(q, k, v):
        s = q @ k.transpose(-1, -2)
        return s.exp() @ v

    def f(q, k, v):
        return attention_forward(q, k, v) * 2
    """)
    _, rec = _audit(ns["f"], *_qkv(), given=given)
    assert "aten.mul" in audit_verdict(allowed, rec)


def test_allow_list_with_operand_count():
    """a3's FP8 part may rotate q by a constant Hadamard matrix (one input-derived operand), never q @ k^T."""
    task = Task("t", "f", None, None, framework="torch", audit_allow=("mm:1",))
    ns = _cell("def f(q, k, v):\n    j = torch.ones(16, 16)\n    return q.float() @ j\n")
    _, rec = _audit(ns["f"], *_qkv())
    assert audit_verdict(task, rec) is None and audit_verdict(TASK, rec) is not None
    ns = _cell("def f(q, k, v):\n    return q[0, 0] @ k[0, 0].t()\n")
    _, rec = _audit(ns["f"], *_qkv())
    assert "aten.mm" in audit_verdict(task, rec)


def test_printing_a_few_values_passes_printing_the_inputs_is_an_escape(capsys):
    ns = _cell("def f(q, k, v):\n    print(q[0, 0, 0])\n    return torch.empty(1)\n")
    _, rec = _audit(ns["f"], *_qkv())
    assert audit_verdict(TASK, rec) is None
    big = [torch.randn(2, 2, 40, 16) for _ in range(3)]
    ns = _cell("def f(q, k, v):\n    for t in (q, k, v):\n        for r in t.reshape(-1, 16):\n"
               "            str(r)\n    return torch.empty(1)\n")
    _, rec = _audit(ns["f"], *big)
    assert "repr/str" in audit_verdict(TASK, rec)


triton = pytest.importorskip("triton")


def test_triton_launch_taints_its_arguments_and_hides_the_launcher(monkeypatch):
    """Under the interpreter the launcher copies every argument to the host and back (torch ops, numpy()):
    none of that is the submission's. What the kernel wrote is input-derived: compute on it is found."""
    import reference.triton  # noqa: F401 -- switches to the interpreter on CPU
    LaunchHook.install()
    ns = _cell("""
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    def f(q, k, v):
        o = torch.zeros_like(q)
        _copy[(triton.cdiv(q.numel(), 64),)](q, o, q.numel(), BLOCK=64)
        return o

    def g(q, k, v):
        return f(q, k, v) * 2
    """)
    a = OpAudit()
    LaunchHook.audit = a
    try:
        a.begin(_qkv())
        ns["f"](*_qkv())
        q, k, v = _qkv()
        a.end()
        a.begin([q, k, v])
        o = ns["f"](q, k, v)
        rec = a.end()
        assert torch.equal(o, q)
        assert audit_verdict(TASK, rec) is None, rec["findings"]
        assert rec["launches"] == [{"kernel": "_copy", "grid": [3], "float8_args": 0}]
        a.begin([q, k, v])
        ns["g"](q, k, v)
        rec = a.end()
        assert "aten.mul" in audit_verdict(TASK, rec)
    finally:
        LaunchHook.audit = None


def test_given_functions_are_recognised_up_to_comments_and_docstrings(tmp_path):
    """a3b's given torch forward is recognised in the student notebook, with its comments or docstring
    edited; a copy whose code changed is the student's own (judged as such)."""
    from autograder.given import given_functions
    from autograder.submission import Cell, load_cells
    nb = load_cells("assignments/a3b_triton_backward/a3b_triton_backward.ipynb")
    names = {n for rs in given_functions(nb).values() for *_, n in rs}
    assert "attention_forward" in names
    src = next(c.source for c in nb if "def attention_forward" in c.source)
    soft = src.replace('"""Given:', '"""Given (edited docstring):').replace("    group = Hq // Hkv",
                                                                             "    group = Hq // Hkv  # a comment")
    hard = src.replace("    group = Hq // Hkv", "    group = Hq // Hkv\n    group = group * 1")
    for text, found in ((soft, True), (hard, False)):
        rs = given_functions([Cell(7, text, ())])
        assert ("attention_forward" in {n for *_, n in rs.get(7, [])}) is found


def test_gradescope_zip_ships_the_given_code(tmp_path):
    import zipfile
    from autograder.gradescope import build_zip
    names = zipfile.ZipFile(build_zip("a3b", tmp_path / "a3b.zip")).namelist()
    assert "assignments/given/attention_forward_torch.py" in names and "autograder/audit.py" in names
