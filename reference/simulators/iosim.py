"""An IO model of a GPU: HBM plus an on-chip SRAM of ``M`` bytes (FlashAttention paper, section 3.2).

For standard attention and for FlashAttention (forward and backward) it counts, pass by pass, the FLOPs and the
HBM bytes read and written for given ``(batch, heads, N, d, dtype, sram_bytes)``. Nothing is executed: every
number is a closed-form count of what the algorithm listing loads and stores. Run ``python -m reference.simulators.iosim``
for the seeds' table and the scaling sweep (``--json PATH`` also writes the numbers).

The model
---------
* Two memories. HBM is large and slow; SRAM holds ``M = sram_bytes`` bytes. A value is read from HBM each time
  an algorithm line says "load ... from HBM", and written each time it says "write ... to HBM". Caches (L2)
  are ignored, so counts are upper bounds on DRAM traffic of a real kernel.
* Standard attention (paper Algorithm 0, plus the elementwise passes of the PyTorch code that was measured):
  every op is its own kernel, reads its inputs from HBM and writes its output to HBM. A matmul reads each input
  once (this is what Theorem 2's Theta(N d + N^2) assumes; it holds when a row block of Q fits in SRAM).
  Forward passes (each can be toggled)::

      S = scale * Q K^T   read Q, K      write S         (scale fused into the matmul, as torch.baddbmm(alpha=))
      [scale pass]        read S         write S         (scale_pass=True: a separate ``S / sqrt(d)``)
      [mask pass]         read S         write S         (additive mask ``S + M``; its gradient is the identity)
      P = softmax(S)      read S         write P
      [dropout pass]      read P         write P', mask  (torch.nn.functional.dropout keeps a 1-byte bool mask)
      O = P' V            read P', V     write O

  Backward passes (autograd of the above)::

      dV = P'^T dO        read P', dO    write dV
      dP' = dO V^T        read dO, V     write dP'
      [dropout bwd]       read dP', mask write dP
      dS = softmax_bwd    read dP, P     write dS        (dS = P * (dP - rowsum(dP * P)))
      [scale bwd]         read dS        write dS
      dQ = dS K * scale   read dS, K     write dQ
      dK = dS^T Q * scale read dS, Q     write dK

  The "measured PyTorch implementation" of the FlashAttention paper (its Figure 2, GPT-2 medium) is modelled
  as: scale fused into the first matmul, a mask pass, softmax, a dropout pass (p = 0.1, GPT-2's attention
  dropout). These are the defaults of :func:`seeds_table`.
* FlashAttention-1 (``version="fa1"``; FA1 paper Algorithm 1 forward, Algorithm 4 backward): block sizes
  ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)`` with ``M`` counted in elements (``sram_bytes / bytes per
  element``), Algorithm 1 line 1. The outer loop runs over K/V blocks (line 5), so K and V are read once and Q,
  O, l, m are read and written once per K/V block: ``T_c = ceil(N / B_c)`` times. That is the
  Theta(N^2 d^2 / M) of Theorem 2: ``T_c * N d = 4 N^2 d^2 / M``.
* FlashAttention-2 (``version="fa2"``; FA2 paper Algorithms 1 and 2): the loops are swapped, so Q is read once,
  O and the log-sum-exp L are written once, and K, V are re-read ``T_r = ceil(N / B_r)`` times. FA2 picks block
  sizes from {64, 128} by hand; the model takes the largest power of two ``B_r = B_c <= 128`` whose working set
  (Q_i, K_j, V_j in the input dtype, the S tile and the O accumulator in fp32) fits in ``M``. Because of the cap
  FA2's traffic stops falling once the 128-tiles fit, so the M^-1 law is a statement about FA1's block choice.
  Backward (FA2 Algorithm 2): a preprocessing kernel ``D = rowsum(dO * O)``; then per K/V block an inner loop
  over Q blocks that reads Q_i, dO_i, dQ_i, L_i, D_i and writes dQ_i back (line 8 also lists O_i; it is not
  needed once D is precomputed and is not counted).
* Statistics (l, m, L, D) are fp32 (4 bytes). Causal FlashAttention skips tiles that lie wholly above the
  diagonal (they are neither loaded nor computed); standard attention is dense whatever the mask.
* FLOPs: a matmul of (a x b) by (b x c) is ``2 a b c``. Elementwise work is counted per element with the small
  constants given at each pass (e.g. softmax 5: max, subtract, exp, sum, divide); ``IOReport.matmul_flops``
  holds the matmul part alone. Matmul FLOPs do not depend on the dtype; FA's per-tile rescaling work does
  (through the block sizes).

What reproduces the seeds' table (A100, GPT-2 medium: batch 64, 16 heads, N = 1024, d = 64, fp16)
--------------------------------------------------------------------------------------------------
The table is forward + backward. One N x N fp16 matrix over the 1024 (batch, head) pairs is 2.147 GB, one
N x d tensor 0.134 GB.

* HBM, standard: the pass list above with mask + dropout gives 18 N^2-matrix passes (forward 8.5, counting the
  bool dropout mask as half a pass; backward 9.5) plus 12 N x d tensors: 18 * 2.147 + 12 * 0.134 = 40.26 GB
  against the seeds' 40.3 GB. Other plausible conventions miss: no dropout gives 29.5 GB, a ``masked_fill``
  mask (one more backward pass) 42.4 GB, dropout with the mask stored in fp16 42.4 GB, fp32 S/P about twice.
* HBM, FlashAttention: FA1 with M = 192 KiB (the A100's combined L1/shared memory per SM, as the paper
  states) in fp16 elements gives B_c = 384, B_r = 64, T_c = 3: 4.65 GB (forward 1.67, backward 2.98) against
  4.4 GB (+6 %). The count is sensitive to M through T_c = ceil(N / B_c): M = 164 KiB (the A100's largest
  shared-memory allocation per block) gives T_c = 4 and 5.7 GB; M counted in fp32 elements, or M = 100 KiB,
  gives T_c = 6 and 7.9 GB; FA2 with 128 x 128 blocks re-reads K, V eight times (7.7 GB). Ratio standard / FA
  at 192 KiB: 8.7x (seeds 9.2x).
* FLOPs: no count at batch 64 gives 66.6 / 75.2. Counting matmuls only, forward 4 N^2 d per head and backward
  8 N^2 d (standard) or 10 N^2 d (FA, which recomputes S), is 824.6 and 962.1 GFLOPs: about 12.4x the table.
  The first author confirmed in the FlashAttention issue tracker (Dao-AILab/flash-attention#741) that the
  GFLOPs row "might have been off by some factor" and gave 825 / 963 as the matmul count. What is reproducible
  is the ratio: 1.167 (matmuls) or 1.165 (with the elementwise work) against the table's 1.129 (+13 %).
* Runtime: estimated with a per-kernel roofline, ``max(bytes / 1.5 TB/s, matmul FLOPs / 312 TFLOP/s +
  elementwise FLOPs / 19.5 TFLOP/s)`` summed over kernels. It is a lower bound, not a measurement: 26.8 ms
  vs 3.9 ms (6.9x) against the measured 41.7 vs 7.3 ms (5.7x).

Also here: :func:`matmul_io`, the IO of C = A B done naively, a row at a time, or in square tiles sized from M
(Theta(m n k / sqrt(M))), the example the seeds' "GPU memory simulator" profiled.
"""
from __future__ import annotations

