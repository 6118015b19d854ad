"""The serving path in Triton: chunked prefill over a paged KV cache, and cascade decode for a shared prefix.

Definitions and the reasoning are in ``reference.numpy.serving``; these are the fast versions.

* ``paged_prefill``: the FA2 forward over packed chunk queries and each sequence's block-table row, any block
  size: by default on Hopper the Gluon kernel ``reference.triton.hopper.paged_prefill_gluon`` (a producer warp
  reads the table and copies one TMA box per page; ``gather="tma"``), elsewhere and for inputs it does not take
  ``reference.triton.paged_tiles`` (one table entry per page-aligned key block, looked up a block ahead;
  ``gather="page"``), or (``gather="row"``) the FA2 kernel ``flash_fwd._attn_fwd`` with ``VARLEN`` and ``PAGE``
  (one table entry per key row, the simpler gather).
* ``cascade_decode_separate``: the first cascade decode, kept as the benchmark's before-state (the course's
  ``cascade_decode`` is ``reference.triton.cascade``, one launch): (1) the shared prefix once for the whole batch -- the ``G`` query heads of every
  request that read kv head ``h`` become ``B * G`` rows of one dense FA2 call over the prefix, whose keys are
  split into ``S`` chunks (the batch axis of the call, with q broadcast over it) so that enough programs fill
  the GPU; (2) each request's suffix with the paged varlen kernel (the request's G query heads of a kv head as
  G rows: one small query tile per (request, kv head)); (3) one merge kernel
  folding the ``S`` prefix states and the suffix state with the log-sum-exp rule (``merge_states``).
  Bytes read: the prefix once plus every suffix, instead of the prefix once per request.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _checks, backends, configs
from ._checks import check_block_tables, check_cascade_inputs, check_cu_seqlens, check_paged_cache
from ._device import INTERPRET, num_sms
from .flash_fwd import Varlen, launch_forward
from .paged_tiles import launch_paged_prefill

__all__ = ["paged_prefill", "cascade_decode_separate"]

#: a prefix split gets at least this many keys (its fixed costs -- the Q tile load, the partial write -- stay small)
MIN_PREFIX_KEYS_PER_SPLIT = 256
#: ``paged_prefill(gather=...)``: the page-aligned kernel, the FA2 kernel's row gather (the before-state), or on
#: Hopper the Gluon kernel with one TMA box per page (``reference.triton.hopper.paged_prefill_gluon``; elsewhere,
#: and for inputs it does not take, "tma" runs the page-aligned kernel)
GATHERS = ("page", "row", "tma")
#: ``paged_prefill(backend=...)``: "auto" the default choice (``gather`` above); "triton" the portable kernels only;
#: "gluon" the Hopper Gluon kernel or a ``ValueError`` saying why it does not take the inputs (never a silent fallback)
BACKENDS = backends.BACKENDS


def _check_caches(q, k_cache, v_cache):
    num_blocks, block_size, hkv, d = check_paged_cache(q, k_cache, v_cache)
    _checks.check_head_dim(d, "head dimension d (q.shape[-1])")
    return num_blocks, block_size, hkv, d


def _last_axis_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


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
    page-aligned key block, looked up one block ahead); ``"row"`` the FA2 kernel's ``PAGE`` path (one table
    entry per key row, the simpler gather, kept as the benchmarks' before-state); ``"tma"`` on a Hopper GPU the
    Gluon kernel ``reference.triton.hopper.paged_prefill_gluon`` (its producer warp reads the table and copies
    one TMA box per page; bf16/fp16, d in {64, 128}, pages of 8, 16, ... keys or multiples of 128, contiguous
    caches), the page-aligned kernel for every other input; None: ``"page"`` when ``config`` is given, else
    ``configs.PAGED_PREFILL["gather"]`` (``"tma"``).
    config: one forward pin (``reference.triton.configs``; None: ``configs.forward_pin()``, i.e. autotuning on a
    GPU) for the Triton kernels; the Gluon kernel takes ``configs.PAGED_PREFILL["gluon_config"]``. The Gluon
    kernel copies whole pages, so the V slots past a sequence's end in its last page must be finite: with
    ``validate=True`` that is checked (``tail_values_finite``) and the Triton kernel runs where it does not hold;
    with ``validate=False`` it is the caller's promise (a zero-initialised cache keeps it).
    backend: which kernels may run, chosen here and nowhere else: ``"auto"`` as above (a ``config`` or a failed
    tail check picks the Triton kernel); ``"triton"`` the portable kernels only (``gather`` ``"page"`` by default,
    or ``"row"``); ``"gluon"`` the Gluon kernel (``gather`` None or ``"tma"``, no ``config``), and a ``ValueError``
    naming the reason where it does not take these inputs (another GPU, dtype, head dimension, page size, layout,
    or non-finite V tail slots under ``validate=True``) instead of a fallback.
    """
    _checks.check_tensor(q, "q", ndim=3)
    num_blocks, block_size, hkv, d = _check_caches(q, k_cache, v_cache)
    validate = _checks.check_flag(validate, "validate")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if gather is None:  # a Triton pin asks for the Triton kernel
        gather = {"triton": "page", "gluon": "tma"}.get(backend) or (
            "page" if config is not None else configs.PAGED_PREFILL["gather"])
    if gather not in GATHERS:
        raise ValueError(f"gather must be one of {GATHERS} or None, got {gather!r}")
    if backend == "triton" and gather == "tma":
        raise ValueError("gather='tma' is the Gluon kernel's gather; backend='triton' takes gather 'page' or 'row'")
    if backend == "gluon" and (gather != "tma" or config is not None):
        raise ValueError("backend='gluon' runs the Gluon kernel (its own pin, configs.PAGED_PREFILL['gluon_config']): "
                         f"pass gather None or 'tma' and no config, got gather={gather!r}, config={config!r}")
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
    if gather == "row":
        return _paged_forward(q, k_cache, v_cache, vl, causal, scale, q.shape[1] // hkv, config)
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
                            max_q, causal, scale, q.shape[1] // hkv, config=configs.PAGED_PREFILL["gluon_config"])
    elif max_q > 0:
        launch_paged_prefill(q, k_cache, v_cache, o, lse, cu_q, seq_lens, block_tables, max_q, causal, scale,
                             q.shape[1] // hkv, config=config)
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


def _paged_forward(q, k_cache, v_cache, vl: Varlen, causal: bool, scale: float, group: int, config=None):
    q = _last_axis_contiguous(q)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    if vl.max_q > 0:
        launch_forward(q, k_cache, v_cache, o, lse, causal, scale, group, vl, config=config)
    else:
        o.zero_()
        lse.fill_(float("-inf"))
    return o, lse


# --------------------------------------------------------------------------------------------------------------
# cascade decode
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _cascade_merge(OP, LP, OS, LS, OUT, LOUT, n_states, H_KV,
                   stride_ops, stride_oph, stride_lps, stride_lph,
                   stride_osr, stride_osk, stride_lsk, stride_outb, stride_outh,
                   GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr):
    """merge_states over ``n_states`` prefix states and one suffix state, for the ``GROUP`` query heads of one
    (request b, kv head) -- lse rule: ``lse = log sum_j exp(lse_j)``, ``o = sum_j exp(lse_j - lse) o_j``.

    Both states number the rows of kv head ``hk`` as ``b*GROUP + g`` (query head ``hk*GROUP + g`` of request
    ``b``). Prefix state ``s``: ``OP[s, hk, row]`` (d contiguous), ``LP[s, hk, row]``; suffix state:
    ``OS[row, hk]``, ``LS[hk, row]``. Natural-log lse; -inf marks an empty key set.
    """
    pid = tl.program_id(0)
    b = (pid // H_KV).to(tl.int64)
    hk = (pid % H_KV).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    g_ok = offs_g < GROUP
    heads = hk * GROUP + offs_g
    rows = b * GROUP + offs_g
    # the suffix state starts the running (max m, denominator den, numerator acc)
    m = tl.load(LS + hk * stride_lsk + rows, mask=g_ok, other=float("-inf"))
    den = tl.where(m == float("-inf"), 0.0, 1.0)
    acc = tl.load(OS + rows[:, None] * stride_osr + hk * stride_osk + offs_d[None, :], mask=g_ok[:, None],
                  other=0.0).to(tl.float32) * den[:, None]
    for s in range(n_states):
        lse = tl.load(LP + s * stride_lps + hk * stride_lph + rows, mask=g_ok, other=float("-inf"))
        o = tl.load(OP + s * stride_ops + hk * stride_oph + rows[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=g_ok[:, None], other=0.0).to(tl.float32)
        m_new = tl.maximum(m, lse)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # both empty so far: weights 0, not NaN
        alpha = tl.exp(m - m_ref)
        w = tl.exp(lse - m_ref)
        den = den * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * o
        m = m_new
    out = acc / tl.where(den > 0, den, 1.0)[:, None]
    lse_out = tl.where(den > 0, tl.where(m == float("-inf"), 0.0, m) + tl.log(den), float("-inf"))
    tl.store(OUT + b * stride_outb + heads[:, None] * stride_outh + offs_d[None, :],
             out.to(OUT.dtype.element_ty), mask=g_ok[:, None])
    tl.store(LOUT + b * H_KV * GROUP + heads, lse_out, mask=g_ok)


def separate_num_splits(batch: int, group: int, n_kv_heads: int, prefix_len: int, sms: int | None = None) -> int:
    """``cascade_decode_separate``'s key chunks of the prefix (``cascade.cascade_num_splits`` is the one-launch
    cascade's): about ``configs.PROGRAMS_PER_SM * sms`` programs over ``n_kv_heads`` heads and
    ``ceil(batch * group / 64)`` query-row blocks, each chunk at least ``MIN_PREFIX_KEYS_PER_SPLIT`` keys."""
    sms = num_sms() if sms is None else sms
    row_blocks = math.ceil(batch * group / 64)
    want = max(1, round(configs.PROGRAMS_PER_SM * sms / (row_blocks * n_kv_heads)))
    return max(1, min(want, prefix_len // MIN_PREFIX_KEYS_PER_SPLIT))


_ARANGE: dict = {}


def _arange(n: int, step: int, device) -> torch.Tensor:
    """``[0, step, .., n * step]`` int32 on ``device``, cached: cumulative lengths of n sequences of ``step``."""
    key = (n, step, device)
    t = _ARANGE.get(key)
    if t is None:
        t = _ARANGE[key] = torch.arange(0, n * step + 1, step, dtype=torch.int32, device=device)
    return t


def cascade_decode_separate(q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, scale=None, *,
                   num_splits=None, validate=True):
    """Decode attention of B requests over one shared prefix plus each request's paged suffix; ``(o, lse)``.

    q: ``(B, Hq, d)``; prefix_k, prefix_v: ``(P, Hkv, d)``, ``P >= 1``, read once for the whole batch;
    k_cache, v_cache ``(num_blocks, block_size, Hkv, d)``, block_tables ``(B, max_blocks)``, seq_lens ``(B,)``:
    each request's suffix (``seq_lens[b] = 0``: prefix only), as in ``paged_decode``. num_splits: key chunks
    of the prefix (None: ``separate_num_splits``). Returns ``o (B, Hq, d)`` in q's dtype and ``lse (B, Hq)``
    float32 over each request's whole key set. ``validate=False`` skips the checks that need a device sync.
    """
    B, hq, d, hkv, block_size, block_tables, seq_lens = check_cascade_inputs(
        q, prefix_k, prefix_v, k_cache, v_cache, block_tables, seq_lens, validate)
    scale = _checks.check_scale(scale, d)
    P, g = prefix_k.shape[0], hq // hkv
    if num_splits is None:
        num_splits = separate_num_splits(B, g, hkv, P)
    num_splits = min(_checks.check_positive_int(num_splits, "num_splits"), P)
    q = q.contiguous()
    prefix_k, prefix_v = prefix_k.contiguous(), prefix_v.contiguous()

    # (1) prefix: rows of kv head h = query heads h*G..h*G+G-1 of every request; S key chunks as the batch axis
    rows = q.view(B, hkv, g, d).transpose(0, 1).reshape(hkv, B * g, d)
    chunk = P // num_splits
    n_states = num_splits + (P % num_splits > 0)
    o_p = torch.empty((n_states, hkv, B * g, d), dtype=torch.float32, device=q.device)
    lse_p = torch.empty((n_states, hkv, B * g), dtype=torch.float32, device=q.device)
    main = num_splits * chunk
    pieces = [(num_splits, prefix_k[:main], prefix_v[:main], 0)]
    if main < P:  # the remainder keys: one more state
        pieces.append((1, prefix_k[main:], prefix_v[main:], num_splits))
    for n, pk, pv, at in pieces:
        kk = pk.view(n, -1, hkv, d).transpose(1, 2)  # (n, Hkv, chunk, d): strided views, no copy
        vv = pv.view(n, -1, hkv, d).transpose(1, 2)
        launch_forward(rows.unsqueeze(0).expand(n, -1, -1, -1), kk, vv, o_p[at:at + n], lse_p[at:at + n],
                       False, scale, 1)
    # (2) suffixes: request b is a "sequence" of G query rows per kv head (GQA packing: each suffix block is
    # loaded once per kv head, not once per query head), over its own blocks
    vl = Varlen(_arange(B, g, q.device), seq_lens, B, g, block_tables.shape[1] * block_size, block_tables,
                block_size)
    q_rows = q.view(B, hkv, g, d).transpose(1, 2).reshape(B * g, hkv, d)
    o_s, lse_s = _paged_forward(q_rows, _last_axis_contiguous(k_cache), _last_axis_contiguous(v_cache), vl, False,
                                scale, 1)
    # (3) merge
    o = torch.empty_like(q)
    lse = torch.empty((B, hq), dtype=torch.float32, device=q.device)
    _cascade_merge[(B * hkv,)](o_p, lse_p, o_s, lse_s, o, lse, n_states, hkv,
                               o_p.stride(0), o_p.stride(1), lse_p.stride(0), lse_p.stride(1),
                               o_s.stride(0), o_s.stride(1), lse_s.stride(0), o.stride(0), o.stride(1),
                               GROUP=g, BLOCK_G=max(2, triton.next_power_of_2(g)), HEAD_DIM=d, num_warps=4)
    return o, lse
