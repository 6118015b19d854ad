"""Bounds-checked loads and stores in Triton's interpreter (docs/design.md §6, T17/T20: a crash is a failed test
with a diagnosis, never a flag).

On a GPU a ``tl.store`` past a tensor's end is an illegal address; in the interpreter it is a raw ``memcpy`` to
wherever the pointer lands. What happens next is luck: a segmentation fault, a process that hangs on a corrupted
allocator lock, or nothing at all (the store hit memory the process owns, and the answer still compares equal).
The grader cannot diagnose luck, so while it runs a submission in the interpreter every masked-in lane of every
load, store and atomic is checked against the memory of the tensors passed to that launch (their whole storages,
so views and strided access are fine). A lane outside all of them raises ``OutOfBoundsAccess`` before any byte
moves, naming the kernel, the access and the nearest argument.

Installed once per process by the grading child and ``check()``'s worker (``install``), before the traps take
their snapshot, so it is part of the baseline, not a patch of the submission's.
"""
from __future__ import annotations

import numpy as np

MASK_HINT = "is a tl.load/tl.store missing its mask for the last, partial tile (e.g. `mask=offs < n`)?"
#: an address nowhere near any tensor: not a tile running over an edge
FAR_HINT = ("is a base offset or a stride wrong (an index in the wrong units, or from the wrong tensor)? Every "
            "address a kernel touches must lie inside a tensor it was passed")


class OutOfBoundsAccess(IndexError):
    """A load, store or atomic whose address lies outside every tensor argument of the running launch."""


class _Launch:
    """The storages of the launch in progress: sorted starts, ends, argument names, the kernel's name."""
    kernel = "a Triton kernel"
    starts = np.zeros(0, dtype=np.uint64)
    ends = np.zeros(0, dtype=np.uint64)
    names: list[str] = []


def _tensors(name, arg, out):
    if isinstance(arg, (tuple, list)):
        for i, a in enumerate(arg):
            _tensors(f"{name}[{i}]", a, out)
    elif hasattr(arg, "untyped_storage"):
        s = arg.untyped_storage()
        if s.nbytes():
            out.append((int(s.data_ptr()), int(s.data_ptr()) + int(s.nbytes()), name))
    elif hasattr(arg, "base") and hasattr(arg, "block_shape"):          # a host-side TensorDescriptor
        _tensors(name, arg.base, out)


def _begin(fn, arg_names, args_hst, kwargs_hst):
    found = []
    for name, arg in zip(arg_names, args_hst):
        _tensors(name, arg, found)
    for name, arg in kwargs_hst.items():
        _tensors(name, arg, found)
    found.sort()
    _Launch.kernel = f"`{getattr(fn, '__name__', 'a Triton kernel')}`"
    _Launch.starts = np.array([f[0] for f in found], dtype=np.uint64)
    _Launch.ends = np.array([f[1] for f in found], dtype=np.uint64)
    _Launch.names = [f[2] for f in found]


def _nearest(addr: int, elem: int):
    """``(elements, "past the end of" | "before the start of", name, bytes of that tensor)`` for the argument
    nearest to ``addr``, or None when the launch has no tensor argument."""
    best = None
    for s, e, n in zip(_Launch.starts.tolist(), _Launch.ends.tolist(), _Launch.names):
        gap, where = (addr - e + elem, "past the end of") if addr >= e else (s - addr, "before the start of")
        if best is None or gap < best[0]:
            best = (gap, where, n, e - s)
    if best is None:
        return None
    gap, where, n, nbytes = best
    return -(-gap // elem), where, n, nbytes // elem


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def check(ptrs, mask, what: str) -> None:
    """Raise ``OutOfBoundsAccess`` if a lane of ``ptrs`` (a ``TensorHandle`` of addresses) where ``mask`` holds
    is outside every storage of the launch. ``what`` names the access ("tl.store")."""
    addr = np.asarray(ptrs.data, dtype=np.uint64)
    if mask is not None:
        m = np.broadcast_to(np.asarray(mask.data, dtype=bool), addr.shape)
        addr = addr[m]
    addr = addr.reshape(-1)
    if addr.size == 0:
        return
    ty = ptrs.get_element_ty()
    elem = max(1, int(getattr(ty, "primitive_bitwidth", 8)) // 8)
    idx = np.searchsorted(_Launch.starts, addr, side="right").astype(np.int64) - 1
    ok = idx >= 0
    ends = _Launch.ends[np.clip(idx, 0, None)] if len(_Launch.ends) else np.zeros_like(addr)
    ok &= addr + np.uint64(elem) <= ends
    if ok.all():
        return
    bad = addr[~ok]
    first = int(bad.min())
    verb = "read" if what == "tl.load" else "wrote" if what == "tl.store" else "touched"
    head = f"{what} in {_Launch.kernel} {verb} {_plural(bad.size, 'element')} outside every tensor passed to the kernel"
    near = _nearest(first, elem)
    if near is None:
        raise OutOfBoundsAccess(f"{head} (it has no tensor argument): {FAR_HINT}")
    gap, where, name, size = near
    if gap <= size:      # within a tensor's length of its edge: a tile running over the end (or start)
        raise OutOfBoundsAccess(f"{head} (the first {_plural(gap, 'element')} {where} `{name}`): {MASK_HINT}")
    raise OutOfBoundsAccess(f"{head} (the first lands {gap:.2g} elements from the nearest of them, far more than "
                            f"a tile): {FAR_HINT}")


_SAVED: dict = {}


def install() -> None:
    """Wrap the interpreter's launch and memory operations once per process (a no-op if Triton's interpreter is
    not importable). ``uninstall`` puts the originals back (tests)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    if _SAVED:
        return
    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    init_args = executor._init_args_hst
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas
    _SAVED.update({(executor, "_init_args_hst"): init_args, (builder, "create_masked_load"): load,
                   (builder, "create_masked_store"): store, (builder, "create_atomic_rmw"): rmw,
                   (builder, "create_atomic_cas"): cas})

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        _begin(self.fn, self.arg_names, args_hst, kwargs_hst)
        return args_hst, kwargs_hst

    def create_masked_load(self, ptrs, mask, other, *a, **k):
        check(ptrs, mask, "tl.load")
        return load(self, ptrs, mask, other, *a, **k)

    def create_masked_store(self, ptrs, value, mask, *a, **k):
        check(ptrs, mask, "tl.store")
        return store(self, ptrs, value, mask, *a, **k)

    def create_atomic_rmw(self, op, ptr, val, mask, *a, **k):
        check(ptr, mask, "an atomic")
        return rmw(self, op, ptr, val, mask, *a, **k)

    def create_atomic_cas(self, ptr, cmp, val, *a, **k):
        check(ptr, None, "tl.atomic_cas")
        return cas(self, ptr, cmp, val, *a, **k)

    executor._init_args_hst = _init_args_hst
    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    builder.create_atomic_rmw, builder.create_atomic_cas = create_atomic_rmw, create_atomic_cas


def uninstall() -> None:
    """Put the interpreter's own launch and memory operations back."""
    for (klass, name), fn in _SAVED.items():
        setattr(klass, name, fn)
    _SAVED.clear()
