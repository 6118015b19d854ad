"""Each paged-prefill kernel once, with pinned tiles, for ncu (notes/serving_perf.md, "Paged prefill on Triton page tiles").

    ncu --section SpeedOfLight ... -k regex:"_attn_fwd|paged_prefill_kernel" \\
        python3 -m benchmarks.tuning.profile_paged_prefill [--pins 64x64x4x3,128x64x8x3]

bench_mixed_batch's prefill shape (bf16, 8 chunks of 512 after 4k cached keys, Hq=32, Hkv=8, d=128). For each
pin, in this launch order (ncu's IDs follow it; the order is also printed): 64-token pages: contiguous varlen
(``_attn_fwd``), page tiles (``paged_prefill_kernel``), page tiles with the table looked up in place, row
gather (``_attn_fwd``); 16-token pages: contiguous, page tiles, row gather. Each output is checked against the contiguous
one before the next launch (a wrong kernel is not profiled silently).
"""
from __future__ import annotations

import argparse
import sys

import torch

from benchmarks import _serving_cases as cases
from benchmarks._common import rel_err
from experiments.serving_baselines import paged_prefill_row_gather
from reference.triton import DEVICE, configs, flash_attention_varlen_forward, paged_prefill
from reference.triton.paged_tiles import launch_paged_prefill


def run(pins):
    B, n, chunk = 8, 4608, 512
    order = []
    for pin_s in pins:
        bm_, bn, w, st = (int(x) for x in pin_s.split("x"))
        pin = {"BLOCK_M": bm_, "BLOCK_N": bn, "num_warps": w, "num_stages": st}
        for bs in (64, 16):
            q, kc, vc, table, cu_q, cu_k, lens, k, v = cases.prefill_case(B, n, chunk, bs)
            with configs.pinned(fwd=pin):
                ref, _ = flash_attention_varlen_forward(q, k, v, cu_q, cu_k, chunk, n, causal=True)
                order.append(f"{pin_s} page{bs} contiguous")
                o, _ = paged_prefill(q, kc, vc, table, cu_q, lens, chunk, gather="page")
                order.append(f"{pin_s} page{bs} page_tiles")
                assert rel_err(o, ref) < 2e-2
                if bs == 64:
                    o = torch.empty_like(q)
                    lse = torch.empty((cases.HQ, q.shape[0]), dtype=torch.float32, device=DEVICE)
                    launch_paged_prefill(q, kc, vc, o, lse, cu_q, lens, table, chunk, True, cases.D ** -0.5,
                                         cases.HQ // cases.HKV, config=pin, ahead=False)
                    order.append(f"{pin_s} page{bs} page_tiles_table_in_place")
                    assert rel_err(o, ref) < 2e-2
                o, _ = paged_prefill_row_gather(q, kc, vc, table, cu_q, lens, chunk)
                order.append(f"{pin_s} page{bs} row_gather")
                assert rel_err(o, ref) < 2e-2
    torch.cuda.synchronize()
    print("launch order (kernels of interest):", "; ".join(order))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pins", default="128x64x8x3,64x64x4x3")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    run(args.pins.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
