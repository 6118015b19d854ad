"""Small simulations of the ideas in Tri Dao's FlashAttention-3 talk ("Optimizing Attention for Modern Hardware").

Nothing here runs on a GPU; each function turns one slide into arithmetic or a simulation that can be checked:

* Load balancing for causal attention (slides 26-45): ``causal_tiles`` builds the work tiles of a causal
  attention forward (query block ``i`` of a head visits ``i + 1`` key blocks), ``schedule`` runs ``W`` workers
  (SMs of a persistent kernel) over a tile order, each next tile going to the worker that frees up first, as the
  hardware block scheduler does. ``order="naive"`` walks tiles in launch order; ``order="lpt"`` sorts them
  longest-processing-time-first (Graham, 1969). The talk's example, 2 batches x 4 query blocks on 3 workers,
  gives per-worker work ``[9, 5, 6]`` naive and ``[7, 7, 6]`` LPT. ``kv_traffic`` counts the K/V bytes an order
  reads from HBM through the L2 cache (head-major vs head-minor tile order).
* FP8 with incoherent processing (slide 24): ``fp8_incoherent_experiment`` quantises Q, K (and V) to float8
  e4m3 with per-tensor scaling and measures the error of ``S = Q K^T`` and of the attention output against
  float64, with and without first multiplying Q and K by ``J = diag(random +-1) H / sqrt(d)`` (Sylvester
  Hadamard). ``S = (Q J)(K J)^T`` because ``J J^T = I``.
* Overlapping GEMM and softmax (slides 19-22, 55): ``tile_cycles`` is the talk's cycle count for one
  ``block_m x block_n`` tile (two GEMMs on tensor cores vs ``exp2`` on the MUFU), ``pingpong_utilisation`` the
  tensor-core busy fraction with and without overlapping two warpgroups, ``persistent_time`` what hiding
  the prologue/epilogue buys.
* GQA packing (slide 50): ``gqa_packing`` counts how much of a 64-row WGMMA tile holds real query rows when
  one query token per head is decoded, with and without packing the query heads that share a KV head.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from ._args import check_flag, check_gqa, check_positive_int

__all__ = [
    "tile_visits", "Tile", "Schedule", "causal_tiles", "order_tiles", "schedule", "makespan_lower_bound", "kv_traffic",
    "sylvester_hadamard", "random_hadamard", "quantize_fp8", "outlier_qkv", "fp8_incoherent_experiment",
    "aligned_error", "HARDWARE", "tile_cycles", "pingpong_utilisation", "persistent_time", "gqa_packing",
    "accumulator_registers", "decode_intensity", "split_kv_time",
]


def _rng(rng) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def _nonneg(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------------------------------
# (a) LPT scheduling of causal attention tiles
# --------------------------------------------------------------------------------------------------------------

def tile_visits(nq, nk, block_q, block_k, causal=False):
    """Order in which FA2 Algorithm 1 visits the ``(T_r, T_c)`` tiles of S; 0 marks a tile that is skipped.

    Outer loop over query blocks ``i`` (line 3), inner over key blocks ``j`` (line 6). With the bottom-right
    causal mask (query ``r`` sees key ``c`` iff ``c <= r + nk - nq``) a tile whose first key lies beyond its last
    query's horizon is never loaded or computed. Returns an int array, visits numbered from 1.
    """
    nq, nk, block_q, block_k = (check_positive_int(nq, "nq"), check_positive_int(nk, "nk"), check_positive_int(block_q, "block_q"),
                                check_positive_int(block_k, "block_k"))
    causal = check_flag(causal, "causal")
    t_r, t_c = -(-nq // block_q), -(-nk // block_k)
    out = np.zeros((t_r, t_c), dtype=np.int64)
    step = 0
    for i in range(t_r):
        last_row = min(nq, (i + 1) * block_q) - 1
        for j in range(t_c):
            if causal and j * block_k > last_row + nk - nq:
                continue
            step += 1
            out[i, j] = step
    return out


@dataclass(frozen=True)
class Tile:
    """One work tile: query block ``q_block`` of head ``head`` of batch ``batch``; ``cost`` in key-block units."""
    batch: int
    head: int
    q_block: int
    cost: int


@dataclass
class Schedule:
    """Result of ``schedule``: per-worker total work, finish time, and the (start, end, tile) timeline."""
    n_workers: int
    loads: list
    timeline: list = field(repr=False)

    @property
    def makespan(self) -> int:
        return max(self.loads) if self.loads else 0

    @property
    def efficiency(self) -> float:
        """Busy fraction of all workers until the last one finishes: sum(work) / (W * makespan)."""
        return sum(self.loads) / (self.n_workers * self.makespan) if self.makespan else 1.0


def causal_tiles(n_batches, n_q_blocks, n_heads=1, n_k_blocks=None):
    """Tiles of a causal attention forward in launch order (batch, head, query block ascending).

    With ``N`` split into blocks of equal size, query block ``i`` (0-based) attends key blocks ``0..i`` under the
    causal mask (FA2 Algorithm 1 with the fully masked tiles skipped), so its cost is ``i + 1`` key blocks.
    ``n_k_blocks > n_q_blocks`` models the bottom-right mask with more keys than queries: block ``i`` then
    costs ``i + 1 + (n_k_blocks - n_q_blocks)``.
    """
    n_batches, n_q_blocks, n_heads = (check_positive_int(n_batches, "n_batches"), check_positive_int(n_q_blocks, "n_q_blocks"),
                                      check_positive_int(n_heads, "n_heads"))
    n_k_blocks = n_q_blocks if n_k_blocks is None else check_positive_int(n_k_blocks, "n_k_blocks")
    if n_k_blocks < n_q_blocks:
        raise ValueError(f"n_k_blocks must be >= n_q_blocks ({n_q_blocks}), got {n_k_blocks}")
    off = n_k_blocks - n_q_blocks
    return [Tile(b, h, i, i + 1 + off) for b in range(n_batches) for h in range(n_heads) for i in range(n_q_blocks)]


def order_tiles(tiles, order="naive", heads_per_group=None):
    """``tiles`` as a list in the order a scheduler takes them: "naive" as given, "lpt" cost descending (ties
    keep the given order). ``reference.triton.flash_persistent`` feeds its persistent kernel in this order.

    ``heads_per_group`` (with "lpt"): sort longest-first only inside groups of that many consecutive
    (batch, head) pairs, group after group, so the tiles running at one time share the K/V of a few heads
    (the talk's caveat: a global LPT order spreads them over all heads and can spill the L2 cache).
    """
    tiles = list(tiles)
    if not all(isinstance(t, Tile) for t in tiles):
        raise TypeError("tiles must be a sequence of reference.hopper.Tile")
    if order == "lpt":
        if heads_per_group is None:
            return sorted(tiles, key=lambda t: -t.cost)  # stable: ties keep launch order
        g = check_positive_int(heads_per_group, "heads_per_group")
        index: dict = {}
        for t in tiles:
            index.setdefault((t.batch, t.head), len(index))
        return sorted(tiles, key=lambda t: (index[(t.batch, t.head)] // g, -t.cost))
    if order != "naive":
        raise ValueError(f"order must be 'naive' or 'lpt', got {order!r}")
    return tiles


def schedule(tiles, n_workers, order="naive"):
    """Greedy list scheduling of ``tiles`` on ``n_workers`` identical workers.

    Tiles are taken in ``order`` ("naive": as given; "lpt": cost descending, ties in given order) and each goes
    to the worker that becomes free first (lowest index among ties): the dynamic behaviour of the GPU block
    scheduler, and of a persistent kernel's tile counter. Returns a ``Schedule``.
    """
    n_workers = check_positive_int(n_workers, "n_workers")
    tiles = order_tiles(tiles, order)
    free_at = [0] * n_workers
    timeline = [[] for _ in range(n_workers)]
    for t in tiles:
        w = min(range(n_workers), key=lambda i: (free_at[i], i))
        timeline[w].append((free_at[w], free_at[w] + t.cost, t))
        free_at[w] += t.cost
    return Schedule(n_workers, free_at, timeline)


def makespan_lower_bound(tiles, n_workers) -> int:
    """No schedule finishes before ``max(longest tile, ceil(total work / W))``."""
    n_workers = check_positive_int(n_workers, "n_workers")
    costs = [t.cost for t in tiles]
    return max(max(costs, default=0), -(-sum(costs) // n_workers))


def kv_traffic(tiles, n_sms, l2_bytes, kv_bytes):
    """K/V bytes read from HBM when ``tiles`` run in this order, ``n_sms`` at a time, over an L2 cache.

    A deliberately coarse model of the order lesson of the Gluon forward (notes/hopper.md section 1c): tiles run
    in waves of ``n_sms`` consecutive ones; every tile streams the whole K/V of its (batch, head), ``kv_bytes``;
    the tiles of one head in the same wave share one read; the L2 keeps whole heads' K/V, ``l2_bytes`` in all,
    least recently used out. Returns ``(hbm_bytes, ratio)``, ``ratio`` = ``hbm_bytes`` over reading each head's
    K/V once. Head-major order (a head's query blocks side by side) reads each head about once; head-minor order
    (one query block of every head, then the next block) re-reads every head once per query block when the heads
    do not all fit in L2.
    """
    from collections import OrderedDict
    tiles = list(tiles)
    if not all(isinstance(t, Tile) for t in tiles):
        raise TypeError("tiles must be a sequence of reference.hopper.Tile")
    n_sms = check_positive_int(n_sms, "n_sms")
    l2, kv = _nonneg(l2_bytes, "l2_bytes"), _nonneg(kv_bytes, "kv_bytes")
    if kv == 0:
        raise ValueError("kv_bytes must be > 0")
    capacity = int(l2 // kv)  # whole heads that fit
    cache: OrderedDict = OrderedDict()
    reads = 0
    for w in range(0, len(tiles), n_sms):
        for head in dict.fromkeys((t.batch, t.head) for t in tiles[w:w + n_sms]):  # first-appearance order
            if head in cache:
                cache.move_to_end(head)
                continue
            reads += 1
            cache[head] = True
            while len(cache) > capacity:
                cache.popitem(last=False)
    heads = len({(t.batch, t.head) for t in tiles})
    return reads * kv, (reads / heads if heads else 0.0)


# --------------------------------------------------------------------------------------------------------------
# (b) FP8 attention with incoherent processing
# --------------------------------------------------------------------------------------------------------------

def sylvester_hadamard(d):
    """The ``d x d`` Sylvester Hadamard matrix divided by ``sqrt(d)`` (orthogonal); ``d`` a power of two."""
    d = check_positive_int(d, "d")
    if d & (d - 1):
        raise ValueError(f"d must be a power of two for a Sylvester Hadamard matrix, got {d}")
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(d)


def random_hadamard(d, rng):
    """``J = diag(s) H / sqrt(d)`` with random signs ``s``: a random orthogonal matrix cheap to apply (FA3 3.3)."""
    _rng(rng)
    h = sylvester_hadamard(d)
    signs = rng.choice(np.array([-1.0, 1.0]), size=h.shape[0])
    return signs[:, None] * h


def quantize_fp8(x):
    """Round ``x`` to float8 e4m3 with one per-tensor scale (amax -> 448) and return it dequantised, float64.

    Uses ``torch.float8_e4m3fn`` (3 mantissa bits: relative spacing 1/8, max 448) for the rounding itself.
    """
    import torch

    x = np.asarray(x, dtype=np.float64)
    amax = float(np.abs(x).max()) if x.size else 0.0
    if amax == 0.0 or not math.isfinite(amax):
        raise ValueError(f"x must be finite and not all zero to choose an fp8 scale, got amax={amax}")
    scale = 448.0 / amax
    q = torch.from_numpy(x * scale).to(torch.float8_e4m3fn).to(torch.float64).numpy()
    return q / scale


def outlier_qkv(rng, shape, outlier_frac=1e-3, outlier_std=10.0):
    """``N(0, 1)`` entries plus, for a fraction ``outlier_frac`` of entries, an independent ``N(0, outlier_std^2)``.

    The FA3 paper's numerical-error setup (section 4.3): outliers simulate the large activations of real LLMs.
    """
    _rng(rng)
    if isinstance(outlier_frac, bool) or not isinstance(outlier_frac, numbers.Real):
        raise TypeError(f"outlier_frac must be a number in [0, 1], got {outlier_frac!r}")
    if not (0.0 <= outlier_frac <= 1.0):
        raise ValueError(f"outlier_frac must be in [0, 1], got {outlier_frac}")
    x = rng.standard_normal(shape)
    mask = rng.random(shape) < outlier_frac
    return x + mask * rng.standard_normal(shape) * _nonneg(outlier_std, "outlier_std")


def _softmax_rows(s):
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(axis=-1, keepdims=True)


def _rms(a):
    return float(np.sqrt(np.mean(np.square(a))))


def fp8_incoherent_experiment(rng, n=1024, d=128, n_heads=2, outlier_frac=1e-3, outlier_std=10.0):
    """Quantisation error of FP8 attention with and without a random Hadamard rotation of Q and K.

    For ``n_heads`` independent heads of ``outlier_qkv`` data (``n x d``), compares to float64:
    ``S = Q K^T`` against ``fp8(Q) fp8(K)^T`` ("plain") and ``fp8(Q J) fp8(K J)^T`` ("hadamard"), and the
    attention output ``softmax(S / sqrt(d)) V`` against the same with the FP8 scores and ``fp8(V)`` (softmax
    itself in float64, as FA3 keeps it in FP32). Returns a dict of RMS errors, their ratios, and
    ``rotation_err``: the largest ``|(QJ)(KJ)^T - QK^T|`` in float64 (rounding only).
    """
    _rng(rng)
    n, d, n_heads = check_positive_int(n, "n"), check_positive_int(d, "d"), check_positive_int(n_heads, "n_heads")
    err = {"s_plain": [], "s_hadamard": [], "o_plain": [], "o_hadamard": [], "s_rms": [], "o_rms": []}
    rot = 0.0
    for _ in range(n_heads):
        q, k, v = (outlier_qkv(rng, (n, d), outlier_frac, outlier_std) for _ in range(3))
        j = random_hadamard(d, rng)
        s = q @ k.T
        o = _softmax_rows(s / math.sqrt(d)) @ v
        v8 = quantize_fp8(v)
        s_plain = quantize_fp8(q) @ quantize_fp8(k).T
        s_had = quantize_fp8(q @ j) @ quantize_fp8(k @ j).T
        rot = max(rot, float(np.abs((q @ j) @ (k @ j).T - s).max()))
        for name, s8 in (("plain", s_plain), ("hadamard", s_had)):
            err["s_" + name].append(_rms(s8 - s))
            err["o_" + name].append(_rms(_softmax_rows(s8 / math.sqrt(d)) @ v8 - o))
        err["s_rms"].append(_rms(s))
        err["o_rms"].append(_rms(o))
    out = {key: float(np.sqrt(np.mean(np.square(vals)))) for key, vals in err.items()}
    out["s_ratio"] = out["s_plain"] / out["s_hadamard"]
    out["o_ratio"] = out["o_plain"] / out["o_hadamard"]
    out["rotation_err"] = rot
    return out


def aligned_error(s_true, s_approx):
    """Split the error ``E = s_approx - s_true`` of each score row into a part along the row itself and the rest.

    Per row, ``beta = <E, S> / <S, S>`` is a relative "temperature" error (the row's logits all scaled by
    ``1 + beta``); returns ``(rms of beta * S, rms of the remainder, max |beta|)``. Quantising an outlier
    coordinate of ``q`` with relative error ``eps`` scales that coordinate's whole contribution to the row by
    ``1 + eps``, which is mostly this aligned part; a rotation spreads the outlier over ``d`` coordinates whose
    independent roundings largely cancel along the row.
    """
    s_true, s_approx = np.asarray(s_true, dtype=np.float64), np.asarray(s_approx, dtype=np.float64)
    if s_true.shape != s_approx.shape or s_true.ndim < 1:
        raise ValueError(f"s_approx must have the shape of s_true {s_true.shape}, got {s_approx.shape}")
    e = s_approx - s_true
    denom = np.sum(s_true * s_true, axis=-1, keepdims=True)
    beta = np.sum(e * s_true, axis=-1, keepdims=True) / np.where(denom == 0, 1, denom)
    along = beta * s_true
    return _rms(along), _rms(e - along), float(np.abs(beta).max())


# --------------------------------------------------------------------------------------------------------------
# (c) cycle arithmetic: tensor cores vs the exponential unit
# --------------------------------------------------------------------------------------------------------------

# Per-SM throughput per clock, from the talk: dense tensor-core FLOPs (WGMMA on H100, UMMA on B200) and
# MUFU.EX2 operations. H100 fp16: 989 TFLOPS / (132 SMs * 1.83 GHz) = 4096.
HARDWARE = {
    "H100": {"mma_flops_per_cycle": {"fp16": 4096, "bf16": 4096, "fp8": 8192}, "exp_ops_per_cycle": 16, "sms": 132},
    "B200": {"mma_flops_per_cycle": {"fp16": 8192, "bf16": 8192, "fp8": 16384}, "exp_ops_per_cycle": 16, "sms": 148},
}


def tile_cycles(head_dim=128, block_m=128, block_n=128, gpu="H100", dtype="fp16"):
    """Cycles one SM spends on one ``block_m x block_n`` attention tile (FA3 talk, slides 19 and 55).

    GEMMs: ``S = Q K^T`` and ``O += P V`` are ``2 * block_m * block_n * head_dim`` FLOPs each. Softmax:
    one ``exp2`` per score, ``block_m * block_n`` MUFU ops. H100 fp16, hdim 128, 128 x 128:
    8.4 MFLOP / 4096 = 2048 cycles of tensor core vs 16384 / 16 = 1024 cycles of MUFU.
    """
    head_dim, block_m, block_n = (check_positive_int(head_dim, "head_dim"), check_positive_int(block_m, "block_m"),
                                  check_positive_int(block_n, "block_n"))
    if gpu not in HARDWARE:
        raise ValueError(f"gpu must be one of {sorted(HARDWARE)}, got {gpu!r}")
    hw = HARDWARE[gpu]
    if dtype not in hw["mma_flops_per_cycle"]:
        raise ValueError(f"dtype must be one of {sorted(hw['mma_flops_per_cycle'])}, got {dtype!r}")
    gemm_flops = 2 * 2 * block_m * block_n * head_dim
    exp_ops = block_m * block_n
    mma = gemm_flops / hw["mma_flops_per_cycle"][dtype]
    ex2 = exp_ops / hw["exp_ops_per_cycle"]
    return {"gemm_flops": gemm_flops, "exp_ops": exp_ops, "mma_cycles": mma, "mma_cycles_per_gemm": mma / 2,
            "exp_cycles": ex2, "exp_over_mma": ex2 / mma}


def pingpong_utilisation(mma_cycles, exp_cycles, overlap=True):
    """Tensor-core busy fraction for a stream of tiles, each ``mma_cycles`` of GEMM then ``exp_cycles`` of softmax.

    Without overlap a warpgroup alternates GEMM and softmax, so tensor cores idle during softmax:
    ``mma / (mma + exp)``. With two warpgroups in pingpong (one's softmax under the other's GEMMs) a period
    of two tiles takes ``max(2 * mma, mma + exp)``: utilisation ``2 mma / max(2 mma, mma + exp)``.
    """
    mma, ex = _nonneg(mma_cycles, "mma_cycles"), _nonneg(exp_cycles, "exp_cycles")
    if mma == 0:
        raise ValueError("mma_cycles must be > 0")
    if not check_flag(overlap, "overlap"):
        return mma / (mma + ex)
    return 2 * mma / max(2 * mma, mma + ex)


def persistent_time(n_tiles, n_sms, mainloop, prologue, epilogue, persistent=True):
    """Time to run ``n_tiles`` equal tiles on ``n_sms`` SMs (slide 25).

    One CTA per tile: each SM runs its tiles back to back, paying prologue (load Q, first K/V) + mainloop +
    epilogue (write O, LSE) each time. Persistent kernel: one CTA per SM loops over tiles; the next tile's
    prologue and this tile's epilogue (async TMA store) hide under mainloops, so only the first prologue and the
    last epilogue show.
    """
    n_tiles, n_sms = check_positive_int(n_tiles, "n_tiles"), check_positive_int(n_sms, "n_sms")
    main, pro, epi = _nonneg(mainloop, "mainloop"), _nonneg(prologue, "prologue"), _nonneg(epilogue, "epilogue")
    waves = -(-n_tiles // n_sms)
    if not check_flag(persistent, "persistent"):
        return waves * (pro + main + epi)
    return pro + waves * main + (waves - 1) * max(0.0, pro + epi - main) + epi


# --------------------------------------------------------------------------------------------------------------
# (d) GQA packing
# --------------------------------------------------------------------------------------------------------------

def gqa_packing(q_len, n_q_heads, n_kv_heads, tile_m=64):
    """Rows of ``tile_m``-row MMA tiles (WGMMA: M = 64) that hold real queries, per KV head.

    Unpacked: each query head is its own tile row-block of ``q_len`` rows, padded to ``tile_m``.
    Packed (FA3 / FA2 decode): the ``g = Hq / Hkv`` heads sharing a KV head are stacked into one
    ``g * q_len``-row block, so K/V is loaded once for the group instead of ``g`` times.
    """
    q_len, hq, hkv, tile_m = (check_positive_int(q_len, "q_len"), check_positive_int(n_q_heads, "n_q_heads"),
                              check_positive_int(n_kv_heads, "n_kv_heads"), check_positive_int(tile_m, "tile_m"))
    g = check_gqa(hq, hkv, "n_q_heads", "n_kv_heads")
    rows = g * q_len
    tiles_unpacked = g * -(-q_len // tile_m)
    tiles_packed = -(-rows // tile_m)
    return {"group": g, "useful_rows": rows,
            "tiles_unpacked": tiles_unpacked, "util_unpacked": rows / (tiles_unpacked * tile_m),
            "tiles_packed": tiles_packed, "util_packed": rows / (tiles_packed * tile_m),
            "kv_loads_unpacked": g, "kv_loads_packed": 1}


def accumulator_registers(rows, cols, threads=128):
    """32-bit registers per thread to hold a ``rows x cols`` fp32 accumulator spread over ``threads`` threads.

    A warpgroup is 128 threads; a thread can address at most 255 registers. MLA (slide 52): O is 64 x 512, so
    one warpgroup would need 256 per thread for O alone. Split the PV output between two warpgroups (256
    columns each: 128 registers) and let WG1 also hold the 64 x 64 S accumulator of QK^T (32 more): 160.
    """
    rows, cols, threads = check_positive_int(rows, "rows"), check_positive_int(cols, "cols"), check_positive_int(threads, "threads")
    return rows * cols / threads


def decode_intensity(q_len, n_q_heads, qk_dim, v_dim, kv_bytes_per_token):
    """FLOPs per byte of KV cache read when ``q_len`` tokens of ``n_q_heads`` heads attend one KV head.

    Per cached token: ``2 * q_len * n_q_heads * (qk_dim + v_dim)`` FLOPs (QK^T and PV) for
    ``kv_bytes_per_token`` bytes. MHA/GQA decode reuses each byte for a handful of heads (memory-bound); MLA
    shares one 576-wide latent among 128 heads, which is near an H100's ridge point even at ``q_len = 1``.
    """
    q_len, hq, dqk, dv = (check_positive_int(q_len, "q_len"), check_positive_int(n_q_heads, "n_q_heads"), check_positive_int(qk_dim, "qk_dim"),
                          check_positive_int(v_dim, "v_dim"))
    nbytes = _nonneg(kv_bytes_per_token, "kv_bytes_per_token")
    if nbytes == 0:
        raise ValueError("kv_bytes_per_token must be > 0")
    return 2.0 * q_len * hq * (dqk + dv) / nbytes


def split_kv_time(batch, heads, n_keys, num_splits=1, n_sms=132, merge_cost=0.0):
    """Occupancy model of one decode step: ``batch * heads * num_splits`` thread blocks on ``n_sms`` SMs.

    Each thread block streams its ``ceil(n_keys / num_splits)`` keys at one key per time unit (an SM's share of
    the memory system; decode is memory-bound), blocks run in waves of ``n_sms``, and with more than one split a
    reduction (merge_states) costs ``merge_cost`` per split. ``num_splits = 1`` is FlashAttention-2 on a decode
    step: one thread block per (sequence, head), most SMs idle when ``batch * heads < n_sms``.
    Returns ``{"time", "blocks", "waves", "sm_utilisation"}``.
    """
    batch, heads, n_keys = check_positive_int(batch, "batch"), check_positive_int(heads, "heads"), check_positive_int(n_keys, "n_keys")
    num_splits, n_sms = check_positive_int(num_splits, "num_splits"), check_positive_int(n_sms, "n_sms")
    merge_cost = _nonneg(merge_cost, "merge_cost")
    blocks = batch * heads * num_splits
    waves = -(-blocks // n_sms)
    per_block = -(-n_keys // num_splits)
    time = waves * per_block + (merge_cost * num_splits if num_splits > 1 else 0.0)
    return {"time": float(time), "blocks": blocks, "waves": waves, "sm_utilisation": blocks / (waves * n_sms)}
