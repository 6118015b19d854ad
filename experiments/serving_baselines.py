"""The serving benchmarks' before-states, kept runnable beside the course's kernels they lost to.

* ``paged_prefill_row_gather``: ``serving.paged_prefill`` on the FA2 kernel ``flash_fwd._attn_fwd`` with
  ``VARLEN`` and ``PAGE`` (one block-table entry per key row, looked up in the iteration that uses it), the simpler
  gather the page-aligned kernel ``reference.triton.paged_tiles`` replaced (``bench_mixed_batch``'s
  ``paged_prefill_row_gather`` rows; notes/serving_perf.md "Paged prefill on Triton page tiles").
* ``cascade_decode_separate``: the cascade decode in three launches (the course's ``cascade_decode`` is
  ``reference.triton.cascade``, one launch): (1) the shared prefix once for the whole batch -- the ``G`` query
  heads of every request that read kv head ``h`` become ``B * G`` rows of one dense FA2 call over the prefix,
  whose keys are split into ``S`` chunks (the batch axis of the call, with q broadcast over it) so that enough
  programs fill the GPU; (2) each request's suffix with the paged varlen kernel (the request's G query heads of a
  kv head as G rows: one small query tile per (request, kv head)); (3) one merge kernel folding the ``S`` prefix
  states and the suffix state with the log-sum-exp rule (``merge_states``). Bytes read: the prefix once plus every
  suffix, instead of the prefix once per request. ``bench_mixed_batch`` times it beside the one-launch kernel.

* ``mixed_attention_variant`` with a ``MixedVariant``: ``mixed_attention`` with the paged key loop's simpler lookups,
  ``table_ahead=False`` (a key block's table entries loaded in the iteration that uses them) and
  ``whole_pages=False`` (one table entry per key row instead of ``(pages, page, d)`` tiles of whole pages):
  ``bench_mixed_batch``'s ``first_version`` and ``table_in_place`` rows (notes/serving_perf.md, "Paged prefill on
  Triton page tiles").

The tests compare them with the production kernels and the float64 oracle (``tests/test_triton_paged_tiles.py``,
``tests/test_triton_serving.py``, ``tests/test_triton_mixed.py``). Nothing in ``reference/`` imports this module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import reference.triton  # noqa: F401  (first: without a GPU it switches Triton to its interpreter before any kernel)
import triton
import triton.language as tl

from reference.triton import _checks
from reference.triton._checks import check_cascade_inputs
from reference.triton._device import num_sms
from reference.triton.configs import PROGRAMS_PER_SM, MixedConfig
from reference.triton.flash_fwd import Varlen, launch_forward
from reference.triton.mixed import launch_mixed, prepare_mixed
from reference.triton.serving import check_paged_prefill

__all__ = ["paged_prefill_row_gather", "cascade_decode_separate", "separate_num_splits", "MixedVariant",
           "mixed_attention_variant"]

#: a prefix split gets at least this many keys (its fixed costs -- the Q tile load, the partial write -- stay small)
MIN_PREFIX_KEYS_PER_SPLIT = 256


def _rows_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def paged_prefill_row_gather(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_seqlen_q=None,
                             causal=True, scale=None, *, validate=True, config=None):
    """``serving.paged_prefill``'s arguments and ``(o, lse)``, on the FA2 kernel's ``PAGE`` path: one table entry
    per key row. config: one forward pin (None: ``configs.forward_pin()``)."""
    k_cache, v_cache, vl, _, causal, scale, group, _ = check_paged_prefill(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_seqlen_q, causal, scale, validate, config)
    return _paged_forward(q, k_cache, v_cache, vl, causal, scale, group, config)


def _paged_forward(q, k_cache, v_cache, vl: Varlen, causal: bool, scale: float, group: int, config=None):
    q = _rows_contiguous(q)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    if vl.max_q > 0:
        launch_forward(q, k_cache, v_cache, o, lse, causal, scale, group, vl, config=config)
    else:
        o.zero_()
        lse.fill_(float("-inf"))
    return o, lse



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
    cascade's): about ``PROGRAMS_PER_SM * sms`` programs over ``n_kv_heads`` heads and
    ``ceil(batch * group / 64)`` query-row blocks, each chunk at least ``MIN_PREFIX_KEYS_PER_SPLIT`` keys."""
    sms = num_sms() if sms is None else sms
    row_blocks = math.ceil(batch * group / 64)
    want = max(1, round(PROGRAMS_PER_SM * sms / (row_blocks * n_kv_heads)))
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
    o_s, lse_s = _paged_forward(q_rows, _rows_contiguous(k_cache), _rows_contiguous(v_cache), vl, False,
                                scale, 1)
    # (3) merge
    o = torch.empty_like(q)
    lse = torch.empty((B, hq), dtype=torch.float32, device=q.device)
    _cascade_merge[(B * hkv,)](o_p, lse_p, o_s, lse_s, o, lse, n_states, hkv,
                               o_p.stride(0), o_p.stride(1), lse_p.stride(0), lse_p.stride(1),
                               o_s.stride(0), o_s.stride(1), lse_s.stride(0), o.stride(0), o.stride(1),
                               GROUP=g, BLOCK_G=max(2, triton.next_power_of_2(g)), HEAD_DIM=d, num_warps=4)
    return o, lse


@dataclass(frozen=True)
class MixedVariant(MixedConfig):
    """A ``MixedConfig`` with the paged key loop's lookups: ``table_ahead`` (False: a key block's table entries in the
    iteration that uses them) and ``whole_pages`` (False: one table entry per key row)."""
    table_ahead: bool = True
    whole_pages: bool = True

    def __post_init__(self):
        super().__post_init__()
        for field in ("table_ahead", "whole_pages"):
            if type(getattr(self, field)) is not bool:
                raise ValueError(f"MixedVariant.{field} must be a bool, got {getattr(self, field)!r}")


def mixed_attention_variant(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale=None, *, causal=True,
                            plan=None, config=None, validate=True):
    """``mixed_attention`` (its arguments, checks and result) with the lookups of ``config`` (or of the plan's
    config), a ``MixedVariant``; a plain ``MixedConfig`` runs as the course kernel does."""
    call = prepare_mixed(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, causal, plan, config,
                         validate)
    cfg = call.plan.config
    return launch_mixed(*call, table_ahead=getattr(cfg, "table_ahead", True),
                        whole_pages=getattr(cfg, "whole_pages", True))
