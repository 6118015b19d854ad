"""The Gluon backwards on Hopper: checks, then timings vs cuDNN and Triton.

``reference.triton.hopper.flash_gluon_bwd_ws`` (warp-specialised, notes/hopper.md section 1e; the serial kernel
of section 1d it superseded is gone: notes/experiments_removed.md), one GPU call. Each stage runs in its own
subprocess with a time limit (a wrong mbarrier phase hangs the GPU instead of failing):

1. ``check``: ``flash_attention_backward_gluon`` against float64 autograd (``tests/oracle.py``) on fresh random
   inputs: ragged N, bottom-right causal with Nq < Nk and Nq > Nk (rows that see no key), GQA, d = 64, float16,
   one query row; ``o, lse`` from our Triton forward. dq/dk/dv relative errors of the warp-specialised kernel's
   variants, next to our Triton backward's.
2. ``bench``: bf16 backward TFLOP/s (FA convention, 2.5x the forward's FLOPs) of cuDNN (SDPA autograd), our
   Triton backward (``flash_bwd``, ``bench_hopper``'s pinned configs) and the Gluon kernel's variants, same run,
   batch x seqlen = 16k, hidden 2048, d = 128, N in {2k, 8k} ({2k, 4k, 8k, 16k} with ``--set ws``), causal and
   not (all variants), and d = 64 at 8k (2k..16k with ``--set ws``); with ``--set ws`` also GQA (Hkv = Hq / 4,
   8k, d = 128 and 64, the default config), where cuDNN runs GQA natively (``enable_gqa``) and, as
   ``cudnn_repeat``, on K, V repeated per query head; each timed Gluon result is also compared with cuDNN's
   gradients.

    python3 -m benchmarks.course.bench_gluon_bwd --out DIR          # writes DIR/<gpu>-gluon-bwd.json
    python3 -m benchmarks.course.bench_gluon_bwd --out DIR --set ws --suffix=-wsbwd   # the warp-specialised run
"""
from __future__ import annotations

import os

from benchmarks._common import RESULTS
from benchmarks._staged import run_child, run_stages, stage_parser
from benchmarks._gluon_cases import BWD_CASES as CASES, case_tensors, cudnn_attention, cudnn_bwd_timer  # noqa: F401

TOKENS, HIDDEN = 16384, 2048
SEQLENS = [2048, 8192]
# (the serial Gluon kernel's configs were timed here until it was superseded: notes/experiments_removed.md)
#: the warp-specialised kernel: ("ws", "split", BLOCK_M, STAGES, DQ_TMA, DEFER, LD_TMA[, "noadd": timing ablation,
#: dQ never added]); WS is its default (notes/hopper.md section 1e has the attempts). "split" names the dQ
#: organisation in the results' column names; the "own" mode that lost is gone (notes/experiments_removed.md).
WS = ("ws", "split", 64, 2, True, True, True)
WS_SPLIT = ("ws", "split", 64, 2, False, False, False)
WS_SPLIT_TMA = ("ws", "split", 64, 2, True, False, False)
WS_DEFER_TMA = ("ws", "split", 64, 2, True, True, False)
WS_SPLIT_TMA_LD = ("ws", "split", 64, 2, True, False, True)
WS_NOADD = WS + ("noadd",)
#: d = 64's default (``configs.GLUON_BACKWARD[64]``: 128 query rows per step; notes/hopper.md section 1g)
WS_D64 = ("ws", "split", 128, 2, True, True, True)
SETS = {"all": {"check": [WS], "time": [WS], "d64": [WS]},
        # the warp-specialised kernel's final run: its default and the first TMA-reduce version checked; timed
        # next to that version and the no-dQ-add ablation, N = 2k..16k
        "ws": {"check": [WS, WS_SPLIT_TMA], "time": [WS_SPLIT_TMA, WS, WS_NOADD], "d64": [WS, WS_D64],
               "seqlens": [2048, 4096, 8192, 16384], "d64_seqlens": [2048, 4096, 8192, 16384],
               # GQA rows (Hkv = Hq / 4 at 8k; the default config only): notes/hopper.md "GQA backward schedule"
               "gqa": [(128, True, 8192), (128, False, 8192), (64, True, 8192), (64, False, 8192)]},
        # every attempt (H200 exploration run)
        "ws_attempts": {"check": [WS_SPLIT, WS_SPLIT_TMA, WS_DEFER_TMA, WS_SPLIT_TMA_LD, WS],
                        "time": [WS_SPLIT, WS_SPLIT_TMA, WS_DEFER_TMA, WS_SPLIT_TMA_LD, WS, WS_NOADD],
                        "d64": [WS_SPLIT_TMA, WS]}}


