"""The serving path in Triton: chunked prefill over a paged KV cache.

Definitions and the reasoning are in ``reference.numpy.serving``; these are the fast versions.

``paged_prefill``: the FA2 forward over packed chunk queries and each sequence's block-table row, any block
size: by default on Hopper the Gluon kernel ``reference.triton.hopper.paged_prefill_gluon`` (a producer warp
reads the table and copies one TMA box per page; ``gather="tma"``), elsewhere and for inputs it does not take
``reference.triton.paged_tiles`` (one table entry per page-aligned key block, looked up a block ahead;
``gather="page"``). Cascade decode is ``reference.triton.cascade``; the benchmarks' before-states (the FA2 kernel's
row gather, the three-launch cascade) are ``experiments/serving_baselines.py``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import _checks, backends, configs
from ._checks import check_block_tables, check_cu_seqlens, check_paged_cache
from ._device import INTERPRET
from .flash_fwd import Varlen
from .paged_tiles import launch_paged_prefill

__all__ = ["paged_prefill"]

#: ``paged_prefill(gather=...)``: the page-aligned kernel, or on Hopper the Gluon kernel with one TMA box per page
#: (``reference.triton.hopper.paged_prefill_gluon``; elsewhere, and for inputs it does not take, "tma" runs the
#: page-aligned kernel); the FA2 kernel's row gather, the benchmarks' before-state, is
#: ``experiments.serving_baselines.paged_prefill_row_gather``
GATHERS = ("page", "tma")
#: ``paged_prefill(backend=...)``: "auto" the default choice (``gather`` above); "triton" the portable kernels only;
#: "gluon" the Hopper Gluon kernel or a ``ValueError`` saying why it does not take the inputs (never a silent fallback)
BACKENDS = backends.BACKENDS


def _check_caches(q, k_cache, v_cache):
    num_blocks, block_size, hkv, d = check_paged_cache(q, k_cache, v_cache)
    _checks.check_head_dim(d, "head dimension d (q.shape[-1])")
    return num_blocks, block_size, hkv, d


def _last_axis_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


class PagedPrefillCall(NamedTuple):
    """The checked arguments of a paged prefill (``check_paged_prefill``): the caches with contiguous rows, the
    packed chunks' bounds and block tables as ``varlen`` (``flash_fwd.Varlen``), ``max_q`` the longest chunk."""
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    varlen: Varlen
    max_q: int
    causal: bool
    scale: float
    group: int
    validate: bool


