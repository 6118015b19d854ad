"""The FP8 Gluon forward's softmax-latency schedule options against the default and the bf16 Gluon forward (one GPU call).

    python3 -m benchmarks.tuning.probe_fp8_schedule --out DIR     # DIR/<gpu>-fp8-schedule-probe.json

The bar: FP8 Gluon >= 1.5x the bf16 Gluon forward at d = 128, N >= 4k, kernel alone).
notes/hopper.md, "FP8 softmax latency", has the predictions. Options (``flash_fp8_gluon.check_schedule``):

* ``thread_arrive``: every consumer thread arrives on a ring slot's free barrier for itself (no warpgroup
  ``bar.sync`` before the arrive), the free barriers in allocations of their own (no ``bar.sync`` between an
  arrive and the next wait): 1 ``BAR.SYNC`` per key block instead of 3 in the SASS;
* ``fence``: as before (K freed after the softmax), here with ``thread_arrive``.

(A third option, ``prefetch``: ``S_{j+1} = Q K_{j+1}^T`` issued before the softmax of ``S_j``, was measured by this
probe at 0.27-0.45x the default (two score tiles live: spills) and then removed from the kernel:
notes/experiments_removed.md; its rows stay in ``h100-fp8-schedule-probe.json``.)

First every option is checked on the GPU: against float64 on the dequantised inputs (o < 6e-2, lse within
``tests/oracle.fp8_lse_bound``) and against the default (same roundings: o < 1e-3, lse < 1e-4) on shapes with
ragged N, GQA, causal with Nq != Nk and several tiles per CTA; a failed check stops the run before timing.
Then kernel alone on the same quantised inputs, d = 128, H = 16, B N = 16k, N = 4k / 8k / 16k, causal and not:
every implementation timed ``ROUNDS`` times, half the rounds rotated in the listed order and half in the
reversed order (``_common.both_ways`` over ``_common.rotated_rounds``); per option the median ratio to the
pin and to the bf16 Gluon forward, the ratio of fastest rounds and the rounds' spread.
"""
from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks import _common, write_json

ROUNDS = 6
SEQLENS = (4096, 8192, 16384)
TOKENS, D, H = 16384, 128, 16
#: the options timed, each on top of the default (``configs.FP8_GLUON_SCHEDULE``)
OPTIONS = {"thread_arrive": {"thread_arrive": True},
           "thread_arrive_fence": {"thread_arrive": True, "fence": True}}
#: (B, Hq, Hkv, Nq, Nk, causal), d = 128: ragged, GQA, bottom-right causal both ways, several tiles a CTA
CHECKS = [(1, 4, 4, 1000, 1000, False), (1, 4, 4, 1000, 1000, True), (2, 8, 2, 512, 512, True),
          (1, 2, 2, 300, 1000, True), (1, 2, 2, 1000, 300, True), (4, 8, 8, 1000, 700, False),
          (1, 8, 8, 4096, 4096, True)]
O_TOL = 6e-2  # o vs float64 on the dequantised inputs (tests/test_triton_fp8_gluon.py)


def _schedules() -> dict:
    from reference.triton.configs import FP8_GLUON_SCHEDULE
    return {name: dict(FP8_GLUON_SCHEDULE, **opt) for name, opt in OPTIONS.items()}


def check() -> tuple[list, bool]:
    """Every option against float64 on the dequantised inputs and against the default (module docstring)."""
    from benchmarks._common import lse_abs, ref64
    from benchmarks._common import rel_err as rel
    from reference.triton.hopper import flash_fp8_gluon as fg
    from tests.oracle import FP8_MMA_BITS, fp8_lse_violation
    rows, ok_all = [], True
    for (B, Hq, Hkv, Nq, Nk, causal) in CHECKS:
        q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = v * torch.rand(1, 1, Nk, 1, device="cuda", dtype=v.dtype) * 30  # V blocks of different scales
        x = fg.prepare_fp8_gluon(q, k, v, causal=causal)
        do, dl = ref64(x.q.dequantize(), x.k.dequantize(), x.v.dequantize(), causal)
        po, pl = fg.attention_fp8_gluon(x, out_dtype=torch.float32)
        for name, sch in {"pin": None, **_schedules()}.items():
            o, lse = fg.attention_fp8_gluon(x, out_dtype=torch.float32, schedule=sch)
            torch.cuda.synchronize()
            row = {"shape": [B, Hq, Hkv, Nq, Nk, D], "causal": causal, "option": name,
                   "o_rel_dequant": rel(o, do), "lse_abs_dequant": lse_abs(lse, dl),
                   "lse_dequant_violation": fp8_lse_violation(lse, dl, x.q.dequantize(), x.k.dequantize(), causal,
                                                              x.scale, FP8_MMA_BITS),
                   "o_rel_vs_pin": rel(o, po), "lse_abs_vs_pin": lse_abs(lse, pl), "nan": bool(torch.isnan(o).any())}
            row["ok"] = bool(row["o_rel_dequant"] < O_TOL and row["lse_dequant_violation"] < 1 and not row["nan"]
                             and row["o_rel_vs_pin"] < 1e-3 and row["lse_abs_vs_pin"] < 1e-4)
            ok_all = ok_all and row["ok"]
            print(f"check {row}", flush=True)
            rows.append(row)
    return rows, ok_all


