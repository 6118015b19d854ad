"""FP8 (e4m3) FlashAttention forward with per-block scales and an optional random Hadamard rotation.

``flash_attention_forward_fp8(q, k, v, causal=False, scale=None, hadamard=False, seed=0) -> (o, lse)`` is the
FlashAttention-3 paper's FP8 forward (Shah et al., 2024, section 3.3) on top of FA2 Algorithm 1:

1. (``hadamard=True``) incoherent processing: ``Q <- Q J``, ``K <- K J`` with ``J = diag(s) H / sqrt(d)`` a random
   Hadamard matrix (``reference.simulators.fp8_error.random_hadamard``). ``J J^T = I`` so ``S = Q K^T`` is unchanged in exact
   arithmetic, but an outlier channel is spread over all ``d`` channels before rounding.
2. Block quantisation (``quantize_fp8_blocks``): each block of ``BLOCK_M`` query rows, and of ``BLOCK_N`` key /
   value rows, of each head gets its own scale ``amax / 448`` and is rounded to ``float8_e4m3fn``.
3. The kernel: ``S_ij = (Q8_i K8_j^T) * (sq_i sk_j * scale)`` with fp32 accumulation; online softmax in fp32 with
   ``exp2``; ``P`` rounded to e4m3 and ``O_i += P8 V8_j`` on the FP8 tensor cores, fp32 accumulation;
   ``o`` written in bfloat16 and the natural-log ``lse`` in fp32.

Two scalings keep the kernel's inner loop free of extra per-element work (each folds into the ``exp2``
argument, a per-row vector, so the P @ V product stays in the MMA's accumulate form):

* ``P`` is in ``(0, 1]``; e4m3's smallest normal is ``2^-6``, so the kernel computes ``256 * P`` (``exp2(s - m + 8)``)
  and divides it out at the end (``o = acc / l`` with ``l`` scaled alike; ``lse`` subtracts 8 in base 2).
* V's per-block scale ``sv_j`` is folded into P: with ``c_j = log2(sv_j / max_j sv_j) <= 0`` the kernel rounds
  ``P * 2^c_j`` and adds ``rowsum(P)`` (unscaled) to ``l``; the output is multiplied by ``max_j sv_j`` once.

V is stored transposed (``(B, H, d, N)``): Hopper's FP8 WGMMA reads its B operand K-major only, and for
``P @ V`` the reduction axis is the key axis.

Requirements: on a GPU, compute capability 9.0 (Hopper) or newer (FP8 tensor-core MMA); elsewhere
``flash_attention_forward_fp8`` raises ``RuntimeError`` naming it. Under the Triton interpreter the kernel runs
too, with one difference: the interpreter's float32 -> float8 cast rounds wrongly (0.4963 -> 0.25, measured), so
there ``P`` is kept in float32 for ``P @ V``. Q, K, V are quantised by one fused Triton launch on a GPU
(``fp8_quant.quantize_qkv_fp8``, bitwise the torch path without the rotation) and by torch ops under the
interpreter (``prepare_fp8(fused=...)`` picks either).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import _device
from .._checks import FLOAT_DTYPES, check_attention_inputs, check_flag, check_positive_int, check_scale, check_tensor
from .._device import INTERPRET
from .._kernel_helpers import LN2, LOG2E, causal_key_range, mask_running_max
from .fp8_quant import check_finite_mode, hadamard_matrix, permute_keys, quantize_qkv_fp8, raise_if_nonfinite

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
#: head dimensions the FP8 kernel is compiled for (an FP8 MMA needs a reduction axis of at least 32).
FP8_HEAD_DIMS = (32, 64, 128)
P_SHIFT = 8.0  # log2 of the factor P is multiplied by before rounding to e4m3
#: (BLOCK_M, BLOCK_N, num_warps, num_stages) used on a GPU; the interpreter uses small blocks.
# GPU: the best of four configs measured on an H100 at d=128, N=4k (notes/hopper.md).
CONFIG: dict = ({"BLOCK_M": 32, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1} if INTERPRET else
                {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3})
MIN_CAPABILITY = (9, 0)


# --------------------------------------------------------------------------------------------------------------
# host-side quantisation
# --------------------------------------------------------------------------------------------------------------
@dataclass
class Fp8Blocks:
    """A ``(B, H, N, d)`` tensor quantised to e4m3 in blocks of ``block`` rows along N.

    ``data``: float8_e4m3fn, ``(B, H, Npad, d)`` or, if ``transposed``, ``(B, H, d, Npad)``, contiguous, with
    ``Npad = cdiv(N, block) * block`` (padding rows are zeros). ``scale``: float32 ``(B, H, cdiv(N, block))``;
    row ``r`` of the original is ``data[r] * scale[r // block]``.
    """
    data: torch.Tensor
    scale: torch.Tensor
    block: int
    n: int
    transposed: bool = False

    def dequantize(self) -> torch.Tensor:
        """The float32 ``(B, H, N, d)`` tensor these blocks stand for (what the kernel multiplies)."""
        x = self.data.float()
        if self.transposed:
            x = x.transpose(-1, -2)
        x = x * self.scale.repeat_interleave(self.block, dim=-1)[..., None]
        return x[..., :self.n, :]


def quantize_fp8_blocks(x: torch.Tensor, block: int, transposed: bool = False) -> Fp8Blocks:
    """Round ``x (B, H, N, d)`` to e4m3 with one scale ``amax / 448`` per block of ``block`` rows of each head.

    An all-zero block gets scale 1 (its data is zeros). Non-finite input raises ``ValueError`` (a NaN or inf
    would poison the whole block's scale).
    """
    check_tensor(x, "x", ndim=4, dtypes=(*FLOAT_DTYPES, torch.float64), device=False)
    block = check_positive_int(block, "block")
    check_flag(transposed, "transposed")
    B, H, N, d = x.shape
    nb = -(-N // block)
    xf = x.float()
    if nb * block != N:
        xf = torch.nn.functional.pad(xf, (0, 0, 0, nb * block - N))
    xb = xf.view(B, H, nb, block, d)
    amax = xb.abs().amax(dim=(-1, -2))
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("x must be finite to be quantised to fp8 (found NaN or inf)")
    # a tensor divisor: PyTorch's CUDA kernels divide by a Python scalar as a multiply by its reciprocal (1 ulp off
    # amax / 448 in some blocks, measured on an H100), by a tensor with IEEE division, as on CPU and in fp8_quant
    scale = torch.where(amax > 0, amax / torch.full_like(amax, FP8_MAX), torch.ones_like(amax))
    data = (xb / scale[..., None, None]).to(FP8_DTYPE).view(B, H, nb * block, d)
    if transposed:
        data = data.transpose(-1, -2)
    return Fp8Blocks(data.contiguous(), scale.contiguous(), block, N, transposed)


@dataclass
class Fp8KeyPermuted(Fp8Blocks):
    """``V^T`` quantised as ``Fp8Blocks(transposed=True)``, its keys renumbered by ``fp8_quant.permute_keys`` (the
    order the Gluon FP8 kernel's P operand uses); ``dequantize`` undoes the renumbering."""

    def dequantize(self) -> torch.Tensor:
        plain = Fp8Blocks(permute_keys(self.data, inverse=True), self.scale, self.block, self.n, True)
        return plain.dequantize()


def rotate(x: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """``x @ J`` in float32 (the rotation of FA3 section 3.3; ``(x J)(y J)^T = x y^T``)."""
    return x.float() @ j


# --------------------------------------------------------------------------------------------------------------
# kernel
# --------------------------------------------------------------------------------------------------------------
@triton.jit
def _fp8_block(acc, l_i, m_i, q, k_base, vt_base, SK, SV_LOG2, start_n, offs_m, offs_n, offs_d,
               N_K, N_PAD_K, OFFSET, q_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, MASKED: tl.constexpr, INTERP: tl.constexpr):
    """FA2 Algorithm 1, lines 7-10, for one FP8 key block (module docstring: the P and V scalings)."""
    jb = start_n // BLOCK_N
    # K_j and V_j^T tiles: padded to whole blocks on the host, so no load needs a mask
    k = tl.load(k_base + (start_n + offs_n)[:, None] * HEAD_DIM + offs_d[None, :])
    s = tl.dot(q, tl.trans(k)) * (q_scale * tl.load(SK + jb))
    s, m_new, m_use = mask_running_max(s, m_i, start_n, offs_m, offs_n, N_K, OFFSET, CAUSAL, MASKED)
    c = tl.load(SV_LOG2 + jb)  # log2(sv_j / max sv) <= 0
    p = tl.math.exp2(s - (m_use - 8.0 - c)[:, None])  # 256 * P * sv_j / max sv
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1) * tl.math.exp2(-c)
    vt = tl.load(vt_base + offs_d[:, None] * N_PAD_K + (start_n + offs_n)[None, :])
    acc = acc * alpha[:, None]
    if INTERP:  # the interpreter's fp32 -> fp8 cast rounds wrongly: keep P in fp32 there
        acc = tl.dot(p, tl.trans(vt).to(tl.float32), acc)
    else:
        acc = tl.dot(p.to(tl.float8e4nv), tl.trans(vt), acc)
    return acc, l_i, m_new


@triton.jit
def _fp8_key_blocks(acc, l_i, m_i, q, k_base, vt_base, SK, SV_LOG2, lo, hi, offs_m, offs_n, offs_d,
                    N_K, N_PAD_K, OFFSET, q_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, MASKED: tl.constexpr, INTERP: tl.constexpr):
    """FA2 Algorithm 1, line 6: key blocks ``[lo, hi)``."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        acc, l_i, m_i = _fp8_block(acc, l_i, m_i, q, k_base, vt_base, SK, SV_LOG2, start_n, offs_m, offs_n,
                                   offs_d, N_K, N_PAD_K, OFFSET, q_scale, HEAD_DIM, BLOCK_N, CAUSAL, MASKED,
                                   INTERP)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_fp8(Q, K, VT, SQ, SK, SV_LOG2, SV_MAX, O, LSE,
                  H_Q, H_KV, GROUP, N_Q, N_K, N_PAD_Q, N_PAD_K, sm_scale_log2,
                  HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                  INTERP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program = one FP8 query block of one (batch, query head): FA2 Algorithm 1, lines 4-15."""
    pid_m = tl.program_id(0)
    if CAUSAL:  # heaviest query blocks first
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // H_Q
    h = pid_bh % H_Q
    bhk = (b * H_KV + h // GROUP).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_base = K + bhk * N_PAD_K * HEAD_DIM
    vt_base = VT + bhk * N_PAD_K * HEAD_DIM
    SK += bhk * (N_PAD_K // BLOCK_N)
    SV_LOG2 += bhk * (N_PAD_K // BLOCK_N)

    q = tl.load(Q + pid_bh.to(tl.int64) * N_PAD_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :])
    q_scale = tl.load(SQ + pid_bh.to(tl.int64) * (N_PAD_Q // BLOCK_M) + pid_m) * sm_scale_log2
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    OFFSET = N_K - N_Q
    full_end, hi = causal_key_range(start_m, N_K, OFFSET, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _fp8_key_blocks(acc, l_i, m_i, q, k_base, vt_base, SK, SV_LOG2, 0, full_end, offs_m, offs_n,
                                    offs_d, N_K, N_PAD_K, OFFSET, q_scale, HEAD_DIM, BLOCK_N, CAUSAL, False,
                                    INTERP)
    acc, l_i, m_i = _fp8_key_blocks(acc, l_i, m_i, q, k_base, vt_base, SK, SV_LOG2, full_end, hi, offs_m, offs_n,
                                    offs_d, N_K, N_PAD_K, OFFSET, q_scale, HEAD_DIM, BLOCK_N, CAUSAL, True,
                                    INTERP)
    # lines 12-15; acc and l carry the factor 256 (cancels in acc / l), acc also 1 / max sv
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc * (tl.load(SV_MAX + bhk) / l_safe)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe) - 8.0) * LN2)
    row_ok = offs_m < N_Q
    tl.store(LSE + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=row_ok)
    o_ptrs = O + pid_bh.to(tl.int64) * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
def _device_capability(device) -> tuple[int, int]:
    return tuple(_device.device_limits(device).capability)


def check_fp8_device(device) -> None:
    """FP8 tensor-core MMA needs compute capability >= 9.0 (Hopper); raise ``RuntimeError`` naming it."""
    if INTERPRET:
        return
    cap = _device_capability(device)
    if tuple(cap) < MIN_CAPABILITY:
        name = _device.device_limits(device).name if torch.cuda.is_available() else str(device)
        raise RuntimeError(
            f"flash_attention_forward_fp8 needs a GPU of compute capability >= 9.0 (Hopper: H100/H200 or newer) "
            f"for FP8 e4m3 tensor-core matmuls; this GPU ({name}) has compute capability {cap[0]}.{cap[1]}")


@dataclass
class Fp8Inputs:
    """Q, K, V quantised for the kernel (``prepare_fp8``): reuse it to time the kernel alone."""
    q: Fp8Blocks
    k: Fp8Blocks
    v: Fp8Blocks  # transposed
    group: int
    scale: float
    causal: bool
    #: the fused quantisation's non-finite flag, not yet read (``prepare_fp8(..., defer_check=True)``): the
    #: attention reads it after its own launch and raises there
    pending_flag: torch.Tensor | None = None


def prepare_fp8(q, k, v, causal=False, scale=None, hadamard=False, seed=0, block_m=None, block_n=None,
                permute_v=False, fused=None, defer_check=False):
    """Validate, optionally rotate Q and K by a random Hadamard matrix, and quantise: return ``Fp8Inputs``.

    ``fused`` (default: on a GPU, not under the interpreter): one launch of ``fp8_quant.quantize_qkv_fp8``;
    otherwise torch ops (``rotate``, ``quantize_fp8_blocks``), the oracle the fused kernel is tested against.
    ``permute_v``: ``V^T``'s keys renumbered for the Gluon kernel (an ``Fp8KeyPermuted``). ``defer_check``
    (fused path): do not wait here for the non-finite flag; the attention call on these inputs reads it after
    launching its kernel and raises the same ``ValueError`` (the entry points do this, so the GPU does not idle
    between the two launches while the host waits)."""
    B, Hq, Hkv, Nq, Nk, d, group = check_attention_inputs(q, k, v, head_dims=FP8_HEAD_DIMS)
    causal = check_flag(causal, "causal")
    scale = check_scale(scale, d)
    hadamard = check_flag(hadamard, "hadamard")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TypeError(f"seed must be a non-negative int, got {seed!r}")
    bm = check_positive_int(CONFIG["BLOCK_M"] if block_m is None else block_m, "block_m")
    bn = check_positive_int(CONFIG["BLOCK_N"] if block_n is None else block_n, "block_n")
    # block_n is the reduction length of P @ V, and an FP8 MMA reduces over at least 32 elements
    for name, val, least in (("block_m", bm, 16), ("block_n", bn, 32)):
        if val & (val - 1) or val < least:
            raise ValueError(f"{name} must be a power of two >= {least}, got {val}")
    permute_v = check_flag(permute_v, "permute_v")
    fused = (not INTERPRET) if fused is None else check_flag(fused, "fused")
    defer_check = check_flag(defer_check, "defer_check")
    check_fp8_device(q.device)
    vcls = Fp8KeyPermuted if permute_v else Fp8Blocks
    if fused:
        flag = torch.zeros(1, dtype=torch.int32, device=q.device)
        qd, qs, kd, ks, vd, vs = quantize_qkv_fp8(q, k, v, bm, bn, hadamard=hadamard, seed=seed, permute=permute_v,
                                                  check_finite=not defer_check, flag=flag)
        return Fp8Inputs(Fp8Blocks(qd, qs, bm, Nq), Fp8Blocks(kd, ks, bn, Nk), vcls(vd, vs, bn, Nk, True), group,
                         scale, causal, flag if defer_check else None)
    if hadamard:
        j = hadamard_matrix(d, seed, q.device)
        q, k = rotate(q, j), rotate(k, j)
    vq = quantize_fp8_blocks(v, bn, transposed=True)
    if permute_v:
        vq = Fp8KeyPermuted(permute_keys(vq.data), vq.scale, vq.block, vq.n, True)
    return Fp8Inputs(quantize_fp8_blocks(q, bm), quantize_fp8_blocks(k, bn), vq, group, scale, causal)


def attention_fp8(x: Fp8Inputs, out_dtype=torch.bfloat16, config=None, return_kernel=False):
    """Run the FP8 kernel on prepared inputs: ``(o (B, Hq, Nq, d) out_dtype, lse (B, Hq, Nq) float32)``.

    ``config`` overrides ``num_warps`` / ``num_stages`` (the blocks are the quantisation blocks);
    ``return_kernel`` also returns the compiled Triton kernel (registers, SASS) as a third item."""
    cfg = dict(CONFIG if config is None else config)
    if isinstance(x.v, Fp8KeyPermuted):
        raise ValueError("x: V^T's keys are renumbered for the Gluon FP8 kernel (permute_v=True); this kernel "
                         "reads them in order: prepare_fp8(..., permute_v=False)")
    bm, bn = x.q.block, x.k.block
    B, Hq, nq_pad, d = x.q.data.shape
    Hkv = x.k.data.shape[1]
    nk_pad = x.k.data.shape[2]
    nq, nk = x.q.n, x.k.n
    sv = x.v.scale
    sv_max = sv.amax(dim=-1).contiguous()
    sv_log2 = torch.log2(sv / sv_max[..., None]).contiguous()
    o = torch.empty((B, Hq, nq, d), dtype=out_dtype, device=x.q.data.device)
    lse = torch.empty((B, Hq, nq), dtype=torch.float32, device=x.q.data.device)
    grid = (nq_pad // bm, B * Hq)
    kern = _attn_fwd_fp8[grid](x.q.data, x.k.data, x.v.data, x.q.scale, x.k.scale, sv_log2, sv_max, o, lse,
                        Hq, Hkv, x.group, nq, nk, nq_pad, nk_pad, x.scale * LOG2E.value,
                        HEAD_DIM=d, CAUSAL=x.causal, INTERP=INTERPRET,
                        BLOCK_M=bm, BLOCK_N=bn, num_warps=cfg.get("num_warps", 4),
                        num_stages=cfg.get("num_stages", 2))
    if x.pending_flag is not None:  # prepare_fp8(defer_check=True): raise now, the outputs are dropped
        raise_if_nonfinite(x.pending_flag)
    return (o, lse, kern) if return_kernel else (o, lse)


def compile_fp8(head_dim: int = 128, causal: bool = True):
    """Compile the kernel for sm_90a without a GPU (run with ``TRITON_INTERPRET=0``), with the GPU ``CONFIG``'s
    64 x 128 blocks, 4 warps, 3 stages; ``_aot.resource_usage`` reads registers, spills and SASS."""
    from ._aot import compile_triton
    sig = {n: "*fp8e4nv" for n in ("Q", "K", "VT")}
    sig.update(SQ="*fp32", SK="*fp32", SV_LOG2="*fp32", SV_MAX="*fp32", O="*bf16", LSE="*fp32", H_Q="i32",
               H_KV="i32", GROUP="i32", N_Q="i32", N_K="i32", N_PAD_Q="i32", N_PAD_K="i32", sm_scale_log2="fp32")
    cx = dict(HEAD_DIM=head_dim, CAUSAL=causal, INTERP=False, BLOCK_M=64, BLOCK_N=128)
    return compile_triton(_attn_fwd_fp8, sig, cx, 4, 3)


def flash_attention_forward_fp8(q, k, v, causal=False, scale=None, hadamard=False, seed=0, config=None,
                                check_finite=True):
    """FP8 (e4m3) FlashAttention forward: return ``(o, lse)``; ``o`` is bfloat16, ``lse`` float32 natural log.

    ``q (B, Hq, Nq, d)``, ``k, v (B, Hkv, Nk, d)`` float16/bfloat16/float32 on ``reference.triton.DEVICE``,
    ``d`` in {32, 64, 128}, GQA and bottom-right causal as ``flash_attention_forward``. Q, K, V are quantised in
    blocks (``CONFIG``'s ``BLOCK_M`` query rows, ``BLOCK_N`` key rows, one scale each); ``hadamard=True`` first
    rotates Q and K by ``J = diag(s) H / sqrt(d)`` with random signs drawn from ``seed``. Needs a Hopper GPU
    (compute capability >= 9.0) or the interpreter; raises ``RuntimeError`` otherwise. ``config``: a dict with
    ``BLOCK_M, BLOCK_N, num_warps, num_stages`` (default ``CONFIG``, the module's pin, never changed from outside).
    ``check_finite`` (default True): NaN / inf in q, k or v raises ``ValueError`` naming the tensor, which costs
    one device-to-host read per call, after the attention's launch; ``False`` skips that read on the fused GPU
    quantisation (no host sync: the call can be captured into a CUDA graph; non-finite inputs are then not
    reported and the outputs they touch are undefined). The torch quantisation (CPU interpreter) always checks.
    """
    check_finite = check_finite_mode(check_finite, "flash_attention_forward_fp8")
    cfg = CONFIG if config is None else config
    if not isinstance(cfg, dict) or set(cfg) != {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}:
        raise ValueError(f"config must be a dict with keys BLOCK_M, BLOCK_N, num_warps, num_stages, got {config!r}")
    x = prepare_fp8(q, k, v, causal=causal, scale=scale, hadamard=hadamard, seed=seed, block_m=cfg["BLOCK_M"],
                    block_n=cfg["BLOCK_N"], defer_check=True)
    if not check_finite:
        x = dataclasses.replace(x, pending_flag=None)
    return attention_fp8(x, config={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})


__all__ = ["flash_attention_forward_fp8", "prepare_fp8", "attention_fp8", "quantize_fp8_blocks", "Fp8Blocks",
           "Fp8KeyPermuted", "Fp8Inputs", "hadamard_matrix", "check_fp8_device", "CONFIG", "FP8_HEAD_DIMS"]
