"""The warp-specialised Gluon backward's legal configs at d = 64 (and 128): checks, timings vs cuDNN, re-timing.

The default config ``(BLOCK_M, STAGES, DQ_TMA, DEFER, LD_TMA) = (64, 2, True, True, True)`` measured
0.75x cuDNN at d = 64, N = 8k. The candidates below are the configs that compile for sm_90a within the 227 KB of
shared memory (``compile_backward_ws`` + ``_aot.resource_usage`` on the CPU; notes/hopper.md section 1g has the
table and the predictions). One GPU call, each stage in a child process with a time limit
(``benchmarks/_staged.py``):

1. ``check``: every candidate against float64 autograd on ``bench_gluon_bwd``'s check shapes at the candidate's
   head dimension (ragged N, bottom-right causal Nq < Nk and Nq > Nk, GQA, fp16, one query row);
2. ``bench``: bf16 TFLOP/s of cuDNN, our Triton backward and each candidate that passed, ``bench_gluon_bwd``'s
   convention (batch x seqlen = 16k, hidden 2048, N = 2k..16k, causal and not), plus GQA (Hkv = Hq / 4) at 8k;
3. ``retime``: the default and the best candidate per head dimension (by geometric mean of the ratio to cuDNN) timed
   twice more next to cuDNN, for the noise.

    python3 -m benchmarks.course.sweep_gluon_bwd_d64 --out DIR     # writes DIR/<gpu>-gluon-bwd-d64-sweep.json
"""
from __future__ import annotations

import json
import math
import os

from benchmarks._common import RESULTS
from benchmarks._staged import run_child, run_stages, stage_parser

TOKENS, HIDDEN = 16384, 2048
SEQLENS = [2048, 4096, 8192, 16384]
DEFAULT = (64, 2, True, True, True)
#: (head_dim, config) candidates: the default, STAGES 3, and BLOCK_M 128 where it fits 227 KB of shared memory
CANDIDATES = [(64, DEFAULT), (64, (64, 3, True, True, True)), (64, (128, 2, False, False, True)),
              (64, (128, 3, False, False, True)), (64, (128, 2, True, True, True)), (64, (128, 2, True, False, True)),
              (128, DEFAULT), (128, (64, 3, True, False, True))]
TOL = 2e-2


def name_of(cfg):
    return "ws_" + "_".join(str(int(c)) for c in cfg)


def _cases(d):
    from benchmarks._gluon_cases import BWD_CASES as CASES
    return sorted({(B, Hq, Hkv, Nq, Nk, d, causal, dt) for (B, Hq, Hkv, Nq, Nk, _, causal, dt) in CASES})


def _backward(cfg):
    from reference.triton.configs import GluonBackwardConfig
    from reference.triton.hopper.flash_gluon_bwd_ws import flash_attention_backward_gluon_ws
    config = GluonBackwardConfig.from_tuple(cfg)
    return lambda q, k, v, o, lse, do, causal: flash_attention_backward_gluon_ws(q, k, v, o, lse, do, causal=causal,
                                                                                 config=config)


def _stage_check():
    import torch
    from benchmarks._common import check_row
    from benchmarks._gluon_cases import case_tensors
    from reference.triton import configs, flash_fwd
    from tests.oracle import attention_grads, rel_err
    out = []
    for d in sorted({d for d, _ in CANDIDATES}):
        for (B, Hq, Hkv, Nq, Nk, _, causal, dt) in _cases(d):
            q, k, v, do = case_tensors(B, Hq, Hkv, Nq, Nk, d, dt, with_do=True)
            o, lse = flash_fwd.flash_attention_forward(q, k, v, causal=causal, config=configs.FWD_PINS["hopper_bench"])
            ref = attention_grads(q, k, v, do, causal=causal)
            for dd, cfg in CANDIDATES:
                if dd != d:
                    continue

                def fill(row, cfg=cfg):
                    got = _backward(cfg)(q, k, v, o, lse, do, causal)
                    torch.cuda.synchronize()
                    for name, a, r in zip(("dq", "dk", "dv"), got, ref):
                        row[name] = rel_err(a, r)
                    row["ok"] = all(row[n] < TOL for n in ("dq", "dk", "dv"))
                row = check_row({"shape": [B, Hq, Hkv, Nq, Nk, d], "causal": causal, "dtype": dt,
                                 "config": list(cfg)}, fill)
                print(f"check {row}", flush=True)
                out.append(row)
    return out


