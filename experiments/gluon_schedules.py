"""The ablation schedules of the Gluon forward (lecture 06 section 10; notes/hopper.md section 1c), built from
the production kernel's pieces in ``reference.triton.hopper.flash_gluon``.

The wing keeps one forward: warp-specialised, ping-pong, persistent. Each ablation here removes one of its three
ideas, so that lecture 06 and ``benchmarks/course/bench_gluon.py``'s variants table can measure what each is worth:

* ``"overlap"`` (``fwd_overlap_kernel``): FA3 Algorithm 2, intra-warpgroup overlap in ONE partition (no producer
  warp, no register reallocation): the warps refill the K/V rings themselves (``attend_overlapped(LOADS=True)``);
  ``num_warps = 8`` is two warpgroups of 64 rows that meet at a CTA barrier before a refill (``SYNC``);
* ``"specialized"``: the warp-specialised kernel without the ping-pong turn barriers (``TURNS=False``): warp
  specialisation and register reallocation alone, the two consumers left to the warp schedulers;
* ``persistent=False`` (``fwd_ws_kernel``): one CTA per query tile instead of one per SM looping over tiles.

``forward(q, k, v, causal, scale, schedule, config, persistent)`` runs any combination on an H100/H200 (with the
production ``("pingpong", persistent=True)`` it is the wing's kernel); ``compile_forward`` builds any for sm_90a on
a machine without a GPU:

    TRITON_INTERPRET=0 python -m experiments.gluon_schedules [pingpong|specialized|overlap] [--d 128] [--causal]
        [--one-cta-per-tile]

Nothing in ``reference``, no README benchmark and no test of a public name depends on this module.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from reference.triton.hopper import flash_gluon as fg
from reference.triton.hopper._aot import compile_gluon, resource_usage
from reference.triton._checks import check_gluon_device, check_gluon_inputs
from reference.triton.configs import GLUON_FORWARD, GluonForwardConfig
from reference.triton.hopper.common import init_ring_barriers

SCHEDULES = ("pingpong", "specialized", "overlap")
#: each schedule's tile: the warp-specialised ones the production kernel's, "overlap" one warp per 16 query rows
SCHEDULE_CONFIGS = {"overlap": GluonForwardConfig(num_warps=8), "pingpong": GLUON_FORWARD, "specialized": GLUON_FORWARD}


@gluon.jit
def tile_origin(H_Q, GROUP, N_Q, N_K, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
    """This CTA's query tile: ``(start_m, q_row0, kv_row0)``, the tile's first query row within its head and the
    first rows of its (batch, query head) and of the kv head it reads (GQA: ``h // GROUP``) in the 2-D views.
    Grid ``(cdiv(N_Q, BLOCK_M), B * H_Q)``; causal: the heaviest query blocks launch first (a shorter tail)."""
    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = gl.num_programs(0) - 1 - pid_m
    pid_bh = gl.program_id(1)
    b = pid_bh // H_Q
    h = pid_bh % H_Q
    return pid_m * BLOCK_M, pid_bh * N_Q, (b * (H_Q // GROUP) + h // GROUP) * N_K


# --------------------------------------------------------------------------------------------------------------
# schedule "overlap": one partition, FA3 Algorithm 2 (intra-warpgroup overlap of softmax with P V)
# --------------------------------------------------------------------------------------------------------------
@gluon.jit
def fwd_overlap_kernel(desc_q, desc_k, desc_v, O, LSE, H_Q, GROUP, N_Q, N_K, qk_scale,
                        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """One CTA = one ``BLOCK_M``-row query tile of one (batch, query head); grid ``(cdiv(N_Q, BLOCK_M), B * H_Q)``."""
    dtype: gl.constexpr = desc_q.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    start_m, q_row0, kv_row0 = tile_origin(H_Q, GROUP, N_Q, N_K, BLOCK_M, CAUSAL)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    full_end, hi = fg.key_range(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    # FA2 Algorithm 1 line 4 (Q_i) and the first STAGES key/value tiles, all in flight at once
    mbarrier.expect(q_bar, desc_q.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_q, [q_row0 + start_m, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        fg.issue_kv(desc_k, k_smem, k_bars, i, kv_row0, hi, BLOCK_N, STAGES)
        fg.issue_kv(desc_v, v_smem, v_bars, i, kv_row0, hi, BLOCK_N, STAGES)
    mbarrier.wait(q_bar, 0)

    acc, m_i, l_i = fg.attend_overlapped(q_smem, k_smem, v_smem, k_bars, v_bars, desc_k, desc_v, kv_row0, full_end,
                                       hi, start_m, N_Q, N_K, qk_scale, q_bar, 0, 0, 0, s_layout, o_layout, BLOCK_M,
                                       BLOCK_N, HEAD_DIM, STAGES, CAUSAL, LOADS=True, SYNC=num_warps > 4,
                                       PINGPONG=False)
    fg.store_output(acc, m_i, l_i, O, LSE, q_row0, start_m, N_Q, o_layout, BLOCK_M, HEAD_DIM)


# --------------------------------------------------------------------------------------------------------------
# one CTA per tile: the warp-specialised kernel before persistence
# --------------------------------------------------------------------------------------------------------------
@gluon.jit
def _ws_consumer(q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, turn_bars, O, LSE, q_row0, kv_row0, start_m,
                 full_end, hi, N_Q, N_K, qk_scale, WG: gl.constexpr, HEAD_DIM: gl.constexpr, HALF: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, TURNS: gl.constexpr):
    """Consumer warpgroup ``WG`` (0: the default partition, 1: a worker): query rows ``WG * HALF ..`` of the tile."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    my_start = start_m + WG * HALF
    mbarrier.wait(q_bars.index(WG), 0)
    acc, m_i, l_i = fg.attend_overlapped(q_smem.index(WG), k_smem, v_smem, k_bars, v_bars, k_bars, v_bars, kv_row0,
                                       full_end, hi, my_start, N_Q, N_K, qk_scale, turn_bars, WG, 0, 0, s_layout,
                                       o_layout, HALF, BLOCK_N, HEAD_DIM, STAGES, CAUSAL, LOADS=False, SYNC=False,
                                       PINGPONG=TURNS)
    fg.store_output(acc, m_i, l_i, O, LSE, q_row0, my_start, N_Q, o_layout, HALF, HEAD_DIM)


@gluon.jit
def _ws_producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, q_row0, kv_row0,
                 start_m, hi, HALF: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """The producer warp: both query halves, then K_t and V_t for t < hi, each once both consumers freed its slot."""
    for w in gl.static_range(2):
        mbarrier.expect(q_bars.index(w), desc_q.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_q, [q_row0 + start_m + w * HALF, 0], q_bars.index(w), q_smem.index(w))
    # the ring count starts at 0, as a run-time value (``produce_kv`` carries it through its loop)
    fg.produce_kv(desc_k, desc_v, k_smem, v_smem, k_bars, v_bars, kv_row0, hi, hi * 0, BLOCK_N, STAGES)


@gluon.jit
def fwd_ws_kernel(desc_q, desc_k, desc_v, O, LSE, H_Q, GROUP, N_Q, N_K, qk_scale,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr, CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                   PRODUCER_REGS: gl.constexpr, TURNS: gl.constexpr, num_warps: gl.constexpr):
    """One CTA = one ``BLOCK_M``-row query tile (two consumers of ``BLOCK_M / 2`` rows) + a producer warp."""
    HALF: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = desc_q.dtype
    start_m, q_row0, kv_row0 = tile_origin(H_Q, GROUP, N_Q, N_K, BLOCK_M, CAUSAL)

    q_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())  # ready, then empty
    v_bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turn_bars.index(i), count=1)
    init_ring_barriers(k_bars, v_bars, STAGES, 2)
    fence_async_shared()
    # both consumers walk the key blocks of the whole tile (same count, so the turn-taking stays paired); each
    # masks with its own rows
    full_end, hi = fg.key_range(start_m, N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    gl.warp_specialize([
        (_ws_consumer, (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, turn_bars, O, LSE, q_row0, kv_row0, start_m,
                        full_end, hi, N_Q, N_K, qk_scale, 0, HEAD_DIM, HALF, BLOCK_N, STAGES, CAUSAL, TURNS)),
        (_ws_consumer, (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, turn_bars, O, LSE, q_row0, kv_row0, start_m,
                        full_end, hi, N_Q, N_K, qk_scale, 1, HEAD_DIM, HALF, BLOCK_N, STAGES, CAUSAL, TURNS)),
        (_ws_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, q_row0, kv_row0,
                        start_m, hi, HALF, BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# --------------------------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------------------------
def check_config(config, schedule: str) -> GluonForwardConfig:
    """``config``: a ``configs.GluonForwardConfig`` for ``schedule`` (default ``SCHEDULE_CONFIGS[schedule]``): one
    warp per 16 query rows in "overlap"; the production kernel's rules (``fg.check_gluon_config``) else."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if config is None:
        return SCHEDULE_CONFIGS[schedule]
    if schedule != "overlap":
        return fg.check_gluon_config(config)
    if type(config) is not GluonForwardConfig:
        raise TypeError(f"config must be a reference.triton.configs.GluonForwardConfig or None, got {config!r}")
    bm, bn, stages, warps = config.block_m, config.block_n, config.num_stages, config.num_warps
    if bn not in (64, 128) or stages not in (2, 3) or warps not in (4, 8) or bm != 16 * warps:
        raise ValueError(f"config for schedule 'overlap': block_n 64 or 128, num_stages 2 or 3, num_warps 4 or 8 and "
                         f"block_m = 16 * num_warps (one warp per 16 query rows), got {config}")
    return config


def forward(q, k, v, causal=False, scale=None, schedule="pingpong", config=None, persistent=True):
    """Run one schedule on an H100/H200; return ``(o, lse)`` as ``flash_attention_forward_gluon`` does.
    ``persistent`` applies to the warp-specialised schedules only ("overlap" is one CTA per tile)."""
    B, Hq, Hkv, Nq, Nk, d, group, causal, scale = check_gluon_inputs(q, k, v, causal, scale, "forward")
    config = check_config(config, schedule)
    if persistent and schedule == "overlap":
        raise ValueError("persistent=True needs a warp-specialised schedule ('pingpong' or 'specialized')")
    check_gluon_device(q.device, "experiments.gluon_schedules.forward")
    o = torch.empty((B, Hq, Nq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    bm, bn, stages, warps = config.block_m, config.block_n, config.num_stages, config.num_warps
    if schedule == "overlap":
        args = fg.forward_args(q, k, v, o, lse, bn, bm, scale, group)
        fwd_overlap_kernel[(triton.cdiv(Nq, bm), B * Hq)](*args, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages,
                                                          CAUSAL=causal, num_warps=warps)
        return o, lse
    args = fg.forward_args(q, k, v, o, lse, bn, bm // 2, scale, group)
    cx = fg.ws_constexprs(d, config, causal, turns=schedule == "pingpong")
    if persistent:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        grid = fg.persistent_grid(B, Hq, Nq, bm, causal, sms)
        fg.fwd_ws_persistent_kernel[grid](*args, B * Hq, **cx, maxnreg=fg.PINGPONG_MAXNREG)
    else:
        fwd_ws_kernel[(triton.cdiv(Nq, bm), B * Hq)](*args, **cx, maxnreg=fg.PINGPONG_MAXNREG)
    return o, lse


def compile_forward(schedule: str = "pingpong", head_dim: int = 128, causal: bool = False, config=None,
                    dtype: str = "bf16", persistent: bool = True):
    """Compile one schedule for sm_90a without a GPU (run with ``TRITON_INTERPRET=0``)."""
    config = check_config(config, schedule)
    bm, bn, warps = config.block_m, config.block_n, config.num_warps
    if schedule == "overlap":
        cx = dict(HEAD_DIM=head_dim, BLOCK_M=bm, BLOCK_N=bn, STAGES=config.num_stages, CAUSAL=causal, num_warps=warps)
        return compile_gluon(fwd_overlap_kernel, fg.forward_signature(bm, bn, head_dim, dtype), cx, warps)
    if persistent:
        return fg.compile_forward(head_dim, causal, config, dtype, turns=schedule == "pingpong")
    return compile_gluon(fwd_ws_kernel, fg.forward_signature(bm // 2, bn, head_dim, dtype),
                         fg.ws_constexprs(head_dim, config, causal, turns=schedule == "pingpong"), warps,
                         maxnreg=fg.PINGPONG_MAXNREG)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Compile a Gluon forward schedule for sm_90a; print its resource usage")
    ap.add_argument("schedule", nargs="?", default="pingpong", choices=SCHEDULES)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--config", default=None, help="BLOCK_M,BLOCK_N,STAGES,num_warps")
    ap.add_argument("--one-cta-per-tile", action="store_true", help="the non-persistent warp-specialised kernel")
    args = ap.parse_args(argv)
    cfg = None
    if args.config:
        bm, bn, stages, warps = (int(x) for x in args.config.split(","))
        cfg = GluonForwardConfig(block_m=bm, block_n=bn, num_stages=stages, num_warps=warps)
    persistent = args.schedule != "overlap" and not args.one_cta_per_tile
    usage = resource_usage(compile_forward(args.schedule, args.d, args.causal, cfg, persistent=persistent))
    print(json.dumps({"schedule": args.schedule, "d": args.d, "causal": args.causal, "config": args.config,
                      "persistent": persistent, **usage}))


if __name__ == "__main__":
    main()
