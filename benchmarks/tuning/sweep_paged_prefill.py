"""Tiles x table look-ahead for the page-aligned paged prefill, beside the contiguous forward on the same tile.

    python3 -m benchmarks.tuning.sweep_paged_prefill --out DIR      # DIR/<gpu>-paged-prefill-sweep.json

bench_mixed_batch's prefill shape (bf16, 8 chunks of 512 after 4k cached keys, Hq=32, Hkv=8, d=128), 16- and
64-token pages. Each pinned tile (BLOCK_M, BLOCK_N, warps, stages): ``flash_attention_varlen_forward`` on the
keys stored contiguously, ``paged_tiles`` with the table looked up one block ahead (the default) and in place;
the autotuned contiguous forward once per page size as the bar's baseline. Every paged output is checked against
the contiguous one before it is timed (notes/serving_perf.md, "Paged prefill on Triton page tiles").
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from benchmarks import _serving_cases as cases
from benchmarks._common import rel_err
from benchmarks import _common, write_json
from reference.triton import DEVICE, configs, flash_attention_varlen_forward
from reference.triton.paged_tiles import launch_paged_prefill

TILES = [(64, 64, 4, 3), (64, 64, 4, 4), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3)]


def sweep(log):
    B, n, chunk = 8, 4608, 512
    out = {}
    for bs in (16, 64):
        q, kc, vc, table, cu_q, cu_k, lens, k, v = cases.prefill_case(B, n, chunk, bs)
        o = torch.empty_like(q)
        lse = torch.empty((cases.HQ, q.shape[0]), dtype=torch.float32, device=DEVICE)

        def contiguous():
            return flash_attention_varlen_forward(q, k, v, cu_q, cu_k, chunk, n, causal=True, validate=False)
        with configs.pinned(fwd=configs.AUTOTUNE):
            ref, _ = contiguous()
            row = {"contiguous_autotuned_ms": _common.bench(contiguous)}
        for tile in TILES:
            pin = dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), tile))
            name = "x".join(map(str, tile))
            res = {}
            try:
                with configs.pinned(fwd=pin):
                    res["contiguous_ms"] = _common.bench(contiguous)
                for ahead in (True, False):
                    def paged(ahead=ahead):
                        launch_paged_prefill(q, kc, vc, o, lse, cu_q, lens, table, chunk, True, cases.D ** -0.5,
                                             cases.HQ // cases.HKV, config=pin, ahead=ahead)
                    paged()
                    err = rel_err(o, ref)
                    assert err < 2e-2, (tile, ahead, err)
                    res[f"paged_ahead_{int(ahead)}_ms"] = _common.bench(paged)
            except Exception as exc:  # noqa: BLE001 - a tile that fails (shared memory) is a result
                res["failed"] = repr(exc)[:200]
            row[name] = res
            log(f"page {bs} tile {name}: " + ", ".join(f"{k} {v * 1e3:.1f} us" if isinstance(v, float) else
                                                         f"{k} {v}" for k, v in res.items()))
        log(f"page {bs}: contiguous autotuned {row['contiguous_autotuned_ms'] * 1e3:.1f} us")
        out[str(bs)] = row
        del kc, vc, k, v
        cases.empty_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    t0 = time.time()
    log, _ = _common.timestamped_log(t0)
    res = dict(meta=_common.run_meta(timing="do_bench median, L2 flushed"))
    res["pages"] = sweep(log)
    path = write_json(args.out, f"{_common.result_tag()}-paged-prefill-sweep.json", res)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