import argparse
import json
import math
import numbers
import sys
from dataclasses import dataclass, field

import numpy as np

from .._args import check_flag, check_positive_int, check_positive_real

__all__ = [
    "Pass",
    "IOReport",
    "TileShape",
    "standard_attention_io",
    "flash_attention_io",
    "flash_block_sizes",
    "matmul_io",
    "seeds_table",
    "scaling_sweep",
    "matmul_sweep",
    "bytes_per_element",
    "A100",
    "SEEDS",
]

STATS_BYTES = 4  # l, m, L, D are fp32
# A100 (FlashAttention paper, section 2.1): 1.5 TB/s HBM (40 GB part), 312 TFLOP/s fp16 tensor core,
# 19.5 TFLOP/s fp32 on CUDA cores (elementwise work), 192 KB of SRAM (L1 + shared) per SM.
A100 = {"hbm_bandwidth": 1.5e12, "matmul_flops": 312e12, "vector_flops": 19.5e12, "sram_bytes": 192 * 1024}
# The seeds' table (FlashAttention paper Figure 2, left; forward + backward).
SEEDS = {
    "config": {"batch": 64, "heads": 16, "seq_len": 1024, "head_dim": 64, "dtype": "fp16", "gpu": "A100"},
    "standard": {"gflops": 66.6, "hbm_gb": 40.3, "runtime_ms": 41.7},
    "flash": {"gflops": 75.2, "hbm_gb": 4.4, "runtime_ms": 7.3},
}

_DTYPE_BYTES = {
    "fp8": 1, "float8": 1, "e4m3": 1, "e5m2": 1,
    "fp16": 2, "float16": 2, "half": 2, "bf16": 2, "bfloat16": 2,
    "fp32": 4, "float32": 4, "float": 4, "tf32": 4,
    "fp64": 8, "float64": 8, "double": 8,
}


# ----------------------------------------------------------------------------------------------------------
# input checks
# ----------------------------------------------------------------------------------------------------------
def _probability(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a probability in [0, 1), got {value!r}")
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1), got {value}")
    return float(value)


def bytes_per_element(dtype) -> int:
    """Bytes per element of ``dtype``: a name ("fp16", "bf16", "fp32", ...), a NumPy/torch float dtype, or an
    int (bytes per element, e.g. 1 for fp8)."""
    if isinstance(dtype, bool) or dtype is None:  # np.dtype(None) would silently mean float64
        raise TypeError(f"dtype must be a dtype name, a float dtype or a byte count, got {dtype!r}")
    if isinstance(dtype, numbers.Integral):
        return check_positive_int(dtype, "dtype (bytes per element)")
    if isinstance(dtype, str):
        key = dtype.lower().replace("torch.", "").replace("numpy.", "")
        if key in _DTYPE_BYTES:
            return _DTYPE_BYTES[key]
        raise ValueError(f"dtype must be one of {sorted(_DTYPE_BYTES)} or a byte count, got {dtype!r}")
    itemsize = getattr(dtype, "itemsize", None)
    is_float = getattr(dtype, "is_floating_point", None)
    if itemsize is not None and is_float is not None:  # torch.dtype
        if not is_float:
            raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
        return int(itemsize)
    try:
        npd = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a dtype name, a float dtype or a byte count, got {dtype!r}") from None
    if npd.kind != "f":
        raise TypeError(f"dtype must be a floating-point dtype, got {npd}")
    return int(npd.itemsize)


