"""The warp-specialised Gluon backward's program order: checks, then timings vs cuDNN.

``flash_attention_backward_gluon_ws(..., order_heads=)`` launches one program per (key block, batch x kv head) and
``_program_order`` maps program ids so that ``order_heads`` heads interleave their key blocks longest-first
(``1`` = the head-major order before this sweep). With GQA the kernel's programs are ``GROUP`` times fewer and
longer, and ``reference.simulators.scheduling`` predicts the head-major order leaves SMs idle at the end of a
causal launch (busy fraction 0.81 at GQA 16/4, 8k; notes/hopper.md, "GQA backward schedule").
One GPU call, each stage in a child process with a time limit (``benchmarks/_staged.py``):

1. ``check``: each order on GQA shapes (causal, ragged N) against float64 autograd (``tests/oracle.py``);
2. ``bench``: bf16 backward TFLOP/s (FA convention, 2.5x the forward's FLOPs) of cuDNN (GQA natively,
   ``enable_gqa``; also on K, V repeated per query head, its group sums timed, as ``cudnn_repeat``) and each
   order, same process, MHA and GQA, d = 64 and 128, causal (and a few non-causal rows); each result also
   compared with cuDNN's gradients; each variant (and cuDNN again) timed ``REPS`` times, interleaved. With
   ``GLUON_BWD_BASELINE=<module>`` (a copy of an earlier kernel file, e.g. ``git show <commit>:...`` saved as
   ``reference/triton/hopper/_bwd_ws_main.py``) that kernel is timed beside them as ``baseline``.

    python3 -m benchmarks.course.sweep_gluon_bwd_order --out DIR    # writes DIR/<gpu>-gluon-bwd-order-sweep.json
"""
from __future__ import annotations

import importlib
import os

from benchmarks._common import RESULTS
from benchmarks._staged import run_child, run_stages, stage_parser

#: (d, causal, B, Hq, Hkv, N)
SHAPES = [(128, True, 2, 16, 4, 8192), (128, True, 2, 32, 8, 8192), (128, True, 1, 32, 8, 16384),
          (128, True, 1, 32, 8, 32768), (128, True, 2, 16, 16, 8192), (64, True, 2, 32, 8, 8192),
          (64, False, 8, 32, 32, 2048), (64, False, 4, 32, 32, 4096)]
#: ``order_heads`` values timed (causal rows; non-causal rows time the default only). The first run (git history of
#: the results file, commit 93aa9d4) also timed 0 (all heads): 0.52-0.91x cuDNN, the L2 lesson of the forward
ORDERS = [1, 2, 4]
#: every variant of a row is timed REPS times, interleaved (A B C A B C ...); the row keeps the median
REPS = 3
#: (B, Hq, Hkv, Nq, Nk, d, causal) for the float64 check
CHECKS = [(2, 8, 2, 700, 900, 128, True), (1, 16, 4, 1024, 1024, 128, True), (2, 8, 2, 650, 650, 64, True),
          (1, 8, 2, 1000, 600, 128, True)]
TOL = 2e-2


def _baseline():
    name = os.environ.get("GLUON_BWD_BASELINE")
    return importlib.import_module(name).flash_attention_backward_gluon_ws if name else None


def _stage_check():
    import torch
    from benchmarks._common import check_row
    from benchmarks._gluon_cases import case_tensors
    from reference.triton.hopper.flash_gluon_bwd_ws import flash_attention_backward_gluon_ws as f
    from tests.oracle import attention_grads, attention_ref, rel_err
    out = []
    for (B, Hq, Hkv, Nq, Nk, d, causal) in CHECKS:
        q, k, v, do = case_tensors(B, Hq, Hkv, Nq, Nk, d, "bf16", with_do=True)
        o, lse, _ = attention_ref(q, k, v, causal=causal)
        ref = attention_grads(q, k, v, do, causal=causal)
        for order in ORDERS:
            def fill(row, order=order):
                got = f(q, k, v, o.to(q.device, q.dtype), lse.to(q.device, torch.float32), do, causal=causal,
                        order_heads=order)
                torch.cuda.synchronize()
                for name, a, r in zip(("dq", "dk", "dv"), got, ref):
                    row[name] = rel_err(a, r)
                row["ok"] = all(row[n] < TOL for n in ("dq", "dk", "dv"))
            row = check_row({"shape": [B, Hq, Hkv, Nq, Nk, d], "causal": causal, "order_heads": order}, fill)
            print(f"check {row}", flush=True)
            out.append(row)
    return out