def timings() -> list:
    """Kernel alone, each option vs the default and the bf16 Gluon forward (module docstring)."""
    from benchmarks._common import rel_err as rel
    from benchmarks._common import both_ways
    from benchmarks._common import hopper_bench as bench
    from reference.triton.flash_fwd import forward_flops
    from reference.triton.hopper import flash_fp8_gluon as fg
    from reference.triton.hopper.flash_gluon import flash_attention_forward_gluon
    out = []
    for causal in (False, True):
        for N in SEQLENS:
            B = TOKENS // N
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = forward_flops(B, H, N, N, D, causal)
            x = fg.prepare_fp8_gluon(q, k, v, causal=causal)
            fns = {"gluon_bf16": lambda: flash_attention_forward_gluon(q, k, v, causal=causal),
                   "fp8_pin": lambda: fg.attention_fp8_gluon(x)}
            for name, sch in _schedules().items():
                fns[f"fp8_{name}"] = (lambda s: lambda: fg.attention_fp8_gluon(x, schedule=s))(sch)
            row = {"N": N, "B": B, "H": H, "d": D, "causal": causal}
            with torch.no_grad():
                pin_o, pin_l = fns["fp8_pin"]()
                for n, fn in fns.items():
                    if n.startswith("fp8_") and n != "fp8_pin":
                        o, lse = fn()
                        row[n] = {"o_rel_vs_pin": rel(o, pin_o), "lse_abs_vs_pin": float((lse - pin_l).abs().max())}
                    else:
                        row[n] = {}
                ms, row["orders"] = both_ways(fns, ROUNDS, bench)
            for n, r in ms.items():
                m = statistics.median(r)
                row[n].update(ms=m, tflops=flops / m / 1e9, rounds_ms=r, spread=(max(r) - min(r)) / m,
                              x_pin=statistics.median(ms["fp8_pin"]) / m, x_pin_fastest=min(ms["fp8_pin"]) / min(r),
                              x_gluon_bf16=statistics.median(ms["gluon_bf16"]) / m,
                              x_gluon_bf16_fastest=min(ms["gluon_bf16"]) / min(r))
            print(f"time causal={causal!s:5} N={N:5}: " + " ".join(
                f"{n} {row[n]['tflops']:4.0f} ({row[n]['x_pin']:.3f}x pin, {row[n]['x_gluon_bf16']:.2f}x bf16, "
                f"spread {row[n]['spread']:.2f})" for n in fns), flush=True)
            out.append(row)
            del q, k, v, x, pin_o, pin_l
    return out


def summary(rows: list) -> dict:
    """Per option: the range of its median ratio to the default and to bf16 over the shapes, of the fastest-round
    ratio to the default, and the largest spread of its or the default's rounds (a win must exceed it)."""
    out = {}
    for n in ["fp8_pin"] + [f"fp8_{o}" for o in OPTIONS]:
        xs = [r[n]["x_pin"] for r in rows]
        out[n] = {"x_pin": [min(xs), max(xs)], "x_pin_fastest": [min(r[n]["x_pin_fastest"] for r in rows),
                                                                 max(r[n]["x_pin_fastest"] for r in rows)],
                  "x_gluon_bf16": [min(r[n]["x_gluon_bf16"] for r in rows), max(r[n]["x_gluon_bf16"] for r in rows)],
                  "max_spread": max(max(r[n]["spread"], r["fp8_pin"]["spread"]) for r in rows)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(_common.RESULTS))
    args = ap.parse_args(argv)

    def body(t0, log):
        from reference.triton.configs import FP8_GLUON_SCHEDULE
        doc = {"meta": _common.run_meta(pin=dict(FP8_GLUON_SCHEDULE), options=OPTIONS, rounds=ROUNDS)}
        doc["checks"], ok = check()
        log(f"checks {'passed' if ok else 'FAILED'}")
        if ok:
            doc["rows"] = timings()
            doc["summary"] = summary(doc["rows"])
            log(f"summary {doc['summary']}")
        path = write_json(args.out, f"{_common.result_tag()}-fp8-schedule-probe.json", doc)
        log(f"wrote {path}")
        return 0 if ok else 1
    return _common.start_run("probe_fp8_schedule.py", False, args.out, body)


if __name__ == "__main__":
    raise SystemExit(main())