# ----------------------------------------------------------------------------------------------------------
# reports
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pass:
    """One step of an algorithm: the HBM traffic and FLOPs it causes (totals over batch and heads).

    ``kernel`` names the GPU kernel the pass belongs to; the roofline runtime is taken per kernel, so the
    line-by-line passes of one fused FlashAttention kernel overlap and the separate kernels of standard
    attention add up."""

    name: str
    kernel: str
    bytes_read: float
    bytes_written: float
    matmul_flops: float = 0.0
    elementwise_flops: float = 0.0

    @property
    def flops(self) -> float:
        return self.matmul_flops + self.elementwise_flops

    @property
    def hbm_bytes(self) -> float:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class IOReport:
    """FLOPs and HBM traffic of one algorithm; ``passes`` says where each byte comes from."""

    algorithm: str
    passes: tuple = ()
    params: dict = field(default_factory=dict)

    @property
    def bytes_read(self) -> float:
        return float(sum(p.bytes_read for p in self.passes))

    @property
    def bytes_written(self) -> float:
        return float(sum(p.bytes_written for p in self.passes))

    @property
    def hbm_bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def matmul_flops(self) -> float:
        return float(sum(p.matmul_flops for p in self.passes))

    @property
    def elementwise_flops(self) -> float:
        return float(sum(p.elementwise_flops for p in self.passes))

    @property
    def flops(self) -> float:
        return self.matmul_flops + self.elementwise_flops

    def kernels(self) -> dict:
        """Totals per kernel, in pass order: {kernel: {"bytes": , "matmul_flops": , "elementwise_flops": }}."""
        out: dict = {}
        for p in self.passes:
            k = out.setdefault(p.kernel, {"bytes": 0.0, "matmul_flops": 0.0, "elementwise_flops": 0.0})
            k["bytes"] += p.hbm_bytes
            k["matmul_flops"] += p.matmul_flops
            k["elementwise_flops"] += p.elementwise_flops
        return out

    def runtime_estimate(self, hbm_bandwidth: float = A100["hbm_bandwidth"],
                         matmul_flops_per_s: float = A100["matmul_flops"],
                         vector_flops_per_s: float = A100["vector_flops"]) -> float:
        """Roofline ESTIMATE in seconds: per kernel ``max(bytes / bandwidth, matmul / peak + elementwise /
        vector peak)``, summed over kernels. A lower bound; real kernels reach neither peak."""
        bw = check_positive_real(hbm_bandwidth, "hbm_bandwidth")
        mm = check_positive_real(matmul_flops_per_s, "matmul_flops_per_s")
        vec = check_positive_real(vector_flops_per_s, "vector_flops_per_s")
        return float(sum(max(k["bytes"] / bw, k["matmul_flops"] / mm + k["elementwise_flops"] / vec)
                         for k in self.kernels().values()))

    def __add__(self, other: "IOReport") -> "IOReport":
        if not isinstance(other, IOReport):
            return NotImplemented
        return IOReport(f"{self.algorithm} + {other.algorithm}", self.passes + other.passes,
                        {**self.params, **other.params})

    def summary(self) -> dict:
        return {"algorithm": self.algorithm, "flops": self.flops, "matmul_flops": self.matmul_flops,
                "elementwise_flops": self.elementwise_flops, "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written, "hbm_bytes": self.hbm_bytes,
                "runtime_estimate_s": self.runtime_estimate()}

    def table(self) -> str:
        """The passes as a text table (GB and GFLOPs)."""
        rows = [f"{'kernel':<14} {'pass':<44} {'read GB':>9} {'write GB':>9} {'GFLOPs':>9}"]
        for p in self.passes:
            rows.append(f"{p.kernel:<14} {p.name:<44} {p.bytes_read / 1e9:9.3f} {p.bytes_written / 1e9:9.3f} "
                        f"{p.flops / 1e9:9.2f}")
        rows.append(f"{'total':<14} {'':<44} {self.bytes_read / 1e9:9.3f} {self.bytes_written / 1e9:9.3f} "
                    f"{self.flops / 1e9:9.2f}")
        return "\n".join(rows)


def _check_shape(batch, heads, seq_len, head_dim):
    return (check_positive_int(batch, "batch"), check_positive_int(heads, "heads"), check_positive_int(seq_len, "seq_len"),
            check_positive_int(head_dim, "head_dim"))