def _time_row(d, causal, N, cfgs, group=1, with_triton=True):
    import torch
    from torch.nn.attention import SDPBackend
    from benchmarks._common import rel_err as rel
    from benchmarks._common import sdpa_bwd_timer
    from benchmarks._common import hopper_bench as bench
    from reference.triton import configs, flash_bwd, flash_fwd
    from reference.triton.flash_bwd import backward_flops
    H = HIDDEN // d
    B = TOKENS // N
    q, do = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(B, H // group, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    flops = backward_flops(B, H, N, N, d, causal)
    o, lse = flash_fwd.flash_attention_forward(q, k, v, causal=causal, config=configs.FWD_PINS["hopper_bench"])
    row = {"d": d, "causal": causal, "N": N, "B": B, "H": H, "H_kv": H // group}
    if group == 1:
        cud = sdpa_bwd_timer(SDPBackend.CUDNN_ATTENTION, q, k, v, do, causal)
        ref = cud()
    else:  # cuDNN on K, V repeated per query head (the group's dK, dV sums are not timed)
        kx, vx = (x.repeat_interleave(group, 1) for x in (k, v))
        cud = sdpa_bwd_timer(SDPBackend.CUDNN_ATTENTION, q, kx, vx, do, causal)
        dq_, dk_, dv_ = cud()
        ref = (dq_,) + tuple(x.view(B, H // group, group, N, d).float().sum(2).to(x.dtype) for x in (dk_, dv_))
    ms = bench(cud)
    row["cudnn"] = {"tflops": flops / ms / 1e9, "ms": ms}
    if with_triton and group == 1:
        ms = bench(lambda: flash_bwd.flash_attention_backward(q, k, v, o, lse, do, causal=causal,
                                                              config=configs.HOPPER_BENCH_BWD[(d, causal)]))
        row["triton"] = {"tflops": flops / ms / 1e9, "ms": ms}
    for cfg in cfgs:
        try:
            fn = (lambda f: lambda: f(q, k, v, o, lse, do, causal))(_backward(cfg))
            errs = [rel(a, r) for a, r in zip(fn(), ref)]
            ms = bench(fn)
            row[name_of(cfg)] = {"tflops": flops / ms / 1e9, "ms": ms, "rel_vs_cudnn": errs}
        except Exception as e:  # noqa: BLE001
            row[name_of(cfg)] = {"error": f"{type(e).__name__}: {str(e)[-300:]}"}
    c = row["cudnn"]["tflops"]
    print(f"d={d} causal={causal!s:5} N={N:5} Hkv={H // group} cudnn {c:4.0f} " + " ".join(
        f"{n} {r.get('tflops', float('nan')) / c:.3f}" for n, r in row.items() if n.startswith(("ws_", "triton"))),
        flush=True)
    del q, k, v, do, o, lse, ref
    return row


def _passed():
    """Candidates whose checks all passed (``SWEEP_PASSED``, set by ``main`` from the check stage)."""
    ok = os.environ.get("SWEEP_PASSED")
    if ok is None:
        return CANDIDATES
    names = set(ok.split(","))
    return [(d, c) for d, c in CANDIDATES if name_of(c) + f"@{d}" in names]


def _stage_bench():
    cands = _passed()
    rows = []
    for d in (64, 128):
        cfgs = [c for dd, c in cands if dd == d]
        for causal in (False, True):
            for N in SEQLENS:
                rows.append(_time_row(d, causal, N, cfgs))
            rows.append(_time_row(d, causal, 8192, cfgs, group=4, with_triton=False))
    return rows


def best_of(rows, d):
    """The config with the highest geometric mean of its ratio to cuDNN over the MHA rows at ``d``."""
    score = {}
    for r in rows:
        if r["d"] != d or r["H_kv"] != r["H"]:
            continue
        for n, x in r.items():
            if n.startswith("ws_") and "tflops" in x:
                score.setdefault(n, []).append(math.log(x["tflops"] / r["cudnn"]["tflops"]))
    full = max(len(v) for v in score.values())
    return max((n for n in score if len(score[n]) == full), key=lambda n: sum(score[n]))


def _stage_retime():
    best = json.loads(os.environ["SWEEP_BEST"])
    rows = []
    for rep in range(2):
        for d, cfgs in best.items():
            for causal in (False, True):
                for N in SEQLENS:
                    rows.append({"rep": rep, **_time_row(int(d), causal, N, [tuple(c) for c in cfgs],
                                                         with_triton=False)})
    return rows


def _env(stage, res):
    if stage == "bench" and isinstance(res.get("check"), list):
        bad = {(tuple(r["config"]), r["shape"][5]) for r in res["check"] if not r.get("ok")}
        return {"SWEEP_PASSED": ",".join(name_of(c) + f"@{d}" for d, c in CANDIDATES if (c, d) not in bad)}
    if stage == "retime" and isinstance(res.get("bench"), list):
        best = {}
        for d in (64, 128):
            n = best_of(res["bench"], d)
            cfg = next(c for dd, c in CANDIDATES if dd == d and name_of(c) == n)
            best[d] = [DEFAULT] + ([cfg] if cfg != DEFAULT else [])
        res["best"] = {str(d): [name_of(c) for c in v] for d, v in best.items()}
        return {"SWEEP_BEST": json.dumps({str(d): [list(c) for c in v] for d, v in best.items()})}
    return {}


def main(argv=None):
    args = stage_parser(__doc__, ["check", "bench", "retime"], RESULTS).parse_args(argv)
    if run_child(args.stage, {"check": _stage_check, "bench": _stage_bench, "retime": _stage_retime}):
        return
    import torch
    import triton
    from benchmarks._common import gpu_tag
    os.makedirs(args.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "convention": "bf16 backward, batch*seqlen=16384, hidden=2048; flops 2.5 x 4BHN^2d (x0.5 causal); "
                         "do_bench(warmup=10 ms, rep=40 ms) medians; ratios from this run only",
           "candidates": [[d, list(c)] for d, c in CANDIDATES]}
    path = os.path.join(args.out, f"{gpu_tag()}-gluon-bwd-d64-sweep.json")
    run_stages("benchmarks.course.sweep_gluon_bwd_d64", args.stages.split(","), lambda st: args.timeout, res, path,
               env_of=_env)


if __name__ == "__main__":
    main()
