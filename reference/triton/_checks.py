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
from ._device import check_bf16, device_limits
from ._device import DEVICE, INTERPRET

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


# ---------------------------------------------------------------------------------------------------------------
# KV caches: decode, paged decode, packed sequences, cascade (docs/design.md §4)
# ---------------------------------------------------------------------------------------------------------------
def check_seq_lens(seq_lens, batch: int, limit: int, limit_what: str, validate: bool):
    """seq_lens: an int32/int64 tensor of shape (batch,) on DEVICE with values in [0, limit]."""
    check_tensor(seq_lens, "seq_lens", ndim=1, dtypes=INT_DTYPES)
    if seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens must have shape (B,) = ({batch},), got {tuple(seq_lens.shape)}")
    if validate and batch > 0:
        lo, hi = int(seq_lens.min()), int(seq_lens.max())  # one device sync; validate=False skips it
        if lo < 0 or hi > limit:
            raise ValueError(f"seq_lens must lie in [0, {limit}] ({limit_what}), got values in [{lo}, {hi}]")
    return seq_lens.contiguous()


def check_decode_q(q, name="q"):
    check_tensor(q, name, ndim=3)
    B, Hq, d = q.shape
    if B == 0 or Hq == 0:
        raise ValueError(f"{name} must have shape (B, Hq, d) with B, Hq >= 1, got {tuple(q.shape)}")
    check_head_dim(d, f"head dimension d ({name}.shape[-1])")
    return B, Hq, d


def check_kv_cache(q, k, v, k_name: str, v_name: str, layout: str, hkv_axis: int):
    """The K and V caches of a decode: rank-4 tensors of one ``layout`` (its text goes into the message) with
    the kv heads on ``hkv_axis`` and ``d`` last, on ``DEVICE``, of q's dtype and ``d``, and ``Hq % Hkv == 0``
    (GQA). Returns ``k.shape``."""
    for name, x in ((k_name, k), (v_name, v)):
        check_tensor(x, name, ndim=4)
    check_same_dtype(**{"q": q, k_name: k, v_name: v})
    if k.shape != v.shape:
        raise ValueError(f"{k_name} and {v_name} must have the same shape {layout}, got {k_name} {tuple(k.shape)} "
                         f"and {v_name} {tuple(v.shape)}")
    d, dk = q.shape[-1], k.shape[-1]
    if dk != d:
        raise ValueError(f"q and {k_name} must have the same head dimension d, got q d={d} and {k_name} d={dk}")
    check_gqa(q.shape[1], k.shape[hkv_axis])
    return tuple(k.shape)


def check_block_tables(block_tables, seq_lens, batch, num_blocks, block_size, validate):
    """block_tables: (B, max_blocks) int32/int64 on DEVICE; the blocks a sequence uses lie in [0, num_blocks)."""
    check_tensor(block_tables, "block_tables", ndim=2, dtypes=INT_DTYPES)
    if block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must have shape (B, max_blocks) with B={batch}, "
                         f"got {tuple(block_tables.shape)}")
    max_blocks = block_tables.shape[1]
    if max_blocks == 0:
        raise ValueError(f"block_tables must have at least one column (max_blocks >= 1), "
                         f"got {tuple(block_tables.shape)}")
    seq_lens = check_seq_lens(seq_lens, batch, max_blocks * block_size,
                               f"max_blocks * block_size = {max_blocks} * {block_size}", validate)
    if validate:
        used = torch.arange(max_blocks, device=block_tables.device)[None, :] < \
            ((seq_lens.to(torch.int64) + block_size - 1) // block_size)[:, None]
        bad = used & ((block_tables < 0) | (block_tables >= num_blocks))
        if bool(bad.any()):
            b, j = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"block_tables[{b}, {j}] = {int(block_tables[b, j])} is not a block index in "
                             f"[0, {num_blocks}) but sequence {b} (seq_lens {int(seq_lens[b])}) uses that block; "
                             "only entries past a sequence's last block may be -1")
    return block_tables if block_tables.stride(1) == 1 else block_tables.contiguous(), seq_lens


def check_paged_cache(q, k_cache, v_cache):
    """k_cache, v_cache: ``(num_blocks, block_size, Hkv, d)`` with ``num_blocks, block_size >= 1``, matching q
    (dtype, ``d``, GQA); returns ``k_cache.shape``."""
    shape = check_kv_cache(q, k_cache, v_cache, "k_cache", "v_cache", "(num_blocks, block_size, Hkv, d)", hkv_axis=2)
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"k_cache must have num_blocks >= 1 and block_size >= 1, got {shape}")
    return shape


def check_cu_seqlens(cu, name: str, total: int, max_seqlen: int | None, batch: int | None, validate: bool):
    """``cu`` is an int32/int64 ``(B + 1,)`` tensor on DEVICE; with ``validate`` (one device sync) also
    ``cu[0] == 0``, non-decreasing, ``cu[-1] == total`` and every length ``<= max_seqlen``. Returns ``cu``
    contiguous and the longest length (``max_seqlen`` unchanged when not validating)."""
    check_tensor(cu, name, ndim=1, dtypes=INT_DTYPES)
    if cu.shape[0] < 2:
        raise ValueError(f"{name} must have shape (B + 1,) with B >= 1, got {tuple(cu.shape)}")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"{name} must have B + 1 = {batch + 1} entries (as cu_seqlens_q), got {cu.shape[0]}")
    longest = max_seqlen
    if validate:
        c = cu.to("cpu", torch.int64)
        if int(c[0]) != 0:
            raise ValueError(f"{name} must start at 0, got {name}[0] = {int(c[0])}")
        step = c[1:] - c[:-1]
        if bool((step < 0).any()):
            b = int(torch.nonzero(step < 0)[0, 0])
            raise ValueError(f"{name} must be non-decreasing (cumulative lengths), got {name}[{b}] = {int(c[b])} "
                             f"> {name}[{b + 1}] = {int(c[b + 1])}")
        if int(c[-1]) != total:
            raise ValueError(f"{name}[-1] must equal the number of packed tokens {total}, got {int(c[-1])}")
        longest = int(step.max())
        if max_seqlen is not None and longest > max_seqlen:
            raise ValueError(f"max_seqlen for {name} is {max_seqlen} but sequence {int(step.argmax())} has "
                             f"{longest} tokens; pass the longest length (or more)")
    return cu.contiguous(), longest


