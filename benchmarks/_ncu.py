"""Nsight Compute: the sections and extra metrics the Hopper profiles ask for and the summary of its CSV
(``tune_bwd_hopper``, ``bench_gluon``, ``ncu_gluon_train``, ``probe_read_ceiling``)."""
from __future__ import annotations

NCU_SECTIONS = ["SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
                "WarpStateStats"]
NCU_EXTRA = {"sm__pipe_tensor_op_gmma_cycles_active": ".avg.pct_of_peak_sustained_active",
             "sm__pipe_tensor_op_hmma_cycles_active": ".avg.pct_of_peak_sustained_active",
             "sm__inst_executed_pipe_tensor_op_gmma": ".sum",
             "sm__ops_path_tensor_src_bf16_dst_fp32": ".sum",
             "lts__t_sectors_op_red": ".sum", "lts__t_sectors_op_atom": ".sum",
             "lts__t_sector_hit_rate": ".pct"}


NCU_SUMMARY = {"Duration": "duration_ns", "Compute (SM) Throughput": "sm_throughput_pct",
               "L2 Cache Throughput": "l2_throughput_pct", "DRAM Throughput": "dram_throughput_pct",
               "L1/TEX Cache Throughput": "l1_throughput_pct", "L2 Hit Rate": "l2_hit_rate_pct",
               "Registers Per Thread": "registers", "Dynamic Shared Memory Per Block": "shared_bytes",
               "Block Limit Registers": "ctas_per_sm_by_registers", "Block Limit Shared Mem": "ctas_per_sm_by_smem",
               "Achieved Occupancy": "achieved_occupancy_pct", "Issue Slots Busy": "issue_slots_busy_pct",
               "Warp Cycles Per Issued Instruction": "warp_cycles_per_issue",
               "Local Memory Spilling Requests": "local_spill_requests",
               "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pipe_active_pct",
               "sm__ops_path_tensor_src_bf16_dst_fp32.sum": "tensor_flops",
               "lts__t_sectors_op_red.sum": "l2_red_sectors"}


def summarize_ncu(csv_path):
    """One dict per profiled kernel (in launch order) from ``ncu --csv --page details`` output, with the
    tensor-pipe FLOP rate (``tensor_flops / duration``)."""
    import csv
    import io
    with open(csv_path) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    kernels = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        k = kernels.setdefault(r["ID"], {"kernel": r["Kernel Name"][:80], "block": r["Block Size"],
                                         "grid": r["Grid Size"]})
        if r["Metric Name"] in NCU_SUMMARY:
            k[NCU_SUMMARY[r["Metric Name"]]] = float(r["Metric Value"].replace(",", ""))
    for k in kernels.values():
        if k.get("tensor_flops") and k.get("duration_ns"):
            k["tensor_tflops"] = k["tensor_flops"] / k["duration_ns"] / 1e3
    return list(kernels.values())
