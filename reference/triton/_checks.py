"""Input checks shared by the Triton wrappers (docs/design.md §3), run BEFORE any kernel launch.

A kernel launched on bad input either crashes the process (illegal address) or silently reads garbage, so every
public wrapper in ``reference.triton`` validates first and raises ``TypeError`` (wrong type or dtype) or
``ValueError`` (wrong rank, shape, device or value) with a message that names the argument and what was
expected. Nothing is broadcast.
"""
from __future__ import annotations

import torch

# the checks every part shares; re-exported so the Triton modules import their checks from one place
from .._args import check_dtype, check_flag, check_gqa, check_positive_int, check_scale  # noqa: F401
from ._device import check_bf16
from ._runtime import DEVICE, INTERPRET

#: dtypes the attention/softmax kernels accept (fp32 runs its dots in TF32 on a GPU; see notes).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: head dimensions the attention kernels are compiled for (a power of two: tl.arange needs one).
HEAD_DIMS = (16, 32, 64, 128)
INT_DTYPES = (torch.int32, torch.int64)


def check_device(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` must live on ``reference.triton.DEVICE`` (CUDA on a GPU machine, CPU under the interpreter)."""
    if x.device.type != DEVICE.type:
        where = "the Triton interpreter runs on CPU tensors" if INTERPRET else "kernels run on the GPU"
        raise ValueError(f"{name} must be on device '{DEVICE.type}' ({where}), got a tensor on '{x.device}'; "
                         f"move it with {name}.to(reference.triton.DEVICE)")
    return x


def check_tensor(x, name: str, ndim: int | None = None, dtypes=FLOAT_DTYPES, device: bool = True) -> torch.Tensor:
    """``x`` is a ``torch.Tensor`` with a dtype in ``dtypes``, rank ``ndim`` (if given), on ``DEVICE``; bfloat16
    on a GPU older than sm_80 raises ``TypeError`` (``_device.check_bf16``: no bf16 tensor cores there)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dtypes is not None:
        check_dtype(x.dtype, dtypes, name)
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if device:
        check_device(x, name)
        check_bf16(x, name)
    return x


def check_head_dim(d: int, name: str = "head dimension d", supported=HEAD_DIMS) -> int:
    """``d`` must be one of the head dimensions the kernels are compiled for."""
    if d not in supported:
        raise ValueError(f"{name} must be one of {tuple(supported)}, got {d}")
    return d


def check_same_dtype(**tensors: torch.Tensor) -> torch.dtype:
    """All named tensors share one dtype (the kernels do not mix input precisions)."""
    items = list(tensors.items())
    dt = items[0][1].dtype
    if any(t.dtype != dt for _, t in items):
        desc = ", ".join(f"{n} {t.dtype}" for n, t in items)
        raise TypeError(f"{', '.join(n for n, _ in items)} must have the same dtype, got {desc}")
    return dt


def check_attention_inputs(q, k, v, head_dims=HEAD_DIMS):
    """Validate ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)``; return ``(B, Hq, Hkv, Nq, Nk, d, group)``.

    Checks (docs/design.md §3): torch tensors of one float dtype on ``DEVICE``, rank 4, ``k.shape == v.shape``,
    same batch and ``d``, ``Hq % Hkv == 0`` (GQA: query head ``h`` reads kv head ``h // group``), ``Nq, Nk >= 1``, and
    ``d`` in ``head_dims``.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(x, name, ndim=4)
    check_same_dtype(q=q, k=k, v=v)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape (B, Hkv, Nk, d), got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)}")
    B, Hq, Nq, d = q.shape
    Bk, Hkv, Nk, dk = k.shape
    if Bk != B:
        raise ValueError(f"q and k must have the same batch size, got q {tuple(q.shape)} and k {tuple(k.shape)}; "
                         "nothing is broadcast")
    if dk != d:
        raise ValueError(f"q and k must have the same head dimension d, got q d={d} and k d={dk}")
    group = check_gqa(Hq, Hkv)
    if B == 0 or Hq == 0 or Nq == 0 or Nk == 0:
        raise ValueError(f"q and k need B, H, N >= 1, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    check_head_dim(d, "head dimension d (q.shape[-1])", head_dims)
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k and v must be on the same device, got {q.device}, {k.device}, {v.device}")
    return B, Hq, Hkv, Nq, Nk, d, group


def check_backward_inputs(q, o, lse, do) -> None:
    """The backward's extra inputs: ``o`` and ``do`` of ``q``'s shape and dtype, ``lse`` float32 ``(B, Hq, Nq)``."""
    for name, t in (("o", o), ("do", do)):
        check_tensor(t, name, ndim=4)
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
    check_same_dtype(q=q, o=o, do=do)
    check_tensor(lse, "lse", ndim=3, dtypes=(torch.float32,))
    if lse.shape != q.shape[:3]:
        raise ValueError(f"lse must have shape (B, Hq, Nq) = {tuple(q.shape[:3])}, got {tuple(lse.shape)}")
