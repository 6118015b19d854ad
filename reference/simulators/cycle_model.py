"""Cycle and occupancy arithmetic of the Hopper attention kernels.

One of the simulations of Tri Dao's FlashAttention-3 talk ("Optimizing Attention for Modern Hardware") that
``reference.simulators`` holds. Nothing here runs on a GPU: each function turns one slide into arithmetic or a
simulation that can be checked.

* Overlapping GEMM and softmax (slides 19-22, 55): ``tile_cycles`` is the talk's cycle count for one
  ``block_m x block_n`` tile (two GEMMs on tensor cores vs ``exp2`` on the MUFU), ``pingpong_utilisation`` the
  tensor-core busy fraction with and without overlapping two warpgroups, ``persistent_time`` what hiding
  the prologue/epilogue buys.
* GQA packing (slide 50): ``gqa_packing`` counts how much of a 64-row WGMMA tile holds real query rows when
  one query token per head is decoded, with and without packing the query heads that share a KV head.
"""
from __future__ import annotations

from .._args import check_flag, check_gqa, check_nonneg_real, check_positive_int

__all__ = ["HARDWARE", "tile_cycles", "pingpong_utilisation", "persistent_time", "gqa_packing",
           "accumulator_registers", "decode_intensity", "split_kv_time"]


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
    mma, ex = check_nonneg_real(mma_cycles, "mma_cycles"), check_nonneg_real(exp_cycles, "exp_cycles")
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
    main, pro, epi = check_nonneg_real(mainloop, "mainloop"), check_nonneg_real(prologue, "prologue"), check_nonneg_real(epilogue, "epilogue")
    waves = -(-n_tiles // n_sms)
    if not check_flag(persistent, "persistent"):
        return waves * (pro + main + epi)
    return pro + waves * main + (waves - 1) * max(0.0, pro + epi - main) + epi


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
    nbytes = check_nonneg_real(kv_bytes_per_token, "kv_bytes_per_token")
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
    merge_cost = check_nonneg_real(merge_cost, "merge_cost")
    blocks = batch * heads * num_splits
    waves = -(-blocks // n_sms)
    per_block = -(-n_keys // num_splits)
    time = waves * per_block + (merge_cost * num_splits if num_splits > 1 else 0.0)
    return {"time": float(time), "blocks": blocks, "waves": waves, "sm_utilisation": blocks / (waves * n_sms)}