# ----------------------------------------------------------------------------------------------------------
# standard attention
# ----------------------------------------------------------------------------------------------------------
def standard_attention_io(batch: int, heads: int, seq_len: int, head_dim: int, *, dtype="fp16",
                          sram_bytes=A100["sram_bytes"], causal: bool = False, dropout: float = 0.0,
                          mask=None, softmax: bool = True, dropout_pass=None, scale_pass: bool = False,
                          dropout_mask_bytes: int = 1, backward: bool = True) -> IOReport:
    """HBM traffic and FLOPs of standard (materialising) attention, pass by pass (module docstring).

    ``mask`` (default: ``causal``) adds the mask pass; ``dropout_pass`` (default: ``dropout > 0``) the dropout
    pass; ``scale_pass`` a separate scaling pass; ``softmax=False`` drops the softmax pass (only to isolate the
    matmuls). ``sram_bytes`` is validated but does not change the count: every op streams its operands
    through SRAM once (Theorem 2, Theta(N d + N^2)). ``backward=True`` appends the autograd backward.
    """
    b, h, n, d = _check_shape(batch, heads, seq_len, head_dim)
    e = bytes_per_element(dtype)
    check_positive_int(sram_bytes, "sram_bytes")
    causal = check_flag(causal, "causal")
    p_drop = _probability(dropout, "dropout")
    mask = causal if mask is None else check_flag(mask, "mask")
    softmax = check_flag(softmax, "softmax")
    dropout_pass = (p_drop > 0) if dropout_pass is None else check_flag(dropout_pass, "dropout_pass")
    scale_pass = check_flag(scale_pass, "scale_pass")
    mb = check_positive_int(dropout_mask_bytes, "dropout_mask_bytes")
    backward = check_flag(backward, "backward")

    bh = b * h
    nn = float(bh) * n * n  # elements of all the N x N matrices together
    nd = float(bh) * n * d  # elements of all the N x d tensors together
    mm = 2.0 * bh * n * n * d  # one N x N x d matmul
    S, X = nn * e, nd * e
    ps = []
    ps.append(Pass("S = scale * Q K^T  (read Q, K; write S)", "fwd matmul1", 2 * X, S, mm, nn))
    if scale_pass:
        ps.append(Pass("S = S / sqrt(d)  (read S; write S)", "fwd scale", S, S, 0, nn))
    if mask:
        ps.append(Pass("S = S + mask  (read S; write S)", "fwd mask", S, S, 0, nn))
    if softmax:
        ps.append(Pass("P = softmax(S)  (read S; write P)", "fwd softmax", S, S, 0, 5 * nn))
    if dropout_pass:
        ps.append(Pass("P' = dropout(P)  (read P; write P', bool mask)", "fwd dropout", S, S + nn * mb, 0,
                       2 * nn))
    ps.append(Pass("O = P' V  (read P', V; write O)", "fwd matmul2", S + X, X, mm, 0))
    if backward:
        ps.append(Pass("dV = P'^T dO  (read P', dO; write dV)", "bwd dV", S + X, X, mm, 0))
        ps.append(Pass("dP' = dO V^T  (read dO, V; write dP')", "bwd dP", 2 * X, S, mm, 0))
        if dropout_pass:
            ps.append(Pass("dP = dropout_bwd(dP')  (read dP', mask; write dP)", "bwd dropout", S + nn * mb, S,
                           0, nn))
        if softmax:
            ps.append(Pass("dS = P * (dP - rowsum(dP*P))  (read dP, P; write dS)", "bwd softmax", 2 * S, S, 0,
                           4 * nn))
        if scale_pass:
            ps.append(Pass("dS = dS / sqrt(d)  (read dS; write dS)", "bwd scale", S, S, 0, nn))
        ps.append(Pass("dQ = dS K  (read dS, K; write dQ)", "bwd dQ", S + X, X, mm, nd))
        ps.append(Pass("dK = dS^T Q  (read dS, Q; write dK)", "bwd dK", S + X, X, mm, nd))
    params = dict(batch=b, heads=h, seq_len=n, head_dim=d, bytes_per_element=e, sram_bytes=int(sram_bytes),
                  causal=causal, dropout=p_drop, mask=mask, softmax=softmax, dropout_pass=dropout_pass,
                  scale_pass=scale_pass, backward=backward)
    return IOReport("standard attention" + (" fwd+bwd" if backward else " fwd"), tuple(ps), params)


# ----------------------------------------------------------------------------------------------------------
# FlashAttention
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TileShape:
    """Block sizes and loop counts; sums over the (i, j) tile pairs the algorithm visits (causal skips some)."""

    block_q: int  # B_r
    block_k: int  # B_c
    t_r: int
    t_c: int
    pairs: float  # visited (i, j) pairs, per head
    pair_rows: float  # sum over visited pairs of the Q-block rows r_i
    pair_cols: float  # sum over visited pairs of the K-block rows c_j
    pair_area: float  # sum over visited pairs of r_i * c_j


def _fa2_block(d: int, e: int, sram_bytes: int) -> int:
    """Largest power of two B <= 128 whose FA2 working set fits: Q_i, K_j, V_j in dtype, the B x B S tile
    and the B x d output accumulator in fp32."""
    bsz = 128
    while bsz >= 1:
        need = 3 * bsz * d * e + bsz * bsz * 4 + bsz * d * 4
        if need <= sram_bytes:
            return bsz
        bsz //= 2
    raise ValueError(f"sram_bytes={sram_bytes} cannot hold one row each of Q, K, V (d={d}, {e} B/element) "
                     "plus accumulators; FlashAttention-2 needs more SRAM")