def _set():
    return SETS[os.environ.get("GLUON_BWD_SET", "all")]


def variant_name(cfg):
    return "gluon_" + "_".join(str(c) if isinstance(c, str) else str(int(c)) for c in cfg)


def gluon_backward(cfg):
    """``f(q, k, v, o, lse, do, causal) -> (dq, dk, dv)`` of one ``("ws", ...)`` variant."""
    from reference.triton.configs import GluonBackwardConfig
    from reference.triton.hopper.flash_gluon_bwd_ws import flash_attention_backward_gluon_ws
    config = GluonBackwardConfig.from_tuple(cfg[2:7])
    return lambda *a, causal: flash_attention_backward_gluon_ws(*a, causal=causal, config=config,
                                                                _ablate_dq_add=cfg[7:] == ("noadd",))
TOL = 2e-2


def _stage_check():
    import torch
    from benchmarks._common import check_row
    from reference.triton import configs, flash_bwd, flash_fwd
    from tests.oracle import attention_grads, rel_err
    out = []
    for (B, Hq, Hkv, Nq, Nk, d, causal, dt) in CASES:
        q, k, v, do = case_tensors(B, Hq, Hkv, Nq, Nk, d, dt, with_do=True)
        try:
            # our Triton kernels without autotuning
            o, lse = flash_fwd.flash_attention_forward(q, k, v, causal=causal,
                                                       config=configs.FWD_PINS["hopper_bench"])
            ref = attention_grads(q, k, v, do, causal=causal)
            tri = flash_bwd.flash_attention_backward(q, k, v, o, lse, do, causal=causal,
                                                     config=configs.HOPPER_BENCH_BWD[(d, causal)])
        except Exception as e:  # noqa: BLE001
            out.append({"shape": [B, Hq, Hkv, Nq, Nk, d], "causal": causal, "error": f"reference: {e}", "ok": False})
            continue
        for cfg in _set()["check"]:
            def fill(row, cfg=cfg):
                got = gluon_backward(cfg)(q, k, v, o, lse, do, causal=causal)
                torch.cuda.synchronize()
                for name, a, t, r in zip(("dq", "dk", "dv"), got, tri, ref):
                    row[name] = rel_err(a, r)
                    row[name + "_triton"] = rel_err(t, r)
                row["ok"] = all(row[n] < TOL for n in ("dq", "dk", "dv"))
            row = check_row({"shape": [B, Hq, Hkv, Nq, Nk, d], "causal": causal, "dtype": dt, "config": list(cfg)},
                            fill)
            print(f"check {row}", flush=True)
            out.append(row)
    return out


