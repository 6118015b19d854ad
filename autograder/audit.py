"""The op audit of a graded call of a Triton part (docs/design.md §6, T10): which torch operations the call
performed on input-derived data, and which input data left torch for NumPy or Python.

Runs in the child (trusted harness code). A torch dispatch mode is pushed for the duration of one graded call, and a few tensor methods report to it:

* a ``TorchDispatchMode`` sees every aten operation, whatever Python spelling reached it (``q @ k.mT``,
  ``torch.einsum``, ``F.linear``, ``torch.ops.aten.mm``, the ops autograd runs for ``torch.autograd.grad``).
  It tracks *taint* by storage: the floating-point inputs are tainted; an op with a tainted input taints its
  outputs; a Triton launch that receives a tainted tensor taints every floating-point tensor it receives (it
  may have written derived data into any of them; integer arguments such as lengths stay metadata); allocation (``empty``, ``zeros_like``, ``full``...) and ``zero_``/``fill_``
  with a number give clean outputs. An op on tainted data that is not structural (views, reshapes, copies,
  casts, gathers, concatenation) is a *compute* finding;
* the tensor methods that hand data to NumPy/Python are wrapped (``MethodGuards``): ``numpy()``, ``__array__``,
  ``tolist()``, ``item()``, ``untyped_storage()``, ``__dlpack__`` on tainted data are *escape* findings (the
  spellings that would reach the C methods past the wrappers, ``torch._C.TensorBase`` or a two-argument
  ``super()``, are refused by the static scan); ``repr``/``str`` of
  tainted tensors counts the elements turned into text (an escape once they exceed half of the inputs), and so
  does a copy of input-derived GPU data to the host (``.cpu()``, ``tolist`` and storage reads on a GPU): a
  debug print of a few values is no evidence, moving the inputs to the host is.

Attribution: an op is the submission's when a frame of its code (``<cell N>``) is on the stack, with one
exception: inside a Triton launch (``launch_depth > 0``: the launcher's own argument handling, the
interpreter's host copies, the autotuner's benchmarking) only ops whose innermost non-torch frame is the
submission's are. An op whose innermost submission frame lies in a *given* function (``given``: cell ->
line ranges and names of functions identical, up to comments and docstrings, to the assignment's given code,
``autograder.given``) carries that name: a3b's given ``attention_forward`` computes its forward in torch on
purpose, and the a3b task that calls it allows it (``Task.audit_given``). The parent decides the verdict
from the findings and the task's allow-list (``Task.audit_allow``); nothing here scores or raises.

Launches are recorded too (``launches``: kernel name, grid, number of float8 tensor arguments) for the
property gates (a split decode launches a grid of ``num_splits`` per kv head; an FP8 forward feeds float8
tiles to its kernel).
"""
from __future__ import annotations

import os
import sys

from .where import place

MAX_FINDINGS = 40

# aten ops (overload packet names) that move or reinterpret data without computing on it
STRUCTURAL = frozenset("""
view _unsafe_view _reshape_alias reshape as_strided expand expand_as permute transpose t squeeze unsqueeze
select slice narrow split split_with_sizes unsafe_split chunk unbind alias detach detach_ lift_fresh
lift_fresh_copy clone contiguous copy_ _to_copy to _copy_from _copy_from_and_resize index index_select gather
cat stack constant_pad_nd flatten unflatten movedim view_as diagonal unfold repeat repeat_interleave
resolve_conj resolve_neg _conj conj set_ requires_grad_ _has_compatible_shallow_copy_type record_stream
_local_scalar_dense_ignored sym_size sym_stride sym_numel sym_storage_offset is_same_size
index_put index_put_ _index_put_impl_ _unsafe_index_put _unsafe_index index_copy index_copy_ index_fill
index_fill_ masked_fill masked_fill_ masked_scatter masked_scatter_ masked_select take take_along_dim flip fliplr
flipud roll rot90 fill_ transpose_ t_ squeeze_ unsqueeze_ as_strided_ swapaxes_ swapdims_ narrow_copy
select_scatter slice_scatter diagonal_scatter as_strided_scatter scatter scatter_ swapaxes swapdims
""".split())
# data movement that adds when asked to: ``index_put_(..., accumulate=True)``, ``scatter_(..., reduce=...)``
ACCUMULATES = {"index_put": 3, "index_put_": 3, "_index_put_impl_": 3, "_unsafe_index_put": 3, "scatter": 4,
               "scatter_": 4}