def _stage_bench():
    import torch
    from benchmarks._common import rel_err as rel
    from benchmarks._gluon_cases import cudnn_bwd_timer
    from benchmarks._common import hopper_bench as bench
    from reference.triton import configs, flash_fwd
    from reference.triton.flash_bwd import backward_flops
    from reference.triton.hopper.flash_gluon_bwd_ws import flash_attention_backward_gluon_ws as f
    base = _baseline()
    rows = []
    for (d, causal, B, Hq, Hkv, N) in SHAPES:
        group = Hq // Hkv
        q, do = (torch.randn(B, Hq, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(B, Hkv, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        flops = backward_flops(B, Hq, N, N, d, causal)
        o, lse = flash_fwd.flash_attention_forward(q, k, v, causal=causal, config=configs.FWD_PINS["hopper_bench"])
        row = {"d": d, "causal": causal, "N": N, "B": B, "H": Hq, "H_kv": Hkv}
        # cuDNN with native GQA (the ratios' base; its gradients the reference), and on K, V repeated per head
        for name, gqa in [("cudnn", "native")] + ([("cudnn_repeat", "repeat")] if group > 1 else []):
            try:
                cud = cudnn_bwd_timer(q, k, v, do, causal, gqa)
                got = cud()
                ms = bench(cud)
                row[name] = {"tflops": flops / ms / 1e9, "ms": ms}
                if name == "cudnn":
                    ref, cud_base = got, cud
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": f"{type(e).__name__}: {str(e)[-300:]}"}
        if "tflops" not in row["cudnn"]:  # no native GQA: the repeated K, V are the base
            cud = cudnn_bwd_timer(q, k, v, do, causal, "repeat")
            ref, cud_base = cud(), cud
            row["cudnn"] = dict(row["cudnn_repeat"], base="repeat")
        fns = {f"order_{o_}": (lambda o_: lambda: f(q, k, v, o, lse, do, causal=causal, order_heads=o_))(o_)
               for o_ in (ORDERS if causal else [None])}
        if base is not None:
            fns = {"baseline": lambda: base(q, k, v, o, lse, do, causal=causal), **fns}
        fns = {"cudnn_again": cud_base, **fns}  # cuDNN re-timed between the variants: the run's own noise
        times = {}
        for rep in range(REPS):
            for name, fn in fns.items():
                try:
                    if rep == 0 and name != "cudnn_again":
                        row[name] = {"rel_vs_cudnn": [rel(a, r) for a, r in zip(fn(), ref)]}
                    times.setdefault(name, []).append(bench(fn))
                except Exception as e:  # noqa: BLE001
                    row[name] = {"error": f"{type(e).__name__}: {str(e)[-300:]}"}
        for name, ms_all in times.items():
            ms = sorted(ms_all)[len(ms_all) // 2]
            row.setdefault(name, {}).update(tflops=flops / ms / 1e9, ms=ms, ms_all=ms_all)
        c = row["cudnn"]["tflops"]
        print(f"d={d} causal={causal!s:5} N={N:5} B={B} H={Hq}/{Hkv} cudnn {c:4.0f} " + " ".join(
            f"{n} {r.get('tflops', float('nan')) / c:.3f} (err {max(r.get('rel_vs_cudnn', [-1])):.0e})"
            for n, r in row.items() if isinstance(r, dict) and n != "cudnn" and "tflops" in r), flush=True)
        rows.append(row)
        del q, k, v, do, o, lse, ref, cud, cud_base, fns
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    args = stage_parser(__doc__, ["check", "bench"], RESULTS).parse_args(argv)
    if run_child(args.stage, {"check": _stage_check, "bench": _stage_bench}):
        return
    import torch
    import triton
    from benchmarks._common import gpu_tag
    os.makedirs(args.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "baseline": os.environ.get("GLUON_BWD_BASELINE"),
           "convention": "bf16 backward, flops 2.5 x 4BHN^2d (x0.5 causal); cuDNN with enable_gqa (cudnn_repeat: "
                         "on K, V repeated per query head, group sums timed); do_bench(warmup=10 ms, rep=40 ms) "
                         "medians; ratios from this run only"}
    path = os.path.join(args.out, f"{gpu_tag()}-gluon-bwd-order-sweep.json")
    run_stages("benchmarks.course.sweep_gluon_bwd_order", args.stages.split(","), lambda st: args.timeout, res, path)


if __name__ == "__main__":
    main()