def check_paged_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_seqlen_q=None, causal=True,
                        scale=None, validate=True, config=None) -> PagedPrefillCall:
    """``paged_prefill``'s input checks (each bad argument named) and defaults."""
    _checks.check_tensor(q, "q", ndim=3)
    num_blocks, block_size, hkv, d = _check_caches(q, k_cache, v_cache)
    validate = _checks.check_flag(validate, "validate")
    if config is not None:
        configs.check_pin(config, "config")
    causal = _checks.check_flag(causal, "causal")
    if max_seqlen_q is not None and (isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int)
                                     or max_seqlen_q < 0):
        raise TypeError(f"max_seqlen_q must be a non-negative int or None, got {max_seqlen_q!r}")
    cu_q, longest = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0], max_seqlen_q, None,
                                     validate or max_seqlen_q is None)
    batch = cu_q.shape[0] - 1
    block_tables, seq_lens = check_block_tables(block_tables, seq_lens, batch, num_blocks, block_size, validate)
    scale = _checks.check_scale(scale, d)
    max_q = max_seqlen_q if max_seqlen_q is not None else longest
    vl = Varlen(cu_q, seq_lens, batch, max_q, block_tables.shape[1] * block_size, block_tables, block_size)
    k_cache, v_cache = _last_axis_contiguous(k_cache), _last_axis_contiguous(v_cache)
    return PagedPrefillCall(k_cache, v_cache, vl, max_q, causal, scale, q.shape[1] // hkv, validate)


def paged_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_seqlen_q=None, causal=True,
                  scale=None, *, validate=True, gather=None, config=None, backend="auto"):
    """Attention of packed chunk queries to their sequences' paged KV cache; returns ``(o, lse)``.

    q: ``(total_q, Hq, d)`` packed chunks (sequence ``b``: rows ``cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1``);
    k_cache, v_cache: ``(num_blocks, block_size, Hkv, d)`` already holding each chunk's own K/V;
    block_tables: ``(B, max_blocks)`` int32, padded with -1; seq_lens: ``(B,)`` keys per sequence;
    max_seqlen_q: the longest chunk (None: read from ``cu_seqlens_q``, one device sync). Bottom-right causal
    by default (the chunk is the last ``n_q`` of ``seq_lens[b]`` positions). Returns ``o (total_q, Hq, d)`` and
    ``lse (Hq, total_q)`` float32. ``validate=False`` skips the value checks that need a device sync.
    gather: ``"page"`` the page-aligned kernel ``reference.triton.paged_tiles`` (one table entry per
    page-aligned key block, looked up one block ahead); ``"tma"`` on a Hopper GPU the
    Gluon kernel ``reference.triton.hopper.paged_prefill_gluon`` (its producer warp reads the table and copies
    one TMA box per page; bf16/fp16, d in {64, 128}, pages of 8, 16, ... keys or multiples of 128, contiguous
    caches), the page-aligned kernel for every other input; None: ``configs.PAGED_PREFILL["gather"]`` (``"tma"``)
    under ``backend="auto"``.
    config: one forward pin (``reference.triton.configs``; None: ``configs.forward_pin()``, i.e. autotuning on a
    GPU) for the Triton kernel, which it never picks: with ``backend="auto"`` and ``gather`` None or ``"tma"`` a
    ``config`` is a ``ValueError`` (pass ``backend="triton"``); the Gluon kernel takes
    ``configs.PAGED_PREFILL["gluon_config"]``. The Gluon
    kernel copies whole pages, so the V slots past a sequence's end in its last page must be finite: with
    ``validate=True`` that is checked (``tail_values_finite``) and the Triton kernel runs where it does not hold;
    with ``validate=False`` it is the caller's promise (a zero-initialised cache keeps it).
    backend: which kernels may run, chosen here and nowhere else: ``"auto"`` as above (the device, dtype, head
    dimension, page size and layout pick the kernel; inputs the Gluon kernel cannot take, non-finite V tail slots
    found by ``validate=True`` among them, run the Triton kernel); ``"triton"`` the portable kernel only (``gather`` ``"page"``);
    ``"gluon"`` the Gluon kernel (``gather`` None or ``"tma"``, no ``config``), and a ``ValueError``
    naming the reason where it does not take these inputs (another GPU, dtype, head dimension, page size, layout,
    or non-finite V tail slots under ``validate=True``) instead of a fallback.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if gather is None:
        gather = {"triton": "page", "gluon": "tma"}.get(backend) or configs.PAGED_PREFILL["gather"]
    if gather not in GATHERS:
        raise ValueError(f"gather must be one of {GATHERS} or None, got {gather!r}")
    if backend == "triton" and gather == "tma":
        raise ValueError("gather='tma' is the Gluon kernel's gather; backend='triton' takes gather 'page'")
    if backend == "gluon" and (gather != "tma" or config is not None):
        raise ValueError("backend='gluon' runs the Gluon kernel (its own pin, configs.PAGED_PREFILL['gluon_config']): "
                         f"pass gather None or 'tma' and no config, got gather={gather!r}, config={config!r}")
    call = check_paged_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_seqlen_q, causal, scale,
                               validate, config)
    if config is not None and gather == "tma" and backend == "auto":  # a config never picks the kernel
        raise ValueError("config is a pin of the Triton kernel, and backend='auto' may run the Gluon kernel "
                         "(its own pin, configs.PAGED_PREFILL['gluon_config']): pass backend='triton' (or "
                         "gather='page') to run the Triton kernel with this config")
    k_cache, v_cache, vl, max_q, causal, scale, group, validate = call
    cu_q, seq_lens, block_tables = vl.cu_q, vl.cu_k, vl.block_tables
    q = _last_axis_contiguous(q)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    if backend == "gluon" and max_q > 0:
        why = _gluon_refusal(q, k_cache, v_cache)
        if why is None and validate and not tail_values_finite(v_cache, block_tables, seq_lens):
            why = "a V slot past a sequence's end in its last page is not finite (the kernel copies whole pages)"
        if why is not None:
            raise ValueError(f"paged_prefill(backend='gluon'): the Gluon kernel does not take these inputs: {why}")
    if (max_q > 0 and gather == "tma" and _gluon_takes(q, k_cache, v_cache)
            and (not validate or tail_values_finite(v_cache, block_tables, seq_lens))):
        backends.paged_prefill_gluon(q, k_cache, v_cache, o, lse, _int32(cu_q), _int32(seq_lens), _int32(block_tables),
                            max_q, causal, scale, group, config=configs.PAGED_PREFILL["gluon_config"])
    elif max_q > 0:
        launch_paged_prefill(q, k_cache, v_cache, o, lse, cu_q, seq_lens, block_tables, max_q, causal, scale,
                             group, config=config)
    else:
        o.zero_()
        lse.fill_(float("-inf"))
    return o, lse


def tail_values_finite(v_cache, block_tables, seq_lens) -> bool:
    """Whether every V slot past a sequence's end inside its last page is finite: the Gluon paged prefill's
    contract (``hopper/paged_prefill_gluon.py``). It copies whole pages; the scores of those slots are masked
    to ``-inf`` (FA2 Algorithm 1, line 9's mask), so their weight is 0, but ``0 * NaN`` or ``0 * inf`` in
    ``P V`` is NaN. The Triton kernels mask the loads instead and take any values there. One gather of at most
    one page per sequence and one device sync; ``paged_prefill`` runs it with ``validate=True`` and falls back
    to the Triton kernel where it fails (a cache from ``torch.empty`` may hold anything in those slots)."""
    page = v_cache.shape[1]
    seq_lens = seq_lens.long()
    tail = seq_lens % page
    rows = (tail > 0).nonzero().squeeze(1)
    if rows.numel() == 0:
        return True
    last = block_tables[rows, (seq_lens[rows] - 1) // page].long()
    unused = torch.arange(page, device=v_cache.device)[None, :] >= tail[rows][:, None]
    return bool(torch.isfinite(v_cache[last][unused]).all())


def _gluon_takes(q, k_cache, v_cache) -> bool:
    """The Gluon paged prefill runs these inputs: a Hopper GPU, its dtypes / head dims / page sizes
    (``paged_prefill_gluon.gluon_paged_ok``) and caches it can view as one 2-D TMA tensor (contiguous)."""
    return _gluon_refusal(q, k_cache, v_cache) is None


def _gluon_refusal(q, k_cache, v_cache) -> str | None:
    """Why the Gluon paged prefill does not take these inputs, or None where it does (``_gluon_takes``)."""
    if INTERPRET or not q.is_cuda:
        return "it needs a Hopper GPU (compute capability 9.0); the inputs are on " + str(q.device) + (
            " under the Triton interpreter" if INTERPRET else "")
    if not all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (q, k_cache, v_cache)):
        return "q, k_cache and v_cache must be contiguous with 16-byte aligned bases (one 2-D TMA view each)"
    return backends.gluon_paged_ok(q, k_cache, configs.PAGED_PREFILL["gluon_config"])


def _int32(x):
    return x if x.dtype == torch.int32 else x.to(torch.int32)
