"""An independent float64 oracle for every test: plain torch on CPU, autograd for gradients.

It shares no code with ``reference`` so a bug there cannot hide here. Conventions are docs/design.md §3:
bottom-right causal mask, GQA (query head h reads kv head h // group), natural-log lse, fully masked
rows give output 0 and lse -inf.
"""
from __future__ import annotations

import math

import numpy as np
import torch


def _t(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64)
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


def _expand_kv(x: torch.Tensor, hq: int) -> torch.Tensor:
    if x.dim() < 3 or x.shape[-3] == hq:
        return x
    return x.repeat_interleave(hq // x.shape[-3], dim=-3)


def allowed_mask(nq: int, nk: int) -> torch.Tensor:
    """Boolean (nq, nk): True where query i may attend key j, i.e. j <= i + (nk - nq)."""
    i = torch.arange(nq).unsqueeze(1)
    j = torch.arange(nk).unsqueeze(0)
    return j <= i + (nk - nq)


def attention_ref(q, k, v, causal=False, scale=None, requires_grad=False):
    """Return ``(o, lse, (q, k, v) float64 leaves)`` computed in float64."""
    q, k, v = _t(q), _t(k), _t(v)
    if requires_grad:
        q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    hq = q.shape[-3] if q.dim() >= 3 else None
    ke = _expand_kv(k, hq) if hq else k
    ve = _expand_kv(v, hq) if hq else v
    s = (q @ ke.transpose(-1, -2)) * scale
    nq, nk = q.shape[-2], k.shape[-2]
    if causal:
        s = s.masked_fill(~allowed_mask(nq, nk), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    finite = torch.isfinite(lse)
    p = torch.where(finite.unsqueeze(-1), torch.exp(s - torch.where(finite, lse, 0).unsqueeze(-1)), 0.0)
    o = p @ ve
    return o, lse, (q, k, v)


def attention_grads(q, k, v, do, causal=False, scale=None):
    """float64 autograd gradients ``(dq, dk, dv)`` of ``sum(o * do)``; GQA grads summed over the group."""
    o, _, (qq, kk, vv) = attention_ref(q, k, v, causal=causal, scale=scale, requires_grad=True)
    (o * _t(do)).sum().backward()
    return qq.grad, kk.grad, vv.grad


def _pair(out, ref):
    """``(out, ref, finite mask of ref)`` as float64 tensors of one shape; the mask is None when ``out`` has NaN
    where ``ref`` has none or is non-finite elsewhere than ``ref`` (the error is then inf)."""
    a = _t(out)
    b = _t(ref)
    if a.shape != b.shape:
        raise AssertionError(f"shape mismatch: {tuple(a.shape)} vs {tuple(b.shape)}")
    fin = torch.isfinite(b)
    if (torch.isnan(a).any() and not torch.isnan(b).any()) or not torch.equal(torch.isfinite(a), fin):
        return a, b, None
    return a, b, fin


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| over the whole tensor (float64); inf when out has NaN where ref does not."""
    a, b, fin = _pair(out, ref)
    if fin is None:
        return float("inf")
    diff = torch.linalg.vector_norm(torch.where(fin, a - b, 0))
    den = torch.linalg.vector_norm(torch.where(fin, b, 0))
    return float(diff / den) if den > 0 else float(diff)


def lse_err(out, ref) -> float:
    """Error of log-sum-exp values: ``||out - ref|| / max(||ref||, sqrt(n))`` over the finite entries.

    lse is a log, so its rounding error is absolute (about eps times the size of the scores), not relative:
    a plain relative error explodes when a row's lse happens to be near 0 (e.g. N = 1, lse = one score).
    Flooring the denominator at one unit per entry judges such rows by their absolute error. -inf rows must
    match exactly (inf otherwise); NaN where the reference has none gives inf.
    """
    a, b, fin = _pair(out, ref)
    if fin is None or not torch.equal(a[~fin], b[~fin]):
        return float("inf")
    diff = torch.linalg.vector_norm(torch.where(fin, a - b, 0))
    den = max(float(torch.linalg.vector_norm(torch.where(fin, b, 0))), math.sqrt(int(fin.sum())), 1e-300)
    return float(diff) / den


def tf32_lse_violation(lse, ref, q, k, scale=None) -> float:
    """Largest ratio |lse - ref| / bound over finite rows, for fp32 inputs whose dots ran in TF32 on a GPU.

    TF32 rounds q and k to 10-bit mantissas (unit roundoff 2^-11, 2^-10 if truncated): each score carries an
    absolute error of at most ~2^-10 * scale * |q_i| max_j |k_j|, and lse (a soft maximum of the scores)
    inherits it. A relative bound on lse fails when lse is near 0 (seen on an H200: lse = -0.356, relative
    error 1.5e-3). Checked offline against a TF32 emulation (0 of 300 random cases over 1) and an 8-bit-mantissa
    one (caught). Returns inf when the -inf rows differ. q (B, Hq, Nq, d), k (B, Hkv, Nk, d), ref float64.
    """
    lse, ref = _t(lse), _t(ref)
    if not torch.equal(torch.isinf(lse), torch.isinf(ref)):
        return float("inf")
    sc = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    qn = torch.linalg.vector_norm(_t(q), dim=-1)                                   # (B, Hq, Nq)
    kn = torch.linalg.vector_norm(_t(k), dim=-1).amax(dim=-1)                      # (B, Hkv)
    kn = kn.repeat_interleave(q.shape[1] // k.shape[1], dim=1)[..., None]         # (B, Hq, 1)
    fin = torch.isfinite(ref)
    if not bool(fin.any()):
        return 0.0
    return float(((lse - ref).abs()[fin] / (2.0 ** -10 * abs(sc) * qn * kn)[fin]).max())


#: bits of ``sum_i a_i b_i`` that the e4m3 tensor-core MMA keeps while it accumulates (into an fp32 register):
#: ``benchmarks/tuning/probe_fp8_accumulation.py`` on an H100 (``benchmarks/results/h100-fp8-accumulation.json``,
#: max |dS| / sum_i |a_i b_i| over 20 draws of 64 x 64 dots per K: 12.01 / 12.06 / 11.99 bits at K = 64 / 128 /
#: 256, the same at every K; float16 operands 22.1-22.4), rounded down to whole bits: 11 (a factor 2 of margin)
FP8_MMA_BITS = 11.0


def fp32_dot_bits(d: int) -> float:
    """Bits an fp32 dot product of length ``d`` keeps in the worst case: recursive summation in fp32 errs by at most
    ``(d - 1) u sum_i |a_i b_i|`` with ``u = 2^-24`` (Higham, Accuracy and Stability, eq. 3.5), and e4m3 products
    are exact in fp32; so ``24 - log2(d)`` (the FP8 kernels under the Triton interpreter)."""
    return 24.0 - math.log2(max(d, 1))


def fp8_lse_bound(q, k, causal=False, scale=None, bits=None) -> torch.Tensor:
    """Per-row bound ``(B, Hq, Nq)`` float64 on ``|lse - lse_64|`` for an FP8 forward, ``q, k`` its dequantised
    inputs ``(B, Hq, Nq, d)``, ``(B, Hkv, Nk, d)`` (the float64 reference ``attention_ref`` is fed the same).

    Each score ``S_j = scale sum_i q_i k_ji`` leaves the MMA with ``|dS_j| <= scale sum_i |q_i k_ji| 2^-bits``
    (``bits``: ``FP8_MMA_BITS`` on the GPU's e4m3 MMA, ``fp32_dot_bits(d)`` for fp32 dots); lse is a soft maximum
    of the row's scores, ``d lse = sum_j P_j dS_j``, so ``|d lse| <= max_j |dS_j|`` over the keys the row sees
    (bottom-right causal). Plus the fp32 softmax: the scores, ``m`` and the exp2 arguments rounded (``2^-22 (1 +
    max_j |S_j| + |lse|)``, MUFU.EX2's relative error included) and ``l`` summed over ``ceil(Nk / 128)`` key
    blocks of 128 (``(2 n_blocks + 40) 2^-24``: per block a sum of 32 per thread, 2 shuffle levels, the rescale
    and the add). Computed in float64 on the inputs' device; rows that see no key get 0.
    """
    bits = FP8_MMA_BITS if bits is None else bits
    q, k = q.detach().double(), k.detach().double()
    d = q.shape[-1]
    sc = abs(1.0 / math.sqrt(d) if scale is None else scale)
    ke = _expand_kv(k, q.shape[-3])
    sum_abs = sc * (q.abs() @ ke.abs().transpose(-1, -2))            # (B, Hq, Nq, Nk): scale sum_i |q_i k_ji|
    s = sc * (q @ ke.transpose(-1, -2))
    nq, nk = q.shape[-2], k.shape[-2]
    if causal:
        hide = ~allowed_mask(nq, nk).to(q.device)
        sum_abs, s = sum_abs.masked_fill(hide, 0.0), s.masked_fill(hide, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    lse = torch.where(torch.isfinite(lse), lse, 0.0)
    s_max = torch.where(torch.isfinite(s), s.abs(), 0.0).amax(dim=-1)
    mma = sum_abs.amax(dim=-1) * 2.0 ** -bits
    fp32 = 2.0 ** -22 * (1 + s_max + lse.abs()) + (2 * math.ceil(nk / 128) + 40) * 2.0 ** -24
    return mma + fp32


def fp8_lse_violation(lse, ref, q, k, causal=False, scale=None, bits=None) -> float:
    """Largest ``|lse - ref| / fp8_lse_bound(q, k, causal, scale, bits)`` over the rows where ``ref`` is finite (<= 1:
    within the bound); inf when the -inf rows differ or ``lse`` has NaN. ``ref``: float64 lse of ``q, k``."""
    ref = ref.detach().double()
    lse = lse.detach().double().to(ref.device)
    if torch.isnan(lse).any() or not torch.equal(torch.isinf(lse), torch.isinf(ref)):
        return float("inf")
    fin = torch.isfinite(ref)
    if not bool(fin.any()):
        return 0.0
    bound = fp8_lse_bound(q.to(ref.device), k.to(ref.device), causal, scale, bits)
    return float(((lse - ref).abs()[fin] / bound[fin]).max())


def decode_ref(q, k, v, seq_lens=None, scale=None):
    """float64 oracle: sequence b attends its first seq_lens[b] keys; a length of 0 gives 0."""
    B, Hq, d = q.shape
    n_max = k.shape[2]
    lens = [n_max] * B if seq_lens is None else [int(x) for x in seq_lens]
    out = torch.zeros(B, Hq, d, dtype=torch.float64)
    for b, n in enumerate(lens):
        if n > 0:
            o, _, _ = attention_ref(q[b, :, None, :], k[b, :, :n], v[b, :, :n], scale=scale)
            out[b] = o[:, 0]
    return out


def mixed_attention_ref(q, kv, q_lens):
    """A mixed prefill + decode batch, request by request: ``q (sum q_lens, Hq, d)`` against each request's whole
    ``(k, v)`` (``(n, Hkv, d)``), bottom-right causal; returns ``(o, lse (Hq, sum q_lens))`` as NumPy."""
    c = np.concatenate([[0], np.cumsum(q_lens)])
    o = np.zeros(q.shape)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    for b, (k, v) in enumerate(kv):
        if q_lens[b] == 0:
            continue
        ob, lb, _ = attention_ref(q[c[b]:c[b + 1]].transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2),
                                  causal=True)
        o[c[b]:c[b + 1]] = ob.numpy().transpose(1, 0, 2)
        lse[:, c[b]:c[b + 1]] = lb.numpy()
    return o, lse
