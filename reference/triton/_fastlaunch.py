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

Nothing is recorded under the interpreter or while a CUDA graph is being captured.
"""
from __future__ import annotations

import torch

from ._runtime import INTERPRET


def tensor_key(t):
    """What of a tensor argument fixes a compiled kernel's specialization (plus where it lives)."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def stream_key(device) -> int:
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


class RecordedLaunch:
    """One launch of a compiled kernel with a fixed grid and argument list; ``names`` slots are per call."""

    __slots__ = ("kernel", "run", "grid", "args", "slots")

    def __init__(self, kernel, grid, args, slots):
        self.kernel, self.run, self.grid, self.args, self.slots = kernel, kernel.run, grid, args, slots

    def __call__(self, tensors: dict, stream: int | None = None) -> None:
        """Launch on ``tensors`` (slot name -> argument), on the current stream or the stream handle ``stream``."""
        from triton import knobs
        args = list(self.args)
        for name, i in self.slots.items():
            args[i] = tensors[name]
        if stream is None:
            stream = torch.cuda.current_stream().cuda_stream
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        meta = self.kernel.launch_metadata(self.grid, stream, *args) if enter is not None else None
        g = self.grid
        self.run(g[0], g[1], g[2], stream, self.kernel.function, self.kernel.packed_metadata, meta, enter, leave,
                 *args)


def launch_and_record(jit_fn, grid, args, kwargs, slot_names):
    """Launch ``jit_fn[grid](*args, **kwargs)``; return a :class:`RecordedLaunch` that repeats it (``None``
    under the interpreter, during CUDA-graph capture, or if Triton returned no compiled kernel)."""
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
    return RecordedLaunch(compiled, grid, full, {n: names.index(n) for n in slot_names})


class LaunchCache(dict):
    """``key -> [RecordedLaunch, ...]`` with a size bound (a serving loop sees a handful of shapes)."""

    def __init__(self, limit: int = 256):
        super().__init__()
        self.limit = limit

    def put(self, key, value) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