# ops that make new tensors from nothing but shapes/numbers (their outputs are clean)
ALLOC = frozenset("""
empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones ones_like new_ones
full full_like new_full arange scalar_tensor randn randn_like rand rand_like randint randint_like randperm eye
linspace logspace normal_ uniform_ random_ bernoulli_
""".split())
CLEARS = frozenset({"zero_", "fill_"})
COPIES = frozenset({"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "to"})
# ops whose result is a Python value read from the data
ESCAPE_ATEN = frozenset({"_local_scalar_dense", "equal", "is_nonzero"})
# Python-level tensor methods that hand the data to NumPy/Python
ESCAPE_FUNCS = frozenset({"numpy", "__array__", "tolist", "item", "untyped_storage", "storage", "_typed_storage",
                          "__dlpack__", "__reduce_ex__"})
TEXT_FUNCS = frozenset({"__repr__", "__str__", "__format__"})
WATCHED = ESCAPE_FUNCS | TEXT_FUNCS

_HERE = os.path.abspath(__file__)


class OpAudit:
    """State of one graded call's audit. ``begin(tensors)`` taints the inputs and pushes the modes;
    ``end()`` pops them and returns ``{"findings": [...], "launches": [...], "text": n}``."""

    def __init__(self, given=None):
        self.given = {int(k): [tuple(r) for r in v] for k, v in (given or {}).items()}
        self.on = False
        self.busy = False
        self.launch_depth = 0
        self.text_depth = 0
        self._modes = None
        self._reset()
        import torch
        self._torch = torch
        self._storage = torch._C.TensorBase.untyped_storage      # past the method guards
        self._torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

    def _reset(self):
        self.tainted = set()
        self.findings = {}
        self.launches = []
        self.text_elems = 0
        self.host_elems = 0
        self.input_elems = 0

    # -- storage keys ------------------------------------------------------------------------------------
    def key(self, t):
        try:
            ptr = self._storage(t).data_ptr()
        except Exception:  # noqa: BLE001 -- a tensor without storage carries no data
            return None
        return (t.device.type, t.device.index, ptr) if ptr else None

    def is_tainted(self, t):
        k = self.key(t)
        return k is not None and k in self.tainted

    def set_taint(self, t, on):
        k = self.key(t)
        if k is None:
            return
        if on:
            self.tainted.add(k)
        else:
            self.tainted.discard(k)

    # -- attribution -------------------------------------------------------------------------------------
    def where(self):
        """``(judged, where, given)``: whether the op is the submission's, the innermost submission frame
        ("cell [5], line 12, in f": ``where.place``), and the name of the given function that frame lies in (or None)."""
        f = sys._getframe(1)
        innermost_other = None           # first frame that is neither torch nor this module
        while f is not None:
            fn = f.f_code.co_filename
            if fn.startswith("<cell "):
                direct = innermost_other is None
                if self.launch_depth and not direct:
                    return False, "", None
                try:
                    cell = int(fn[6:-1])
                except ValueError:
                    cell = -1
                line = f.f_lineno
                given = next((name for lo, hi, name in self.given.get(cell, ()) if lo <= line <= hi), None)
                return True, place(fn, line, f.f_code.co_name), given
            if innermost_other is None and not fn.startswith(self._torch_dir) and fn != _HERE:
                innermost_other = fn
            f = f.f_back
        return False, "", None

    def record(self, kind, op, where, n_tainted, given=None):
        k = (kind, op, where)
        if k in self.findings:
            self.findings[k]["count"] += 1
            self.findings[k]["tainted"] = max(self.findings[k]["tainted"], n_tainted)
        elif len(self.findings) < MAX_FINDINGS:
            self.findings[k] = {"kind": kind, "op": op, "where": where, "count": 1, "tainted": n_tainted,
                                "given": given}

    # -- the call ----------------------------------------------------------------------------------------
    def begin(self, inputs):
        from torch.utils._python_dispatch import TorchDispatchMode
        torch = self._torch
        self._reset()
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.set_taint(t, True)
                self.input_elems += t.numel()
        audit = self

        class _Dispatch(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls):
                return False        # no torch._dynamo wrapper: 1.2 s of import per child, and a cost per op

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return audit._dispatch(func, args, kwargs or {})

        _install_method_guards()
        MethodGuards.audit = self
        self._modes = (_Dispatch(),)
        self._modes[0].__enter__()
        self.on = True

    def end(self):
        if self._modes is not None:
            self.on = False
            (dmode,) = self._modes
            self._modes = None
            dmode.__exit__(None, None, None)
            MethodGuards.audit = None
        if self.input_elems and self.text_elems > max(1000, self.input_elems // 2):
            self.record("escape", "repr/str", f"{self.text_elems} elements of input-derived tensors turned "
                                              f"into text ({self.input_elems} input elements)", 0)
        if self.input_elems and self.host_elems > max(1024, self.input_elems // 2):
            self.record("escape", "device-to-host copy", f"{self.host_elems} elements of input-derived GPU "
                                                         f"tensors copied to the host ({self.input_elems} input "
                                                         "elements)", 0)
        return {"findings": list(self.findings.values()), "launches": list(self.launches),
                "text": self.text_elems}

    def _tensors(self, obj, out):
        torch = self._torch
        if isinstance(obj, torch.Tensor):
            out.append(obj)
        elif isinstance(obj, (list, tuple)):
            for o in obj:
                self._tensors(o, out)
        elif isinstance(obj, dict):
            for o in obj.values():
                self._tensors(o, out)
        return out

    def _dispatch(self, func, args, kwargs):
        result = func(*args, **kwargs)
        if not self.on or self.busy or self.text_depth:
            return result
        self.busy = True
        try:
            self._after_op(func, args, kwargs, result)
        finally:
            self.busy = False
        return result

    def _after_op(self, func, args, kwargs, result):
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        ins = self._tensors(args, self._tensors(kwargs, [])) if self.tainted else []
        tainted = [t for t in ins if self.is_tainted(t)]
        inplace = name.endswith("_") or "out" in kwargs
        if not tainted and (inplace or not self.tainted):
            return                               # nothing input-derived in or out: the fast path
        if self.launch_depth and not self.where()[0]:
            return                               # the launcher's own work on its arguments
        outs = self._tensors(result, [])
        if name in ALLOC or (name in CLEARS and not any(isinstance(a, self._torch.Tensor) for a in args[1:])):
            for t in outs:
                self.set_taint(t, False)
            return
        if inplace:                              # a tainted input taints the target
            for t in outs:
                self.set_taint(t, True)
        else:
            for t in outs:
                self.set_taint(t, bool(tainted))
        if not tainted:
            return
        if name in STRUCTURAL and not _accumulates(name, args, kwargs):
            if name in COPIES and any(t.device.type != "cpu" for t in tainted) and \
                    any(t.device.type == "cpu" for t in outs):
                self.host_elems += sum(t.numel() for t in outs if t.device.type == "cpu")
            return
        judged, where, given = self.where()
        if judged:
            self.record("escape" if name in ESCAPE_ATEN else "compute", f"aten.{name}", where, len(tainted), given)

    def method(self, name, orig, this, args, kwargs):
        """A watched tensor method (``MethodGuards``) was called on ``this``: record an escape of input data,
        or count the elements a text conversion reads, then run it (ops inside a text conversion are not
        judged: printing runs reductions)."""
        if not self.on or self.busy or self.text_depth:
            return orig(this, *args, **kwargs)
        self.busy = True
        try:
            tainted = self.is_tainted(this)
            if tainted and name in TEXT_FUNCS:
                from torch._tensor_str import PRINT_OPTS
                n = this.numel()
                self.text_elems += n if n <= PRINT_OPTS.threshold else 0
            elif tainted:
                judged, where, given = self.where()
                if judged:
                    self.record("escape", f"Tensor.{name}", where, 1, given)
        finally:
            self.busy = False
        if name in TEXT_FUNCS:
            self.text_depth += 1
            try:
                return orig(this, *args, **kwargs)
            finally:
                self.text_depth -= 1
        return orig(this, *args, **kwargs)

    # -- Triton launches ---------------------------------------------------------------------------------
    def launch(self, fn, args, kwargs, run):
        """Run one Triton launch (``run()``) with the audit looking away from the launcher's own work;
        record it; taint its tensor arguments when one of them is tainted."""
        torch = self._torch
        busy, self.busy = self.busy, True
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        tensors += [a.base for a in list(args) + list(kwargs.values())
                    if not isinstance(a, torch.Tensor) and isinstance(getattr(a, "base", None), torch.Tensor)]
        self.busy = busy
        self.launch_depth += 1
        try:
            grid = kwargs.get("grid")
            if callable(grid):
                try:
                    meta = dict(zip(getattr(fn, "arg_names", ()), args))
                    meta.update({k: v for k, v in kwargs.items() if k not in ("grid", "warmup")})
                    grid = grid(meta)
                except Exception:  # noqa: BLE001 -- the launch itself will report a broken grid
                    grid = None
            out = run()
        finally:
            self.launch_depth -= 1
        busy, self.busy = self.busy, True
        try:
            self._record_launch(fn, grid, tensors)
        finally:
            self.busy = busy
        return out

    def _record_launch(self, fn, grid, tensors):
        if self.on and len(self.launches) < 200:
            try:
                g = [int(x) for x in grid] if grid is not None else None
            except (TypeError, ValueError):
                g = None
            fp8 = sum(1 for t in tensors if t.dtype.is_floating_point and t.element_size() == 1)
            self.launches.append({"kernel": getattr(fn, "__name__", "?"), "grid": g, "float8_args": fp8})
        if self.on and any(self.is_tainted(t) for t in tensors):
            for t in tensors:                    # integer arguments (lengths, block tables) stay metadata:
                if t.is_floating_point():        # reading float bits back as integers needs a view(dtype),
                    self.set_taint(t, True)      # which the host policy refuses


def _accumulates(name, args, kwargs) -> bool:
    """``index_put_(..., accumulate=True)`` or ``scatter_(..., reduce=...)``: data movement that computes."""
    pos = ACCUMULATES.get(name)
    if pos is None:
        return False
    flag = kwargs.get("accumulate", kwargs.get("reduce"))
    if flag is None and len(args) > pos:
        flag = args[pos]
    return bool(flag)


class MethodGuards:
    """The watched tensor methods, wrapped once per process on ``torch.Tensor`` (cheaper than a torch-function
    mode, which would see every ``.shape`` and ``.stride()``): they report to the current audit, if any."""
    audit = None
    installed = False


def _install_method_guards():
    if MethodGuards.installed:
        return
    import torch
    MethodGuards.installed = True
    for name in sorted(WATCHED):
        orig = getattr(torch.Tensor, name, None)
        if orig is None or isinstance(orig, property):
            continue

        def guard(this, *args, __orig=orig, __name=name, **kwargs):
            audit = MethodGuards.audit
            if audit is None:
                return __orig(this, *args, **kwargs)
            return audit.method(__name, __orig, this, args, kwargs)
        guard.__name__ = name
        guard.__doc__ = getattr(orig, "__doc__", None)
        setattr(torch.Tensor, name, guard)


class LaunchHook:
    """Wraps every Triton launch once per process (compiled ``JITFunction.run``, the interpreter's
    ``InterpretedFunction.run``; the autotuner's and heuristics' ``run`` count as inside a launch too):
    ``count`` is called per kernel launch (not for warm-up compiles), and the current ``audit`` (if any)
    sees the launch through ``OpAudit.launch``."""

    audit = None
    count = None
    installed = False
    dry = False          # tests only (tests/test_no_false_accusation.py): record launches, run no kernel

    @classmethod
    def install(cls):
        if cls.installed:
            return
        cls.installed = True
        kernels, wrappers = [], []
        try:
            from triton.runtime.jit import JITFunction
            kernels.append(JITFunction)
        except ImportError:
            pass
        try:
            from triton.runtime.interpreter import InterpretedFunction
            kernels.append(InterpretedFunction)
        except ImportError:
            pass
        try:
            from triton.runtime.autotuner import Autotuner, Heuristics
            wrappers += [Autotuner, Heuristics]
        except ImportError:
            pass
        for klass in kernels:
            orig = klass.run

            def run(self, *args, __orig=orig, **kwargs):
                if kwargs.get("warmup", False):
                    return __orig(self, *args, **kwargs)
                if cls.count is not None:
                    cls.count()
                audit = cls.audit
                go = (lambda: None) if cls.dry else (lambda: __orig(self, *args, **kwargs))
                if audit is None:
                    return go()
                return audit.launch(self, args, kwargs, go)
            klass.run = run
        for klass in wrappers:
            orig = klass.run

            def run_outer(self, *args, __orig=orig, **kwargs):
                audit = cls.audit
                if audit is None:
                    return __orig(self, *args, **kwargs)
                audit.launch_depth += 1
                try:
                    return __orig(self, *args, **kwargs)
                finally:
                    audit.launch_depth -= 1
            klass.run = run_outer