def check_cascade_inputs(q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, validate):
    """The inputs of a cascade decode (``cascade_decode``, ``experiments.serving_baselines.cascade_decode_separate``): q ``(B, Hq, d)``
    with ``B, Hq >= 1``; the paged caches, block tables and seq_lens as ``paged_decode`` takes them; prefix_k,
    prefix_v ``(P, Hkv, d)`` with ``P >= 1``, of q's dtype. Returns ``(B, Hq, d, Hkv, block_size, block_tables,
    seq_lens)``; ``validate`` (checked) adds the value checks that need a device sync."""
    check_tensor(q, "q", ndim=3)
    B, hq, d = q.shape
    if B == 0 or hq == 0:
        raise ValueError(f"q must have shape (B, Hq, d) with B, Hq >= 1, got {tuple(q.shape)}")
    num_blocks, block_size, hkv, _ = check_paged_cache(q, k_cache, v_cache)
    check_head_dim(d, "head dimension d (q.shape[-1])")
    validate = check_flag(validate, "validate")
    for name, x in (("prefix_k", prefix_k), ("prefix_v", prefix_v)):
        check_tensor(x, name, ndim=3)
        if x.shape[0] == 0 or x.shape[1:] != (hkv, d):
            raise ValueError(f"{name} must have shape (P, Hkv, d) = (P, {hkv}, {d}) with P >= 1, got {tuple(x.shape)}")
    check_same_dtype(q=q, prefix_k=prefix_k, prefix_v=prefix_v)
    if prefix_k.shape != prefix_v.shape:
        raise ValueError(f"prefix_k and prefix_v must have the same shape, got {tuple(prefix_k.shape)} and "
                         f"{tuple(prefix_v.shape)}")
    block_tables, seq_lens = check_block_tables(block_tables, seq_lens, B, num_blocks, block_size, validate)
    return B, hq, d, hkv, block_size, block_tables, seq_lens


# ---------------------------------------------------------------------------------------------------------------
# the Hopper (Gluon) backend: sm_90a kernels (wgmma, TMA, setmaxnreg)
# ---------------------------------------------------------------------------------------------------------------
#: head dimensions and dtypes the Gluon kernels are compiled for, on compute capability exactly 9.0
GLUON_HEAD_DIMS = (64, 128)
GLUON_DTYPES = (torch.bfloat16, torch.float16)
MIN_CAPABILITY = (9, 0)


def gluon_supported(limits) -> bool:
    """The Gluon kernels are compiled for sm_90a: Hopper exactly (not sm_80/89, not sm_100)."""
    return tuple(limits.capability) == MIN_CAPABILITY


def check_gluon_device(device, name: str = "flash_attention_forward_gluon") -> None:
    """The kernels use wgmma/TMA/setmaxnreg (sm_90a): a CUDA device of compute capability exactly 9.0."""
    if not (isinstance(device, torch.device) and device.type == "cuda" and torch.cuda.is_available()):
        raise RuntimeError(f"{name} needs a Hopper GPU (compute capability 9.0: H100/H200) for wgmma, TMA and "
                           f"setmaxnreg; the inputs are on {device} (the Triton interpreter cannot run Gluon "
                           "kernels)")
    limits = device_limits(device)
    if not gluon_supported(limits):
        cap = limits.capability
        raise RuntimeError(f"{name} needs compute capability 9.0 (Hopper: H100/H200) for wgmma; "
                           f"{limits.name} has {cap[0]}.{cap[1]}")


def check_gluon_inputs(q, k, v, causal, scale, name: str):
    """Shapes (``d`` in ``GLUON_HEAD_DIMS``), dtype (``GLUON_DTYPES``), ``causal`` and ``scale`` of a Gluon entry
    point ``name``; return ``(B, Hq, Hkv, Nq, Nk, d, group, causal, scale)``."""
    B, Hq, Hkv, Nq, Nk, d, group = check_attention_inputs(q, k, v, head_dims=GLUON_HEAD_DIMS)
    if q.dtype not in GLUON_DTYPES:
        raise ValueError(f"{name}: q, k, v must be bfloat16 or float16, got {q.dtype}")
    return B, Hq, Hkv, Nq, Nk, d, group, check_flag(causal, "causal"), check_scale(scale, d)


def check_backward_args(q, k, v, o, lse, do, causal, scale, name="flash_attention_backward_gluon_ws"):
    """The input checks of a Gluon backward (``name`` is the entry point the messages name); return
    ``(B, Hq, Hkv, Nq, Nk, d, group, causal, scale)``. The device check comes after (``check_gluon_device``),
    so a bad argument is named before a missing GPU."""
    out = check_gluon_inputs(q, k, v, causal, scale, name)
    check_backward_inputs(q, o, lse, do)
    return out