def flash_block_sizes(seq_len: int, head_dim: int, *, dtype="fp16", sram_bytes=A100["sram_bytes"],
                      version: str = "fa1", block_q=None, block_k=None) -> tuple:
    """(B_r, B_c) for FlashAttention.

    fa1: FA1 Algorithm 1 line 1, ``B_c = ceil(M / 4d)``, ``B_r = min(B_c, d)``, M in elements of ``dtype``.
    fa2: the largest power of two <= 128 whose working set fits in M (module docstring). Both capped at N;
    explicit ``block_q``/``block_k`` win."""
    n = check_positive_int(seq_len, "seq_len")
    d = check_positive_int(head_dim, "head_dim")
    e = bytes_per_element(dtype)
    m_bytes = check_positive_int(sram_bytes, "sram_bytes")
    if version not in ("fa1", "fa2"):
        raise ValueError(f"version must be 'fa1' or 'fa2', got {version!r}")
    if version == "fa1":
        m_el = m_bytes // e
        if m_el < 4 * d:
            raise ValueError(f"sram_bytes={m_bytes} holds {m_el} elements of {e} bytes; FlashAttention-1 needs "
                             f"M >= 4d = {4 * d} elements (one row each of Q, K, V, O)")
        bc = -(-m_el // (4 * d))
        br = min(bc, d)
    else:
        bc = br = _fa2_block(d, e, m_bytes)
    if block_q is not None:
        br = check_positive_int(block_q, "block_q")
    if block_k is not None:
        bc = check_positive_int(block_k, "block_k")
    return min(br, n), min(bc, n)


def _tiles(n: int, br: int, bc: int, causal: bool) -> TileShape:
    """Tile bookkeeping. Causal (square, bottom-right = top-left aligned): tile (i, j) is visited iff its
    first key j*B_c is <= its last query; every other tile is wholly masked and skipped."""
    t_r, t_c = -(-n // br), -(-n // bc)
    rows = np.full(t_r, br, dtype=np.float64)
    rows[-1] = n - br * (t_r - 1)
    if not causal:
        return TileShape(br, bc, t_r, t_c, float(t_r * t_c), float(t_c * n), float(t_r * n), float(n) * n)
    last_q = np.minimum(np.arange(1, t_r + 1) * br, n) - 1
    jmax = np.minimum(last_q // bc, t_c - 1)  # last visited K block of each Q block
    cols_upto = np.minimum((jmax + 1) * bc, n).astype(np.float64)  # keys covered by blocks 0..jmax
    return TileShape(br, bc, t_r, t_c, float((jmax + 1).sum()), float((rows * (jmax + 1)).sum()),
                     float(cols_upto.sum()), float((rows * cols_upto).sum()))


def flash_attention_io(batch: int, heads: int, seq_len: int, head_dim: int, *, dtype="fp16",
                       sram_bytes=A100["sram_bytes"], causal: bool = False, dropout: float = 0.0,
                       version: str = "fa1", block_q=None, block_k=None, backward: bool = True) -> IOReport:
    """HBM traffic and FLOPs of FlashAttention, forward (and backward with recomputation), tile by tile.

    version "fa1": FA1 Algorithm 1 (forward) and Algorithm 4 (backward); "fa2": FA2 Algorithms 1 and 2.
    Dropout in FlashAttention keeps only the RNG state (FA1 Algorithm 2), so it adds elementwise FLOPs, no
    traffic. See the module docstring for the block sizes and what each line loads."""
    b, h, n, d = _check_shape(batch, heads, seq_len, head_dim)
    e = bytes_per_element(dtype)
    causal = check_flag(causal, "causal")
    p_drop = _probability(dropout, "dropout")
    backward = check_flag(backward, "backward")
    br, bc = flash_block_sizes(n, d, dtype=e, sram_bytes=sram_bytes, version=version, block_q=block_q,
                               block_k=block_k)
    t = _tiles(n, br, bc, causal)
    bh = float(b * h)
    nd = bh * n * d * e  # one N x d tensor, all heads
    st = bh * n * STATS_BYTES  # one row statistic, all heads
    area = bh * t.pair_area  # S-tile elements computed
    mm = 2.0 * area * d  # one tile-matmul sweep
    drop_fl = 2.0 if p_drop > 0 else 0.0
    # elementwise per S element, forward: scale, running max, subtract, exp, rowsum (+ mask, + dropout)
    fwd_ew = area * (5 + (1 if causal else 0) + drop_fl)
    ps = []
    if version == "fa1":
        qrows = bh * t.pair_rows * d * e  # Q_i (or O_i, dO_i, dQ_i) loaded once per visited pair
        srows = bh * t.pair_rows * STATS_BYTES
        kf, kb = "fa1 fwd", "fa1 bwd"
        ps.append(Pass("line 2: init O = 0, l = 0, m = -inf in HBM", kf, 0, nd + 2 * st))
        ps.append(Pass("line 6: load K_j, V_j (once)", kf, 2 * nd, 0))
        ps.append(Pass("line 8: load Q_i, O_i, l_i, m_i (T_c times)", kf, 2 * qrows + 2 * srows, 0,
                       2 * mm, fwd_ew + 3 * qrows / e))
        ps.append(Pass("lines 12-13: write O_i, l_i, m_i (T_c times)", kf, 0, qrows + 2 * srows))
        if backward:
            # backward per pair: recompute S, dV += P^T dO, dP = dO V^T, dS, dQ += dS K, dK += dS^T Q
            bwd_ew = area * (3 + drop_fl + 2) + 2 * qrows / e  # P = exp(S-m)/l, dropout, dS; D_i per pair
            ps.append(Pass("line 5: init dQ, dK, dV = 0 in HBM", kb, 0, 3 * nd))
            ps.append(Pass("line 8: load K_j, V_j (once)", kb, 2 * nd, 0))
            ps.append(Pass("line 11: load Q_i, O_i, dO_i, dQ_i, l_i, m_i (T_c times)", kb,
                           4 * qrows + 2 * srows, 0, 5 * mm, bwd_ew))
            ps.append(Pass("line 21: write dQ_i (T_c times)", kb, 0, qrows))
            ps.append(Pass("line 24: write dK_j, dV_j (once)", kb, 0, 2 * nd))
    elif version == "fa2":
        kvrows = bh * t.pair_cols * d * e  # K_j (or V_j) loaded once per visited pair
        qrows = bh * t.pair_rows * d * e
        srows = bh * t.pair_rows * STATS_BYTES
        kf = "fa2 fwd"
        ps.append(Pass("line 4: load Q_i (once)", kf, nd, 0))
        ps.append(Pass("line 6: load K_j, V_j (T_r times)", kf, 2 * kvrows, 0, 2 * mm,
                       fwd_ew + 2 * qrows / e))
        ps.append(Pass("lines 12-13: write O_i, L_i (once)", kf, 0, nd + st, 0, 2.0 * bh * n * d))
        if backward:
            bwd_ew = area * (2 + drop_fl + 2)  # P = exp(S - L), dropout, dS = P * (dP - D)
            ps.append(Pass("line 4: D = rowsum(dO * O)  (read dO, O; write D)", "fa2 bwd prep", 2 * nd, st, 0,
                           2.0 * bh * n * d))
            ps.append(Pass("line 5: init dQ = 0 in HBM", "fa2 bwd", 0, nd))
            ps.append(Pass("line 6: load K_j, V_j (once)", "fa2 bwd", 2 * nd, 0))
            ps.append(Pass("line 8: load Q_i, dO_i, dQ_i, L_i, D_i (T_c times)", "fa2 bwd",
                           3 * qrows + 2 * srows, 0, 5 * mm, bwd_ew))
            ps.append(Pass("line 15: write dQ_i (T_c times)", "fa2 bwd", 0, qrows))
            ps.append(Pass("line 17: write dK_j, dV_j (once)", "fa2 bwd", 0, 2 * nd))
    params = dict(batch=b, heads=h, seq_len=n, head_dim=d, bytes_per_element=e, sram_bytes=int(sram_bytes),
                  causal=causal, dropout=p_drop, version=version, block_q=br, block_k=bc, t_r=t.t_r, t_c=t.t_c,
                  backward=backward)
    name = f"FlashAttention ({version})" + (" fwd+bwd" if backward else " fwd")
    return IOReport(name, tuple(ps), params)


# ----------------------------------------------------------------------------------------------------------
# matmul tiling (the seeds' "GPU memory simulator")
# ----------------------------------------------------------------------------------------------------------
def matmul_io(m: int, n: int, k: int, *, algorithm: str = "tiled", dtype="fp16",
              sram_bytes=A100["sram_bytes"], tile=None) -> IOReport:
    """HBM traffic of C (m x n) = A (m x k) @ B (k x n).

    naive: each C[i, j] loads row i of A and column j of B (2 m n k element reads).
    row:   a row of A stays in SRAM while every column of B streams past (A read once, B read m times).
    tiled: square T x T tiles of A, B, C in SRAM, ``T = floor(sqrt(M / 3))`` (M in elements) unless ``tile``
           is given; A is read ceil(n/T) times and B ceil(m/T) times: Theta(m n k / sqrt(M)).
    C is written once in every case; FLOPs are 2 m n k."""
    m, n, k = check_positive_int(m, "m"), check_positive_int(n, "n"), check_positive_int(k, "k")
    e = bytes_per_element(dtype)
    m_el = check_positive_int(sram_bytes, "sram_bytes") // e
    if algorithm not in ("naive", "row", "tiled"):
        raise ValueError(f"algorithm must be 'naive', 'row' or 'tiled', got {algorithm!r}")
    fl = 2.0 * m * n * k
    if algorithm == "naive":
        if m_el < 2 * k + 1:
            raise ValueError(f"sram_bytes holds {m_el} elements; the naive matmul needs 2k+1 = {2 * k + 1}")
        reads = 2.0 * m * n * k
        p = [Pass("load row A[i,:] and column B[:,j] per C[i,j]", "matmul", reads * e, m * n * e, fl)]
        tsz = 1
    elif algorithm == "row":
        if m_el < 2 * k + 1:
            raise ValueError(f"sram_bytes holds {m_el} elements; the row matmul needs 2k+1 = {2 * k + 1}")
        p = [Pass("load A[i,:] once per row", "matmul", float(m) * k * e, 0),
             Pass("load B[:,j] once per (row, column)", "matmul", float(m) * n * k * e, 0, fl),
             Pass("write C", "matmul", 0, float(m) * n * e)]
        tsz = 1
    else:
        tsz = int(math.isqrt(m_el // 3)) if tile is None else check_positive_int(tile, "tile")
        if tsz < 1 or 3 * tsz * tsz > m_el:
            raise ValueError(f"tile={tsz}: three {tsz}x{tsz} tiles need {3 * tsz * tsz} elements but "
                             f"sram_bytes holds {m_el}")
        p = [Pass(f"load A tiles (ceil(n/T) = {-(-n // tsz)} times)", "matmul", float(m) * k * -(-n // tsz) * e, 0),
             Pass(f"load B tiles (ceil(m/T) = {-(-m // tsz)} times)", "matmul", float(k) * n * -(-m // tsz) * e,
                  0, fl),
             Pass("write C tiles (once)", "matmul", 0, float(m) * n * e)]
    return IOReport(f"matmul ({algorithm})", tuple(p), dict(m=m, n=n, k=k, bytes_per_element=e,
                                                            sram_bytes=int(sram_bytes), tile=tsz))


# ----------------------------------------------------------------------------------------------------------
# the seeds' table and the scaling laws
# ----------------------------------------------------------------------------------------------------------
def seeds_table(sram_bytes=A100["sram_bytes"], dropout: float = 0.1, version: str = "fa1",
                verbose: bool = True) -> dict:
    """Evaluate the seeds' configuration (GPT-2 medium on an A100, forward + backward) and print the model
    next to the seeds' figures. Returns the numbers as a dict. Conventions: module docstring."""
    c = SEEDS["config"]
    shape = (c["batch"], c["heads"], c["seq_len"], c["head_dim"])
    std = standard_attention_io(*shape, dtype=c["dtype"], sram_bytes=sram_bytes, mask=True, dropout=dropout)
    fa = flash_attention_io(*shape, dtype=c["dtype"], sram_bytes=sram_bytes, dropout=dropout, version=version)
    rows = {}
    for key, rep in (("standard", std), ("flash", fa)):
        rows[key] = {"matmul_gflops": rep.matmul_flops / 1e9, "gflops": rep.flops / 1e9,
                     "hbm_gb": rep.hbm_bytes / 1e9, "read_gb": rep.bytes_read / 1e9,
                     "write_gb": rep.bytes_written / 1e9, "runtime_ms_estimate": rep.runtime_estimate() * 1e3,
                     "seeds": SEEDS[key]}
    s, f = rows["standard"], rows["flash"]
    ratios = {"hbm": s["hbm_gb"] / f["hbm_gb"], "seeds_hbm": 40.3 / 4.4,
              "matmul_flops": f["matmul_gflops"] / s["matmul_gflops"], "flops": f["gflops"] / s["gflops"],
              "seeds_flops": 75.2 / 66.6, "runtime": s["runtime_ms_estimate"] / f["runtime_ms_estimate"],
              "seeds_runtime": 41.7 / 7.3}
    out = {"config": dict(c, sram_bytes=int(sram_bytes), dropout=dropout, flash_version=version,
                          block_q=fa.params["block_q"], block_k=fa.params["block_k"], t_c=fa.params["t_c"],
                          t_r=fa.params["t_r"], gpu_model=A100),
           "standard": s, "flash": f, "ratios": ratios}
    if verbose:
        print(f"Seeds' configuration: GPT-2 medium attention, batch {c['batch']}, {c['heads']} heads, "
              f"N={c['seq_len']}, d={c['head_dim']}, fp16, forward + backward; A100 model: "
              f"SRAM M={sram_bytes / 1024:.0f} KiB, 1.5 TB/s, 312 TFLOP/s")
        print(f"FlashAttention {version}: B_r={fa.params['block_q']}, B_c={fa.params['block_k']}, "
              f"T_r={fa.params['t_r']}, T_c={fa.params['t_c']}; standard: mask + softmax + dropout(p={dropout})")
        print(f"{'':28}{'standard':>12}{'seeds':>9}{'flash':>12}{'seeds':>9}")
        print(f"{'GFLOPs (matmul, model)':28}{s['matmul_gflops']:12.1f}{66.6:9.1f}{f['matmul_gflops']:12.1f}"
              f"{75.2:9.1f}   (seeds' absolute FLOPs are off by ~12x; see docstring)")
        print(f"{'GFLOPs (+ elementwise)':28}{s['gflops']:12.1f}{'':9}{f['gflops']:12.1f}")
        print(f"{'HBM read+write (GB)':28}{s['hbm_gb']:12.2f}{40.3:9.1f}{f['hbm_gb']:12.2f}{4.4:9.1f}")
        print(f"{'runtime (ms, roofline est.)':28}{s['runtime_ms_estimate']:12.1f}{41.7:9.1f}"
              f"{f['runtime_ms_estimate']:12.2f}{7.3:9.1f}")
        print(f"ratios: HBM standard/flash {ratios['hbm']:.2f}x (seeds {ratios['seeds_hbm']:.2f}x); "
              f"FLOPs flash/standard {ratios['matmul_flops']:.3f} matmul, {ratios['flops']:.3f} all "
              f"(seeds {ratios['seeds_flops']:.3f}); runtime {ratios['runtime']:.1f}x estimate "
              f"(seeds {ratios['seeds_runtime']:.1f}x measured)")
    return out


def _slope(xs, ys) -> float:
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])


def scaling_sweep(verbose: bool = True) -> dict:
    """HBM traffic (forward only, fp16, one head) as M, d and N vary, with log-log slopes.

    Theorem 2: FlashAttention Theta(N^2 d^2 / M) (FA1 blocks; slope -1 in M, 2 in d, 2 in N while T_c >> 1);
    standard attention Theta(N d + N^2) (slope 0 in M, ~0 in d, ~2 in N for N >> d)."""
    out = {}
    n, d, kib = 8192, 64, 1024
    ms = [8 * kib, 16 * kib, 32 * kib, 64 * kib, 128 * kib]
    fa_m = [flash_attention_io(1, 1, n, d, sram_bytes=m, backward=False).hbm_bytes for m in ms]
    std_m = [standard_attention_io(1, 1, n, d, sram_bytes=m, backward=False).hbm_bytes for m in ms]
    out["vs_sram"] = {"seq_len": n, "head_dim": d, "sram_bytes": ms, "flash_bytes": fa_m, "standard_bytes": std_m,
                      "flash_slope": _slope(ms, fa_m), "standard_slope": _slope(ms, std_m), "expected": -1.0}
    n, m = 16384, 192 * kib
    ds = [32, 64, 128, 256]
    fa_d = [flash_attention_io(1, 1, n, dd, sram_bytes=m, backward=False).hbm_bytes for dd in ds]
    std_d = [standard_attention_io(1, 1, n, dd, sram_bytes=m, backward=False).hbm_bytes for dd in ds]
    out["vs_head_dim"] = {"seq_len": n, "sram_bytes": m, "head_dim": ds, "flash_bytes": fa_d,
                          "standard_bytes": std_d, "flash_slope": _slope(ds, fa_d),
                          "standard_slope": _slope(ds, std_d), "expected": 2.0}
    d, m = 64, 192 * kib
    ns = [4096, 8192, 16384, 32768]
    fa_n = [flash_attention_io(1, 1, nn, d, sram_bytes=m, backward=False).hbm_bytes for nn in ns]
    std_n = [standard_attention_io(1, 1, nn, d, sram_bytes=m, backward=False).hbm_bytes for nn in ns]
    out["vs_seq_len"] = {"head_dim": d, "sram_bytes": m, "seq_len": ns, "flash_bytes": fa_n,
                         "standard_bytes": std_n, "flash_slope": _slope(ns, fa_n),
                         "standard_slope": _slope(ns, std_n), "expected": 2.0}
    # FLOPs for reference: forward matmuls are 4 N^2 d per head for both
    if verbose:
        print("\nScaling (forward, one head, fp16; FlashAttention = FA1 blocks B_c = ceil(M/4d)):")
        for key, xname in (("vs_sram", "sram_bytes"), ("vs_head_dim", "head_dim"), ("vs_seq_len", "seq_len")):
            r = out[key]
            fixed = {k: v for k, v in r.items() if k in ("seq_len", "head_dim", "sram_bytes") and k != xname}
            print(f"  HBM bytes vs {xname} ({', '.join(f'{k}={v}' for k, v in fixed.items())}):")
            for x, fb, sb in zip(r[xname], r["flash_bytes"], r["standard_bytes"]):
                print(f"    {xname}={x:>8}  flash {fb / 1e6:10.2f} MB   standard {sb / 1e6:10.2f} MB")
            print(f"    log-log slope: flash {r['flash_slope']:+.3f} (Theta(N^2 d^2/M) predicts "
                  f"{r['expected']:+.0f}), standard {r['standard_slope']:+.3f}")
    return out


def matmul_sweep(verbose: bool = True) -> dict:
    """HBM traffic of a 1024^3 fp16 matmul for the three algorithms, and tiled traffic vs M (slope -1/2)."""
    size = 1024
    algos = {a: matmul_io(size, size, size, algorithm=a).hbm_bytes for a in ("naive", "row", "tiled")}
    ms = [12 * 1024, 48 * 1024, 192 * 1024, 768 * 1024]
    tiled = [matmul_io(size, size, size, sram_bytes=m).hbm_bytes for m in ms]
    out = {"size": size, "by_algorithm": algos, "tiled_vs_sram": {"sram_bytes": ms, "bytes": tiled,
                                                                  "slope": _slope(ms, tiled)}}
    if verbose:
        print(f"\nMatmul {size}x{size}x{size} fp16, M = 192 KiB: "
              + ", ".join(f"{a} {b / 1e9:.3f} GB" for a, b in algos.items())
              + f"; tiled vs M slope {out['tiled_vs_sram']['slope']:+.3f} (Theta(1/sqrt(M)) predicts -0.5)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reference.simulators.iosim", description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="PATH", help="also write the numbers as JSON to PATH")
    ap.add_argument("--sram-kib", type=float, default=192.0, help="SRAM per SM in KiB (default 192, A100)")
    args = ap.parse_args(argv)
    if args.sram_kib <= 0:
        ap.error("--sram-kib must be positive")
    sram = int(args.sram_kib * 1024)
    result = {"seeds_table": seeds_table(sram_bytes=sram), "scaling": scaling_sweep(),
              "matmul": matmul_sweep()}
    if args.json:
        result["note"] = ("Produced by `python -m reference.simulators.iosim --json`; counts from the IO model, runtimes are "
                          "roofline estimates, not measurements.")
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, default=float)
            fh.write("\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
