"""Cheaper eager launches for a kernel called again and again with the same shapes (one decode step per token).

Triton's launch path (``JITFunction.run``) binds every argument, works out its specialization (dtype,
16-byte alignment, integers equal to 1 or divisible by 16), builds a cache key and looks the compiled kernel
up, on every call: tens of microseconds of Python for a kernel with ~40 arguments, as long as the kernel
itself at batch 1 (measured in ``benchmarks/course/bench_decode.py``'s host-overhead table). A wrapper that knows
which of its inputs decide all of that can do the lookup itself, once per key:

* the wrapper computes a key from everything that fixes the specialization (each tensor's shape, strides,
  dtype, device and 16-byte alignment, the integer options, the module configuration, the CUDA stream);
* the first call with a key launches through Triton as usual and records the compiled kernel, the grid and
  the full argument list (:func:`launch_and_record`);
* later calls with the same key substitute their tensors into that list and call the compiled kernel's
  launcher directly (:class:`RecordedLaunch`). Launch hooks (profilers) are still called.

What a repeat costs on the host beyond the driver's launch (``benchmarks/tuning/profile_cascade_host.py``):
Triton's launcher turns every tensor argument into an address by calling its ``data_ptr()`` and then
``cuPointerGetAttribute`` (a driver call that checks the address is device memory), and Triton 3.6 builds a
launch-metadata object and calls the (empty) launch-hook chains on every launch. A recorded launch passes
addresses instead: the recorded scratch tensors' once, at recording; each call's tensors from ``data_ptr()``
(their device was checked by the key); and it skips the metadata and hooks while no hook is installed.

Nothing is recorded under the interpreter or while a CUDA graph is being captured.
"""
from __future__ import annotations

import functools

import torch
from triton import knobs

from ._device import INTERPRET


@functools.cache
def _raw_stream():
    """Triton's own ``get_current_stream(device index)``: the raw handle of a device's current stream, without
    building a ``torch.cuda.Stream`` (``torch.cuda.current_stream`` costs ~9 us of host time on an H100 machine,
    this ~0.2 us; ``profile_cascade_host``)."""
    from triton.runtime import driver
    return driver.active.get_current_stream


def tensor_key(t):
    """What of a tensor argument fixes a compiled kernel's specialization (plus where it lives)."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def stream_key(device) -> int:
    """The handle of ``device``'s current CUDA stream (0 off CUDA)."""
    if device.type != "cuda":
        return 0
    if device.index is None:
        return torch.cuda.current_stream(device).cuda_stream
    return _raw_stream()(device.index)


class TicketCounters:
    """Zeroed int32 ticket counters of a kernel that merges its splits in-kernel (the last program of a group to
    take a ticket merges), at least ``minimum`` of them.

    Each launch's last program of a group resets its counter, so one zeroed buffer is reused and no memset is
    launched per call. A buffer is kept per (device, CUDA stream): launches on one stream run one after the other
    and so never share tickets, while launches running concurrently on different streams get different buffers.
    Each kernel family owns one (``decode``, ``cascade``, ``mixed``).
    """

    def __init__(self, minimum: int):
        self.minimum = minimum
        self._buffers: dict = {}

    def buffer(self, device, n: int) -> torch.Tensor:
        """``n`` (or more) zeroed counters on ``device`` for its current stream."""
        key = (device.type, device.index, stream_key(device))
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < n:
            buf = self._buffers[key] = torch.zeros(max(n, self.minimum), dtype=torch.int32, device=device)
        return buf

    def items(self):
        """``((device type, index, stream), buffer)`` pairs (the tests check every buffer is back at zero)."""
        return self._buffers.items()


def stream_handle(index: int) -> int:
    """The handle of CUDA device ``index``'s current stream (``stream_key`` for a tensor's ``get_device()``)."""
    return _raw_stream()(index)


def current_stream() -> int:
    """The handle of the current device's current CUDA stream."""
    return _raw_stream()(torch.cuda.current_device())


def _no_hooks(enter, leave) -> bool:
    """No launch hook is installed (Triton 3.6 keeps an empty ``HookChain`` there; older versions None)."""
    return ((enter is None or (type(enter) is knobs.HookChain and not enter.calls))
            and (leave is None or (type(leave) is knobs.HookChain and not leave.calls)))


def _direct_launch(run):
    """The compiled launcher's C entry point where calling it straight is what ``run(...)`` would do (no scratch
    memory to allocate per launch), else None."""
    launch = getattr(run, "launch", None)
    if (launch is None or getattr(run, "global_scratch_size", 1) != 0 or getattr(run, "profile_scratch_size", 1) != 0
            or not hasattr(run, "launch_cooperative_grid") or not hasattr(run, "launch_pdl")):
        return None
    return launch


