"""What the GPU allows a kernel, and kernel configurations chosen from it (any CUDA GPU from sm_75 up).

The configurations of ``reference.triton`` were tuned on an H100/H200 (227 KB of shared memory per block,
compute capability 9.0). A Colab T4 (sm_75) has 64 KB and no bfloat16; an A10, L4 or RTX 30xx/40xx (sm_86,
sm_89) has 99 KB; an A100 (sm_80) 163 KB. Every module that picks tile sizes asks this one module:

* ``device_limits(device) -> DeviceLimits`` (capability, opt-in shared memory per block, name), read once per
  device from Triton's driver (``max_shared_mem``, the number Triton itself checks a compiled kernel against),
  else from ``torch.cuda.get_device_properties``. Under the interpreter (CPU tensors) it returns ``INTERPRETER``:
  an H100's numbers, so the CPU runs choose exactly what an H100 chooses.
* ``smem_*``: estimated shared memory of a configuration of one kernel family (pure functions of the config,
  the head dimension, the element size and the limits): tiles x pipeline buffers x bytes. Triton pipelines
  loads with ``cp.async``/TMA only from sm_80 on (``make_ttgir`` in Triton 3.6), keeping ``num_stages - 1``
  tiles of each pipelined load in flight; below sm_80 every load is a single buffer whatever ``num_stages``.
* ``fits(need, limits)`` and ``pick_config(candidates, need, limits)``: the first candidate that fits in
  ``usable_smem`` (7/8 of the opt-in amount: headroom for Triton's own scratch -- reductions, layout
  conversions; on an H100 that is the 200 KB the forward always used), within 1024 threads, and not Hopper-only
  below sm_90.

Hopper-only paths (tensor descriptors/TMA, the Gluon kernels, FP8 tensor-core matmuls) ask ``hopper(limits)``.
bfloat16 needs sm_80 (``has_bf16``): ``check_bf16`` raises a ``TypeError`` naming the dtype and the device.

It also decides, before any kernel is defined, whether kernels are compiled for a GPU or run in Triton's
interpreter (``INTERPRET``, ``DEVICE``, ``COMPILE_ONLY``: the decision ``reference.triton._runtime`` names): the
root of the package's imports, so every module that asks about the device has made that decision first.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable, NamedTuple, Sequence

import torch


# ---------------------------------------------------------------------------------------------------------------
# compiled or interpreted (Triton reads TRITON_INTERPRET when a kernel is defined)
# ---------------------------------------------------------------------------------------------------------------
_ENV = "TRITON_INTERPRET"

HAS_CUDA: bool = bool(torch.cuda.is_available())

#: ``TRITON_INTERPRET=0`` set explicitly on a machine without CUDA: compile-only mode. Nothing can be launched,
#: but kernels compile ahead of time for a GPU target (``reference.triton.hopper._aot``: the Gluon kernels for sm_90a).
COMPILE_ONLY: bool = not HAS_CUDA and os.environ.get(_ENV) == "0"

if os.environ.get(_ENV, "0") == "1":
    INTERPRET = True
elif COMPILE_ONLY:
    INTERPRET = False
elif not HAS_CUDA:
    os.environ[_ENV] = "1"
    INTERPRET = True
    print("reference.triton: no CUDA device found; kernels run in the Triton interpreter "
          "(TRITON_INTERPRET=1, CPU tensors, slow: use small shapes)", file=sys.stderr)
else:
    INTERPRET = False


def _fix_interpreter_range() -> None:
    """Let the interpreter take a run-time value as a ``range()`` bound under NumPy >= 2.4.

    Triton 3.6's interpreter converts a loop bound with ``int(self.handle.data)``, and ``int()`` of a
    one-element 1-d array is an error since NumPy 2.4 ("only 0-dimensional arrays can be converted to Python
    scalars"). Re-registering that one conversion with ``.reshape(-1)[0]`` lets the kernels keep the plain
    ``for ... in range(lo, hi, BLOCK)`` loops that the GPU compiler software-pipelines, so the interpreter
    runs exactly the code the GPU runs. Applied only when interpreting and only if NumPy has the problem.
    """
    import numpy as np
    try:
        int(np.ones(1))
        return  # older NumPy: nothing to fix
    except TypeError:
        pass
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - no Triton installed
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(interpreter, "_course_range_fix", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    interpreter._course_range_fix = True


if INTERPRET:
    _fix_interpreter_range()

#: ``triton.backends.compiler.GPUTarget`` arguments of an H100/H200 (sm_90a): ahead-of-time compiles target it
SM90_TARGET = ("cuda", 90, 32)

# Tensors handed to kernels must live here.
DEVICE = torch.device("cpu") if INTERPRET or COMPILE_ONLY else torch.device("cuda")


def num_sms() -> int:
    """Streaming multiprocessors of the current device (a nominal 132, an H100's, under the interpreter)."""
    if INTERPRET:
        return 132
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


class DeviceLimits(NamedTuple):
    capability: tuple           # (major, minor)
    smem: int                   # bytes of shared memory one block may opt in to
    name: str = ""
    max_threads: int = 1024     # threads per block (every CUDA GPU from sm_75 on)

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def usable_smem(self) -> int:
        return self.smem * 7 // 8

    def describe(self) -> str:
        return f"{self.name or 'this GPU'} ({self.sm}, {self.smem // 1024} KB shared memory per block)"


#: what the interpreter (and ahead-of-time compilation for sm_90a) is treated as: an H100
INTERPRETER = DeviceLimits((9, 0), 232448, "Triton interpreter (configs as on an H100)")
#: reference points (opt-in shared memory per block, CUDA programming guide, "Compute capabilities" table)
KNOWN = {
    "T4": DeviceLimits((7, 5), 64 * 1024, "Tesla T4"),
    "A100": DeviceLimits((8, 0), 163 * 1024, "A100"),
    "A10": DeviceLimits((8, 6), 99 * 1024, "A10"),  # and the RTX 30xx
    "L4": DeviceLimits((8, 9), 99 * 1024, "L4"),    # and the RTX 40xx
    "H100": DeviceLimits((9, 0), 227 * 1024, "H100"),
}


def _query(index: int) -> DeviceLimits:
    """Ask the driver about CUDA device ``index`` (the one place that does; tests replace it)."""
    smem = 0
    try:
        from triton.runtime import driver
        smem = int(driver.active.utils.get_device_properties(index)["max_shared_mem"])
    except Exception:  # noqa: BLE001 -- no Triton driver: ask torch
        props = torch.cuda.get_device_properties(index)
        smem = int(getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0))
    major, minor = torch.cuda.get_device_capability(index)
    return DeviceLimits((int(major), int(minor)), smem or 48 * 1024, torch.cuda.get_device_name(index))


@functools.lru_cache(maxsize=None)
def _limits(index: int) -> DeviceLimits:
    return _query(index)


def device_limits(device=None) -> DeviceLimits:
    """``DeviceLimits`` of ``device`` (a ``torch.device``, a tensor, an index or None = the current device)."""
    if isinstance(device, torch.Tensor):
        device = device.device
    if isinstance(device, int):
        return _limits(device)
    if device is None:
        if INTERPRET or COMPILE_ONLY:
            return INTERPRETER
        return _limits(torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        return INTERPRETER
    return _limits(device.index if device.index is not None else torch.cuda.current_device())


def clear_cache() -> None:
    _limits.cache_clear()


# ---------------------------------------------------------------------------------------------------------------
# what a configuration needs
# ---------------------------------------------------------------------------------------------------------------
class Need(NamedTuple):
    smem: int                  # estimated bytes of shared memory
    num_warps: int = 4
    hopper: bool = False       # uses TMA / wgmma / FP8 tensor cores: sm_90 only


def pipelines(limits: DeviceLimits) -> bool:
    """Triton software-pipelines loads (``num_stages``) from sm_80 on."""
    return tuple(limits.capability) >= (8, 0)


def hopper(limits: DeviceLimits) -> bool:
    return tuple(limits.capability) >= (9, 0)


def tma_device(device, limits: DeviceLimits | None = None) -> bool:
    """Tensor descriptors (TMA) may be used on ``device``: a CUDA device of a Hopper GPU (sm_90+; ``limits``, by
    default ``device_limits(device)``), compiled (not the interpreter). Each kernel family adds what its descriptors need of the tensors' layout (``flash_fwd.tma_ok``,
    ``decode.tma_ok``, ``cascade``, ``mixed``)."""
    return not INTERPRET and device.type == "cuda" and hopper(device_limits(device) if limits is None else limits)


def has_bf16(limits: DeviceLimits) -> bool:
    """bfloat16 tensor-core matmuls (and Triton's bf16 ``tl.dot``) need sm_80 (Ampere) or newer."""
    return tuple(limits.capability) >= (8, 0)


def buffers(num_stages: int, limits: DeviceLimits) -> int:
    """Tiles of one pipelined load held in shared memory at once."""
    return max(int(num_stages) - 1, 1) if pipelines(limits) else 1


def smem_forward(block_m: int, block_n: int, num_stages: int, d: int, es: int, limits: DeviceLimits) -> int:
    """FlashAttention forward (and the persistent forward, paged prefill): a Q tile and pipelined K, V tiles."""
    return (block_m * d + 2 * buffers(num_stages, limits) * block_n * d) * es


def smem_backward(block_m: int, block_n: int, num_stages: int, d: int, es: int, limits: DeviceLimits) -> int:
    """dK/dV and dQ kernels: the loop's two pipelined tiles (Q, dO or K, V) plus the owned pair, as tiles of
    ``(block_m + block_n) x d``, twice (the operands of the transposed products)."""
    return (block_m + block_n) * d * es * 2 * buffers(num_stages, limits)


def smem_decode(block_n: int, num_stages: int, d: int, es: int, limits: DeviceLimits, block_m: int = 16) -> int:
    """Split-KV decode stage 1: the (padded) query group tile and pipelined K, V tiles."""
    return smem_forward(block_m, block_n, num_stages, d, es, limits)


def smem_softmax(block_r: int, block_c: int, num_warps: int) -> int:
    """Fused softmax: rows live in registers; shared memory holds the partial maxima/sums (fp32) of the warps
    that share a row (none when one warp holds a whole row; the two reductions reuse one buffer)."""
    warps_per_row = min(num_warps, max(1, block_c // 32))
    return 0 if warps_per_row == 1 else block_r * warps_per_row * 4


def fits(need: Need, limits: DeviceLimits) -> bool:
    return (need.smem <= limits.usable_smem and need.num_warps * 32 <= limits.max_threads
            and (not need.hopper or hopper(limits)))


def pick_config(candidates: Sequence, need: Callable[[object], Need], limits: DeviceLimits):
    """The first of ``candidates`` whose ``need(candidate)`` fits ``limits``; if none does, the one needing the
    least shared memory (Triton then reports the overflow when it compiles)."""
    candidates = list(candidates)
    for c in candidates:
        if fits(need(c), limits):
            return c
    return min(candidates, key=lambda c: need(c).smem)


def stage_ladder(cfg: dict, n_key: str, stages_key: str = "num_stages", min_n: int = 16) -> list:
    """``cfg``, then the same with fewer pipeline stages (down to 2), then with the ``n_key`` block halved
    (2 stages, then 1) down to ``min_n``: the fallbacks of a fixed configuration, best first."""
    out = [dict(cfg)]
    for s in range(int(cfg[stages_key]) - 1, 1, -1):
        out.append(dict(cfg, **{stages_key: s}))
    n = int(cfg[n_key])
    while n > min_n:
        n //= 2
        out.append(dict(cfg, **{n_key: n, stages_key: min(2, int(cfg[stages_key]))}))
    out.append(dict(cfg, **{n_key: min_n, stages_key: 1}))
    return out


# ---------------------------------------------------------------------------------------------------------------
# bfloat16
# ---------------------------------------------------------------------------------------------------------------
def bf16_error(name: str, limits: DeviceLimits) -> str:
    return (f"{name} is torch.bfloat16, which needs a GPU of compute capability >= 8.0 (sm_80, Ampere) for "
            f"bfloat16 tensor-core matmuls; {limits.describe()} has none: pass float16 instead "
            f"({name}.half(); note float16's smaller range, max 65504)")


def check_bf16(x: torch.Tensor, name: str) -> None:
    """Raise ``TypeError`` if ``x`` is bfloat16 on a CUDA device older than sm_80 (the reference API's choice:
    an error, not a silent float16 computation whose range differs)."""
    if x.dtype == torch.bfloat16 and x.device.type == "cuda":
        limits = device_limits(x.device)
        if not has_bf16(limits):
            raise TypeError(bf16_error(name, limits))


__all__ = ["DeviceLimits", "Need", "device_limits", "fits", "pick_config", "has_bf16", "hopper", "check_bf16",
           "smem_forward", "smem_backward", "smem_decode", "smem_softmax", "stage_ladder", "INTERPRETER", "KNOWN"]
