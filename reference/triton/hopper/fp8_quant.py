"""Fused FP8 quantisation of Q, K, V for the FP8 forwards: one Triton launch reads bf16 Q, K, V once and writes
e4m3 data and per-block scales in the layouts ``flash_fp8`` and ``flash_fp8_gluon`` consume.

``quantize_qkv_fp8(q, k, v, block_q, block_k, hadamard=False, seed=0, permute=False)`` computes, per block of
``block_q`` query rows / ``block_k`` key (value) rows of each head, what ``flash_fp8.quantize_fp8_blocks`` computes
with torch ops (FA3 paper, Shah et al. 2024, section 3.3):

1. (``hadamard``, Q and K only) the rotation ``x J`` with ``J = diag(s) H / sqrt(d)``
   (``reference.simulators.fp8_error.random_hadamard``): one ``tl.dot`` of the ``(block, d)`` tile with the
   ``+-1`` matrix ``diag(s) H`` in the input dtype (exact products, fp32 sums; fp32 inputs use IEEE fp32 dots),
   times ``1 / sqrt(d)`` in fp32;
2. ``scale = amax / 448`` of the block (1 for an all-zero block), ``data = e4m3(x / scale)`` (IEEE division,
   round to nearest even, as torch's cast);
3. the layouts: Q and K row-major ``(B, H, Npad, d)``; V transposed ``(B, H, d, Npad)`` (Hopper's FP8 wgmma reads
   its B operand K-major) and, with ``permute``, its keys renumbered within each 32-key chunk as
   ``permute_keys`` does (``16a + 8b + 2t + e -> 16a + 4t + 2b + e``, the order ``flash_fp8_gluon.p_operand``
   gives P's registers); padding rows are zeros.

Without the rotation the result is bitwise the torch path's; with it, data within one e4m3 step and scales
within float32 rounding (the sums run in another order). Non-finite input sets a flag the host reads once
(``check_finite``): ``ValueError`` naming the tensor, as the torch path raises.

The grid is one program per ``Q_PER_PROG`` query blocks or per ``KV_PER_PROG`` key blocks (a K block and the V
block of the same rows in one program); ``configs.FP8_QUANT_CONFIG`` pins them. Under the Triton interpreter the
float32 -> float8 cast rounds wrongly (``flash_fp8``'s docstring), so there the values are first rounded to the
e4m3 grid in float32 (``round_e4m3``: the add-and-subtract trick with a per-value magic number) and the cast
only stores exact values.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
import triton
import triton.language as tl

from .._checks import check_attention_inputs, check_flag, check_positive_int, check_tensor
from .._device import INTERPRET
from ..configs import FP8_QUANT_CONFIG, Fp8QuantConfig

FP8_DTYPE = torch.float8_e4m3fn
#: bit of the non-finite flag per tensor (``quantize_qkv_fp8``'s error names the tensor)
FLAG_BITS = {"q": 1, "k": 2, "v": 4}


# --------------------------------------------------------------------------------------------------------------
# torch side: the key renumbering (oracle) and the rotation's matrix
# --------------------------------------------------------------------------------------------------------------
def permute_keys(vt: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Renumber the keys (last axis, a multiple of 32) of ``V^T`` as ``flash_fp8_gluon.p_operand`` renumbers P's
    columns: within each 32-key chunk, key ``16a + 8b + 2t + e`` moves to ``16a + 4t + 2b + e`` (``a, b, e < 2``,
    ``t < 4``); ``inverse`` undoes it. Returns a contiguous copy."""
    *lead, n = vt.shape
    if n % 32:
        raise ValueError(f"vt: the key axis must be a multiple of 32, got {n}")
    mid = (2, 4, 2, 2) if inverse else (2, 2, 4, 2)
    x = vt.reshape(*lead, n // 32, *mid)
    r = len(lead) + 1
    return x.permute(*range(r), r, r + 2, r + 1, r + 3).reshape(*lead, n).contiguous()


def hadamard_matrix(d: int, seed: int, device) -> torch.Tensor:
    """``J = diag(random signs) H / sqrt(d)`` as float32 on ``device`` (``fp8_error.random_hadamard``, signs drawn
    from ``numpy.random.default_rng(seed)``); ``d`` a power of two."""
    from reference.simulators.fp8_error import random_hadamard
    j = random_hadamard(d, np.random.default_rng(seed))
    return torch.tensor(j, dtype=torch.float32, device=device)


@functools.lru_cache(maxsize=32)
def _signed_hadamard(d: int, seed: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
    """``(diag(s) H, |J_ij|)``: the ``+-1`` matrix in ``dtype`` (exact) and ``J``'s float32 magnitude, cached per
    (d, seed, device, dtype) so a call does no host work or copy for it."""
    j = hadamard_matrix(d, seed, "cpu")
    return torch.sign(j).to(device=device, dtype=dtype).contiguous(), float(j.abs()[0, 0])


# --------------------------------------------------------------------------------------------------------------
# kernel
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def round_e4m3(y):
    """``y`` (float32, ``|y| <= 448``) rounded to the nearest e4m3 value, ties to even, as float32: with ``e =
    max(floor(log2 |y|), -6)`` (e4m3's subnormals below ``2^-6`` share the step ``2^-9``) the step is ``2^(e-3)``,
    and ``(|y| + 1.5 * 2^(e+20)) - 1.5 * 2^(e+20)`` rounds ``|y|`` to it in float32 arithmetic (the sum's ulp is the
    step). The sign bit is copied (``-0`` stays ``-0``); saturates at 448 as ``cvt.rn.satfinite`` does."""
    bits = y.to(tl.uint32, bitcast=True)
    sign = bits & 0x80000000
    e = tl.maximum(((bits >> 23) & 0xFF).to(tl.int32) - 127, -6)
    magic = (((e + 147) << 23) | 0x400000).to(tl.float32, bitcast=True)
    r = tl.minimum((tl.abs(y) + magic) - magic, 448.0)
    return (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _quant_block(X, s_b, s_h, s_n, s_d, DATA, SCALE, HM, FLAG, g, N, NB, H, had_scale, CODE: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, HADAMARD: tl.constexpr, TRANSPOSE: tl.constexpr,
                 PERMUTE: tl.constexpr, IEEE: tl.constexpr, INTERP: tl.constexpr):
    """Block ``g`` (head-major: ``g = (b H + h) NB + j``) of one tensor: steps 1-3 of the module docstring."""
    bh = g // NB
    j = g % NB
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = j * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    x = tl.load(X + b * s_b + h * s_h + rows[:, None].to(tl.int64) * s_n + cols[None, :] * s_d,
                mask=rows[:, None] < N, other=0.0)
    if HADAMARD:  # x (diag(s) H) exactly in fp32 sums, then the 1 / sqrt(d) of J
        m = tl.load(HM + cols[:, None] * HEAD_DIM + cols[None, :])
        if INTERP:  # the interpreter's dot reads bf16 operands wrongly (amax 8e9 for N(0, 1) input): fp32 there
            xf = tl.dot(x.to(tl.float32), m.to(tl.float32), input_precision="ieee")
        elif IEEE:
            xf = tl.dot(x, m, input_precision="ieee")
        else:
            xf = tl.dot(x, m)
        xf = xf * had_scale
    else:
        xf = x.to(tl.float32)
    amax = tl.max(tl.max(tl.abs(xf), axis=1), axis=0)
    bad = tl.sum(tl.sum(xf * 0.0, axis=1), axis=0) != 0.0  # NaN iff some entry is NaN or inf
    tl.atomic_or(FLAG, CODE, mask=bad)
    scale = tl.where(amax > 0.0, tl.math.div_rn(amax, 448.0), 1.0)
    y = tl.math.div_rn(xf, tl.zeros_like(xf) + scale)
    if INTERP:  # the interpreter's float32 -> float8 cast rounds wrongly: round first, cast exact values
        y = round_e4m3(y)
    y8 = y.to(tl.float8e4nv)
    tl.store(SCALE + g, scale)
    npad = NB * BLOCK
    base = DATA + bh.to(tl.int64) * npad * HEAD_DIM
    if TRANSPOSE:
        t = tl.trans(y8)  # (HEAD_DIM, BLOCK)
        if PERMUTE:  # key 32c + 16a + 8b + 2t + e -> 32c + 16a + 4t + 2b + e (permute_keys)
            t = tl.reshape(t, [HEAD_DIM, BLOCK // 32, 2, 2, 4, 2])
            t = tl.permute(t, (0, 1, 2, 4, 3, 5))
            t = tl.reshape(t, [HEAD_DIM, BLOCK])
        tl.store(base + cols[:, None] * npad + rows[None, :], t)
    else:
        tl.store(base + rows[:, None] * HEAD_DIM + cols[None, :], y8)


@triton.jit
def _quant_qkv_kernel(Q, K, V, QD, KD, VD, QS, KS, VS, HM, FLAG,
                      sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                      H_Q, H_KV, N_Q, N_K, NB_Q, NB_K, Q_BLOCKS, KV_BLOCKS, Q_PROGS, had_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                      Q_PER_PROG: tl.constexpr, KV_PER_PROG: tl.constexpr, HADAMARD: tl.constexpr,
                      PERMUTE: tl.constexpr, IEEE: tl.constexpr, INTERP: tl.constexpr):
    """Programs ``< Q_PROGS`` quantise ``Q_PER_PROG`` consecutive query blocks each, the others ``KV_PER_PROG``
    key blocks of K and the same blocks of V. A program past the last block redoes the last one (same bytes)."""
    pid = tl.program_id(0)
    if pid < Q_PROGS:
        for i in tl.static_range(Q_PER_PROG):
            g = tl.minimum(pid * Q_PER_PROG + i, Q_BLOCKS - 1)
            _quant_block(Q, sqb, sqh, sqn, sqd, QD, QS, HM, FLAG, g, N_Q, NB_Q, H_Q, had_scale, 1, HEAD_DIM,
                         BLOCK_Q, HADAMARD, False, False, IEEE, INTERP)
    else:
        for i in tl.static_range(KV_PER_PROG):
            g = tl.minimum((pid - Q_PROGS) * KV_PER_PROG + i, KV_BLOCKS - 1)
            _quant_block(K, skb, skh, skn, skd, KD, KS, HM, FLAG, g, N_K, NB_K, H_KV, had_scale, 2, HEAD_DIM,
                         BLOCK_K, HADAMARD, False, False, IEEE, INTERP)
            _quant_block(V, svb, svh, svn, svd, VD, VS, HM, FLAG, g, N_K, NB_K, H_KV, had_scale, 4, HEAD_DIM,
                         BLOCK_K, False, True, PERMUTE, IEEE, INTERP)


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
def check_quant_config(config) -> Fp8QuantConfig:
    """``config``: a ``configs.Fp8QuantConfig`` (default ``configs.FP8_QUANT_CONFIG``); return it."""
    if config is None:
        return FP8_QUANT_CONFIG
    if type(config) is not Fp8QuantConfig:
        raise TypeError(f"config must be a reference.triton.configs.Fp8QuantConfig or None, got {config!r}")
    return config


def check_quant_args(q, k, v, block_q, block_k, hadamard, seed, permute):
    """Validate ``quantize_qkv_fp8``'s arguments (each error names its argument); return ``(B, Hq, Hkv, Nq, Nk,
    d)``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(x, name, ndim=4)
    d = q.shape[-1]
    if d & (d - 1) or not 16 <= d <= 256:
        what = "the Hadamard rotation (hadamard=True) and the kernel's tile" if hadamard else "the kernel's tile"
        raise ValueError(f"head dimension d (q.shape[-1]) must be a power of two in 16..256 for {what}, got {d}")
    B, Hq, Hkv, Nq, Nk, d, _ = check_attention_inputs(q, k, v, head_dims=(d,))
    for name, val, least in (("block_q", block_q, 16), ("block_k", block_k, 32)):
        check_positive_int(val, name)
        if val & (val - 1) or val < least:
            raise ValueError(f"{name} must be a power of two >= {least}, got {val}")
    check_flag(hadamard, "hadamard")
    check_flag(permute, "permute")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TypeError(f"seed must be a non-negative int, got {seed!r}")
    return B, Hq, Hkv, Nq, Nk, d


def quantize_qkv_fp8(q, k, v, block_q: int = 64, block_k: int = 128, hadamard: bool = False, seed: int = 0,
                     permute: bool = False, check_finite: bool = True, config=None, flag=None):
    """Quantise ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)`` (float16 / bfloat16 / float32, any strides) to e4m3
    in one launch (module docstring). Returns ``(q_data, q_scale, k_data, k_scale, vt_data, v_scale)``:
    ``q_data (B, Hq, cdiv(Nq, block_q) block_q, d)``, ``k_data`` alike with ``block_k``, ``vt_data (B, Hkv, d,
    Npad_k)`` (keys renumbered if ``permute``), all ``float8_e4m3fn`` contiguous; scales float32 ``(B, H, blocks)``.
    ``check_finite``: read the kernel's non-finite flag (one device-to-host copy) and raise ``ValueError`` naming
    the tensor; writes nothing the caller sees then. ``flag``: an int32 tensor of one zero the kernel ORs its
    bits into (``FLAG_BITS``), for a caller that reads it later with ``raise_if_nonfinite`` (pass
    ``check_finite=False``): the attention can then be launched before the host waits for the flag."""
    B, Hq, Hkv, Nq, Nk, d = check_quant_args(q, k, v, block_q, block_k, hadamard, seed, permute)
    check_flag(check_finite, "check_finite")
    cfg = check_quant_config(config)
    dev = q.device
    nbq, nbk = -(-Nq // block_q), -(-Nk // block_k)
    qd = torch.empty((B, Hq, nbq * block_q, d), dtype=FP8_DTYPE, device=dev)
    kd = torch.empty((B, Hkv, nbk * block_k, d), dtype=FP8_DTYPE, device=dev)
    vd = torch.empty((B, Hkv, d, nbk * block_k), dtype=FP8_DTYPE, device=dev)
    qs = torch.empty((B, Hq, nbq), dtype=torch.float32, device=dev)
    ks = torch.empty((B, Hkv, nbk), dtype=torch.float32, device=dev)
    vs = torch.empty((B, Hkv, nbk), dtype=torch.float32, device=dev)
    if flag is None:
        flag = torch.zeros(1, dtype=torch.int32, device=dev)
    elif not (isinstance(flag, torch.Tensor) and flag.dtype == torch.int32 and flag.numel() == 1
              and flag.device == dev):
        raise ValueError(f"flag must be an int32 tensor of one element on {dev}, got {flag!r}")
    if hadamard:
        hm, had_scale = _signed_hadamard(d, seed, str(dev), q.dtype)
    else:
        hm, had_scale = flag, 1.0  # not read
    q_blocks, kv_blocks = B * Hq * nbq, B * Hkv * nbk
    q_progs = -(-q_blocks // cfg.q_per_program)
    grid = (q_progs + -(-kv_blocks // cfg.kv_per_program),)
    _quant_qkv_kernel[grid](q, k, v, qd, kd, vd, qs, ks, vs, hm, flag, *q.stride(), *k.stride(), *v.stride(),
                            Hq, Hkv, Nq, Nk, nbq, nbk, q_blocks, kv_blocks, q_progs, had_scale,
                            HEAD_DIM=d, BLOCK_Q=block_q, BLOCK_K=block_k, Q_PER_PROG=cfg.q_per_program,
                            KV_PER_PROG=cfg.kv_per_program, HADAMARD=hadamard, PERMUTE=permute,
                            IEEE=q.dtype == torch.float32, INTERP=INTERPRET, num_warps=cfg.num_warps)
    if check_finite:
        raise_if_nonfinite(flag)
    return qd, qs, kd, ks, vd, vs


def check_finite_mode(check_finite, name: str) -> bool:
    """The FP8 entry points' ``check_finite`` argument: a bool; ``True`` under CUDA-graph capture is refused by
    name before anything is launched (reading the non-finite flag is a device-to-host copy, which capture does
    not allow: pass ``check_finite=False`` there)."""
    check_flag(check_finite, "check_finite")
    if check_finite and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise ValueError(f"{name}: check_finite=True reads the quantisation's non-finite flag on the host, which a "
                         "CUDA-graph capture does not allow; pass check_finite=False to capture it (non-finite "
                         "inputs are then not reported)")
    return check_finite


def raise_if_nonfinite(flag: torch.Tensor) -> None:
    """Read the quantisation's non-finite flag (one device-to-host copy: it waits for the kernels queued so far)
    and raise ``ValueError`` naming the tensors that held NaN or inf."""
    bits = int(flag.item())
    if bits:
        names = [n for n, bit in FLAG_BITS.items() if bits & bit]
        raise ValueError(f"{', '.join(names)} must be finite to be quantised to fp8 (found NaN or inf)")


def quant_bytes(q, k, v, block_q: int = 64, block_k: int = 128) -> int:
    """Bytes a fused quantisation must move: Q, K, V read once, e4m3 data (padded) and float32 scales written."""
    B, Hq, Nq, d = q.shape
    _, Hkv, Nk, _ = k.shape
    nbq, nbk = -(-Nq // block_q), -(-Nk // block_k)
    read = (q.numel() + k.numel() + v.numel()) * q.element_size()
    written = B * Hq * nbq * block_q * d + 2 * B * Hkv * nbk * block_k * d + 4 * (B * Hq * nbq + 2 * B * Hkv * nbk)
    return read + written


def compile_quant(head_dim: int = 128, hadamard: bool = False, permute: bool = True, config=None):
    """Compile the kernel for sm_90a without a GPU (``TRITON_INTERPRET=0``) for bf16 inputs, 64 / 128-row blocks:
    ``_aot.resource_usage`` reads its registers and spills."""
    from ._aot import compile_triton
    cfg = check_quant_config(config)
    sig = {n: "*bf16" for n in ("Q", "K", "V")}
    sig.update({n: "*fp8e4nv" for n in ("QD", "KD", "VD")})
    sig.update(QS="*fp32", KS="*fp32", VS="*fp32", HM="*bf16", FLAG="*i32")
    sig.update({n: "i32" for n in ("sqb", "sqh", "sqn", "sqd", "skb", "skh", "skn", "skd", "svb", "svh", "svn",
                                   "svd", "H_Q", "H_KV", "N_Q", "N_K", "NB_Q", "NB_K", "Q_BLOCKS", "KV_BLOCKS",
                                   "Q_PROGS")})
    sig["had_scale"] = "fp32"
    # contiguous inputs, as a launch specialises them: unit stride along d, the others multiples of 16
    cx = dict(HEAD_DIM=head_dim, BLOCK_Q=64, BLOCK_K=128, Q_PER_PROG=cfg.q_per_program,
              KV_PER_PROG=cfg.kv_per_program, HADAMARD=hadamard, PERMUTE=permute, IEEE=False, INTERP=False,
              sqd=1, skd=1, svd=1)
    divisible = ("Q", "K", "V", "QD", "KD", "VD", "QS", "KS", "VS", "HM", "sqb", "sqh", "sqn", "skb", "skh", "skn",
                 "svb", "svh", "svn")
    return compile_triton(_quant_qkv_kernel, sig, cx, cfg.num_warps, 1, divisible=divisible)


__all__ = ["quantize_qkv_fp8", "raise_if_nonfinite", "permute_keys", "hadamard_matrix", "round_e4m3", "quant_bytes", "compile_quant",
           "check_quant_config", "FLAG_BITS"]