class RecordedLaunch:
    """One launch of a compiled kernel with a fixed grid and argument list; ``slots`` (name -> index) are per call.

    ``ptr_args`` is the argument list with every recorded tensor as its device address; ``slot_index`` the
    slots' indices in ``slot_names`` order (``launch``)."""

    __slots__ = ("kernel", "run", "grid", "args", "slots", "slot_index", "ptr_args", "direct", "head")

    def __init__(self, kernel, grid, args, slots, drop_slots: bool = False):
        self.kernel, self.run, self.grid, self.slots = kernel, kernel.run, grid, slots
        self.slot_index = tuple(slots.values())
        # ``drop_slots``: every call fills the slots, so the recorded call's slot arguments can be dropped and the
        # cache holds no reference to its tensors (a recorded training step must not keep its first q, k, v alive)
        self.args = [None if drop_slots and i in self.slot_index else a for i, a in enumerate(args)]
        self.ptr_args = [a.data_ptr() if type(a) is torch.Tensor else a for a in self.args]
        self.direct = _direct_launch(self.run)
        if self.direct is not None:  # the launcher's fixed leading arguments, hooks and metadata left out
            self.head = (grid[0], grid[1], grid[2], 0, kernel.function, self.run.launch_cooperative_grid,
                         self.run.launch_pdl, None, None, kernel.packed_metadata, None, None, None)
        else:
            self.head = None

    def __call__(self, tensors: dict, stream: int | None = None) -> None:
        """Launch on ``tensors`` (slot name -> argument), on the current stream or the stream handle ``stream``."""
        slots = self.slots
        self.launch([tensors[n] for n in slots], stream)

    def launch(self, values, stream: int | None = None, addresses=None) -> None:
        """Launch with ``values`` in the slots (in ``slot_names`` order): tensors, or ints (device addresses of
        tensors on the recorded device), on the current stream or the stream handle ``stream``. ``addresses``:
        the same arguments with every tensor as its ``data_ptr()``, where the caller has them already."""
        if stream is None:
            stream = current_stream()
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if _no_hooks(enter, leave):  # addresses only: no data_ptr() / cuPointerGetAttribute in the launcher
            args = list(self.ptr_args)
            if addresses is None:
                addresses = [x.data_ptr() if type(x) is torch.Tensor else x for x in values]
            for i, x in zip(self.slot_index, addresses):
                args[i] = x
            if self.direct is not None:
                head = self.head
                self.direct(head[0], head[1], head[2], stream, *head[4:], *args)
                return
            meta, enter, leave = None, None, None
        else:  # a profiler's hooks see the tensors, as on Triton's own launch path
            args = list(self.args)
            for i, x in zip(self.slot_index, values):
                args[i] = x
            meta = self.kernel.launch_metadata(self.grid, stream, *args)
        g = self.grid
        self.run(g[0], g[1], g[2], stream, self.kernel.function, self.kernel.packed_metadata, meta, enter, leave,
                 *args)


class DescArg:
    """A TMA descriptor argument of a recorded launch: what Triton 3.6's launcher reads of a ``TensorDescriptor``
    (``make_tensordesc_arg``: the base tensor, shape, strides, padding). Building a ``TensorDescriptor`` validates
    it and builds its shared-memory layout, about 10 us of host time each, which the first (recorded) call of a key
    has done already; the block shape and layout are part of the compiled kernel."""

    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, x2d: torch.Tensor):
        self.base, self.shape, self.strides, self.padding = x2d, list(x2d.shape), list(x2d.stride()), "zero"


def launch_and_record(jit_fn, grid, args, kwargs, slot_names, drop_slots: bool = False):
    """Launch ``jit_fn[grid](*args, **kwargs)``; return a :class:`RecordedLaunch` that repeats it (``None``
    under the interpreter, during CUDA-graph capture, or if Triton returned no compiled kernel); ``drop_slots``:
    keep no reference to this call's slot arguments."""
    compiled = jit_fn[grid](*args, **kwargs)
    if INTERPRET or compiled is None or not hasattr(compiled, "packed_metadata"):
        return None
    if torch.cuda.is_current_stream_capturing():
        return None
    names = [p.name for p in jit_fn.params]
    bound = jit_fn.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    full = [bound.arguments[n] for n in names]
    grid = tuple(grid) + (1,) * (3 - len(grid))
    return RecordedLaunch(compiled, grid, full, {n: names.index(n) for n in slot_names}, drop_slots)


class LaunchCache(dict):
    """``key -> [RecordedLaunch, ...]`` with a size bound (a serving loop sees a handful of shapes)."""

    def __init__(self, limit: int = 256):
        super().__init__()
        self.limit = limit

    def put(self, key, value) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