def _stage_bench():
    import torch
    from benchmarks._common import rel_err as rel
    from benchmarks._common import hopper_bench as bench
    from reference.triton import configs, flash_bwd, flash_fwd
    from reference.triton.flash_bwd import backward_flops

    res = {"variants": _set()["time"], "main": []}
    seqlens = _set().get("seqlens", SEQLENS)
    shapes = [(128, c, n, 1) for c in (False, True) for n in seqlens]
    shapes += [(64, c, n, 1) for c in (False, True) for n in _set().get("d64_seqlens", [8192])]
    shapes += [(d, c, n, 4) for d, c, n in _set().get("gqa", [])]
    for d, causal, N, group in shapes:
        H = HIDDEN // d
        fwd_pin, bwd_pin = configs.FWD_PINS["hopper_bench"], configs.HOPPER_BENCH_BWD[(d, causal)]
        B = TOKENS // N
        q, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(B, H // group, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        flops = backward_flops(B, H, N, N, d, causal)
        o, lse = flash_fwd.flash_attention_forward(q, k, v, causal=causal, config=fwd_pin)
        row = {"d": d, "causal": causal, "N": N, "B": B, "H": H, "H_kv": H // group}
        # cuDNN (GQA natively, enable_gqa; and on K, V repeated per query head, group sums timed: cudnn_repeat)
        cud = cudnn_bwd_timer(q, k, v, do, causal)
        ref = cud()
        ms = bench(cud)
        row["cudnn"] = {"tflops": flops / ms / 1e9, "ms": ms}
        if group > 1:
            ms = bench(cudnn_bwd_timer(q, k, v, do, causal, "repeat"))
            row["cudnn_repeat"] = {"tflops": flops / ms / 1e9, "ms": ms}
        tri = lambda: flash_bwd.flash_attention_backward(  # noqa: E731
            q, k, v, o, lse, do, causal=causal, config=bwd_pin)
        ms = bench(tri)
        row["triton"] = {"tflops": flops / ms / 1e9, "ms": ms}
        cfgs = _set()["time" if d == 128 else "d64"]
        if group > 1:  # the default config only
            cfgs = [c for c in cfgs if c == (WS_D64 if d == 64 else WS)]
        for cfg in cfgs:
            if str(cfg) in os.environ.get("GLUON_BWD_SKIP", "").split(";"):  # its checks hung: skip it
                continue
            name = variant_name(cfg)
            try:
                fn = (lambda f: lambda: f(q, k, v, o, lse, do, causal=causal))(gluon_backward(cfg))
                got = fn()
                errs = [rel(a, r) for a, r in zip(got, ref)]
                ms = bench(fn)
                row[name] = {"tflops": flops / ms / 1e9, "ms": ms, "rel_vs_cudnn": errs}
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": f"{type(e).__name__}: {str(e)[-300:]}"}
        c = row["cudnn"]["tflops"]
        print(f"d={d} causal={causal!s:5} N={N:5} H={H}/{H // group} cudnn {c:4.0f} triton {row['triton']['tflops']:4.0f} "
              f"({row['triton']['tflops'] / c:.2f}) " + " ".join(
                  f"{n} {r.get('tflops', float('nan')):4.0f} ({r.get('tflops', float('nan')) / c:.2f}) "
                  f"err {max(r.get('rel_vs_cudnn', [-1])):.1e}"
                  for n, r in row.items() if n.startswith("gluon_")), flush=True)
        res["main"].append(row)
        del q, k, v, do, o, lse, ref
    return res


def _skip_after_hang(stage, res):
    """If the check stage ran out of time, the bench skips the variant checked after the last one that printed
    (it may have hung), and the serial kernel's PIPE variants, which hung in an earlier version."""
    chk = res.get("check", {})
    if not (isinstance(chk, dict) and "timed out" in str(chk.get("error", ""))):
        return {}
    rows = [x for x in str(chk.get("stdout_tail", "")).splitlines() if x.startswith("check")]
    order = _set()["check"]
    last = next((i for i, c in enumerate(order) if rows and str(list(c)) in rows[-1]), -1)
    skip = {order[(last + 1) % len(order)]} | {c for c in _set()["time"] if c[0] != "ws" and c[-1]}
    return {"GLUON_BWD_SKIP": ";".join(str(c) for c in skip)}


def main(argv=None):
    ap = stage_parser(__doc__, ["check", "bench"], RESULTS, 150, "seconds per stage (bench gets 2x)")
    ap.add_argument("--set", default=None, choices=sorted(SETS), help="variants to check and time (default all)")
    ap.add_argument("--suffix", default="", help="appended to the JSON file name")
    args = ap.parse_args(argv)
    if args.set:
        os.environ["GLUON_BWD_SET"] = args.set  # the stage processes inherit it
    if run_child(args.stage, {"check": _stage_check, "bench": _stage_bench}):
        return
    import torch
    import triton
    from benchmarks._common import gpu_tag
    os.makedirs(args.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "convention": "bf16 backward, batch*seqlen=16384, hidden=2048, d=128; flops 2.5 x 4BHN^2d (x0.5 causal); "
                         "do_bench(warmup=10 ms, rep=40 ms) medians; ratios from this run only"}
    res["set"] = args.set or "all"
    path = os.path.join(args.out, f"{gpu_tag()}-gluon-bwd{args.suffix}.json")
    run_stages("benchmarks.course.bench_gluon_bwd", args.stages.split(","), lambda st: args.timeout * (2 if st == "bench" else 1), res, path,
               env_of=_skip_after_hang)


if __name__ == "__main__":
    main()
