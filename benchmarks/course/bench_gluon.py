"""The Gluon FA3-style forward (``reference.triton.hopper.flash_gluon``) on Hopper: checks, then timings vs cuDNN.

One GPU call (notes/hopper.md section 1c). Each stage runs in its own subprocess with a time limit, so a kernel
that deadlocks (a wrong mbarrier phase hangs the GPU, it does not fail) costs that stage, not the call:

1. ``check:<schedule>`` (``SCHEDULES``): ``flash_attention_forward_gluon`` against a float64 torch reference on
   fresh random inputs: ragged N, bottom-right causal with Nq < Nk and Nq > Nk (rows that see no key: o = 0,
   lse = -inf), GQA, d = 64, float16, one query row, more query tiles than SMs. o relative error and lse
   absolute error per case.
2. ``bench``: bf16 forward TFLOP/s of cuDNN (SDPA), our Triton forward (``flash_fwd``, the pinned config of
   ``bench_hopper.py``) and the Gluon schedules (``SCHEDULES``), same run, FlashAttention convention (batch x
   seqlen = 16k, hidden 2048), d in {128, 64}, causal and not; then ``VARIANTS`` at d = 128. Every timed Gluon
   output is also compared with cuDNN's (relative error), so a race that only shows on large shapes is seen.
   A schedule whose check stage failed or hung is left out of the timings.
3. ``ncu``: Nsight Compute over one forward of cuDNN and of the Gluon ping-pong kernel, one CTA per tile and
   persistent (``NCU_CASES``): duration, tensor-pipe activity, throughputs, registers (CSV next to the JSON).

    python3 -m benchmarks.course.bench_gluon --out DIR          # writes DIR/<gpu>-gluon.json and .png
    python3 -m benchmarks.course.bench_gluon --plot FILE.json   # only the plot, from a results file
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks._common import RESULTS, ROOT
from benchmarks._gluon_cases import CASES, case_tensors  # noqa: F401  (CASES: this script's check shapes)

SEQLENS = [1024, 2048, 4096, 8192, 16384]
TOKENS, HIDDEN = 16384, 2048
#: timed again after the main table (the earlier runs' block-size variants are in notes/hopper.md section 1c): a
#: second timing of the ping-pong kernels in the same run, for the noise, and the production kernel's key-loop
#: options spelled out ("+off": both off; "+peeled" alone keeps the P V wait above the exps, a control)
VARIANTS = {"pingpong": [(128, 128, 2, 4)], "pingpong+persistent": [(128, 128, 2, 4)],
            "pingpong+persistent+off": [(128, 128, 2, 4)], "pingpong+persistent+fence": [(128, 128, 2, 4)],
            "pingpong+persistent+peeled+fence": [(128, 128, 2, 4)], "pingpong+persistent+peeled": [(128, 128, 2, 4)]}
O_TOL, LSE_TOL = 1.5e-2, 1e-2
#: timed in the main table (and checked); "+persistent": one CTA per SM looping over query tiles (the production
#: kernel, its key loop pinned per head dimension, ``configs.GLUON_FWD_KEY_LOOP``); "+off" / "+fence": that key
#: loop with both options off / with ``fence`` at every d (``flash_gluon.attend_overlapped``, ``key_loop=``)
SCHEDULES = ("pingpong", "pingpong+persistent", "specialized", "specialized+persistent", "overlap",
             "pingpong+persistent+off", "pingpong+persistent+fence")
#: profiled by the ``ncu`` stage: (N, causal) at d = 128, and the implementations
NCU_CASES = [(2048, False), (2048, True), (8192, False)]
NCU_IMPLS = ("cudnn", "pingpong", "pingpong+persistent", "pingpong+persistent+off")


def _gluon(name):
    """The forward for ``name`` = ``schedule[+persistent]``: ``f(q, k, v, causal, config=None) -> (o, lse)``.
    ``pingpong+persistent`` is the production kernel (``flash_attention_forward_gluon``, its pinned key loop),
    ``pingpong+persistent+<option>...`` the same with ``key_loop`` options spelled out (``fence``, ``peeled``; each
    one named is on, the other off: ``+off`` turns both off); the others are the ablations of
    ``experiments/gluon_schedules.py``."""
    schedule, _, mode = name.partition("+")
    if name.startswith("pingpong+persistent"):
        from reference.triton.hopper.flash_gluon import flash_attention_forward_gluon
        opts = name.split("+")[2:]
        loop = {"peeled": "peeled" in opts, "fence": "fence" in opts} if opts else None  # None: the default
        return lambda q, k, v, causal, config=None: flash_attention_forward_gluon(q, k, v, causal=causal,
                                                                                 config=config, key_loop=loop)
    from experiments.gluon_schedules import forward
    return lambda q, k, v, causal, config=None: forward(q, k, v, causal=causal, schedule=schedule, config=config,
                                                        persistent=mode == "persistent")


def _stage_check(schedule):
    import torch
    from benchmarks._common import check_row, lse_abs, ref64
    from benchmarks._common import rel_err as rel
    gluon = _gluon(schedule)
    out = []
    for (B, Hq, Hkv, Nq, Nk, d, causal, dt) in CASES:
        q, k, v = case_tensors(B, Hq, Hkv, Nq, Nk, d, dt)

        def fill(row):
            o, lse = gluon(q, k, v, causal)
            torch.cuda.synchronize()
            ro, rl = ref64(q, k, v, causal)
            row["o_rel"] = rel(o, ro)
            row["lse_abs"] = lse_abs(lse, rl)
            empty = ~torch.isfinite(rl)
            row["empty_rows"] = int(empty.sum())
            row["empty_ok"] = bool((o[empty] == 0).all()) if row["empty_rows"] else True
            row["ok"] = bool(row["o_rel"] < O_TOL and row["lse_abs"] < LSE_TOL and row["empty_ok"])
        row = check_row({"shape": [B, Hq, Hkv, Nq, Nk, d], "causal": causal, "dtype": dt}, fill)
        print(f"check {schedule} {row}", flush=True)
        out.append(row)
    return out


def _stage_bench():
    import torch
    from torch.nn.attention import SDPBackend
    from benchmarks._common import matmul_tflops, sdpa
    from benchmarks._common import rel_err as rel
    from benchmarks._common import hopper_bench as bench
    from reference.triton import flash_fwd
    from reference.triton.configs import FWD_PINS
    from reference.triton.flash_fwd import forward_flops
    from reference.triton.configs import GLUON_FORWARD, GluonForwardConfig

    pin = FWD_PINS["hopper_bench"]
    cudnn = sdpa(SDPBackend.CUDNN_ATTENTION)
    impls = {"cudnn": lambda q, k, v, c: cudnn(q, k, v, c),
             "triton": lambda q, k, v, c: flash_fwd.flash_attention_forward(q, k, v, causal=c, config=pin)[0]}
    skip = set(os.environ.get("BENCH_SKIP", "").split(","))  # schedules whose check stage failed or hung
    for sched in (s for s in SCHEDULES if s not in skip):
        impls["gluon_" + sched.replace("+", "_")] = (lambda g: lambda q, k, v, c: g(q, k, v, c)[0])(_gluon(sched))
    res = {"matmul_TFLOPs": matmul_tflops(), "default_config": GLUON_FORWARD.as_tuple(), "main": [], "variants": []}
    print(f"matmul {res['matmul_TFLOPs']:.0f} TFLOP/s", flush=True)

    def timed(fn, q, k, v, causal, ref_o, flops):
        try:
            with torch.no_grad():
                o = fn(q, k, v, causal)
                err = rel(o, ref_o) if ref_o is not None else 0.0
                ms = bench(lambda: fn(q, k, v, causal))
            return {"tflops": flops / ms / 1e9, "ms": ms, "rel_vs_cudnn": err}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{type(e).__name__}: {str(e)[-300:]}"}

    for d in (128, 64):
        H = HIDDEN // d
        for causal in (False, True):
            for N in SEQLENS:
                B = TOKENS // N
                q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                flops = forward_flops(B, H, N, N, d, causal)
                with torch.no_grad():
                    ref_o = cudnn(q, k, v, causal)
                row = {"d": d, "causal": causal, "N": N, "B": B, "H": H}
                for name, fn in impls.items():
                    row[name] = timed(fn, q, k, v, causal, ref_o, flops)
                g = lambda n: row[n].get("tflops", float("nan"))  # noqa: E731
                print(f"d={d} causal={causal!s:5} N={N:5} cudnn {g('cudnn'):4.0f} " + " ".join(
                    f"{n} {g(n):4.0f} ({g(n) / g('cudnn'):.2f}x, err {row[n].get('rel_vs_cudnn', -1):.0e})"
                    for n in impls if n != "cudnn"), flush=True)
                res["main"].append(row)
                del q, k, v, ref_o
    d, H = 128, 16
    for N in (2048, 8192):
        for causal in (False, True):
            B = TOKENS // N
            q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = forward_flops(B, H, N, N, d, causal)
            with torch.no_grad():
                ref_o = cudnn(q, k, v, causal)
            base = timed(impls["cudnn"], q, k, v, causal, None, flops)
            for sched, cfgs in VARIANTS.items():
                for cfg in cfgs:
                    fn = (lambda g, c: lambda q, k, v, cz: g(q, k, v, cz, c)[0])(_gluon(sched),
                                                                                GluonForwardConfig.from_tuple(cfg))
                    r = timed(fn, q, k, v, causal, ref_o, flops)
                    r.update({"schedule": sched, "config": list(cfg), "N": N, "causal": causal,
                              "cudnn_tflops": base.get("tflops")})
                    print(f"variant {sched} {cfg} N={N} causal={causal}: {r.get('tflops', float('nan')):.0f} "
                          f"TFLOP/s vs cudnn {base.get('tflops', float('nan')):.0f} err "
                          f"{r.get('rel_vs_cudnn', -1):.1e} {r.get('error', '')}", flush=True)
                    res["variants"].append(r)
            del q, k, v, ref_o
    return res


def _profile():
    """Under ncu (``--profile-from-start off``): one forward of each of ``NCU_IMPLS`` per ``NCU_CASES`` shape
    (warmed up first, so compilation is outside the profiled region)."""
    import torch
    from torch.nn.attention import SDPBackend
    from benchmarks._common import profile_once, sdpa
    cudnn = sdpa(SDPBackend.CUDNN_ATTENTION)
    d, H = 128, HIDDEN // 128
    for N, causal in NCU_CASES:
        q, k, v = (torch.randn(TOKENS // N, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        runs = [(lambda: cudnn(q, k, v, causal)) if name == "cudnn" else
                (lambda g=_gluon(name): g(q, k, v, causal)) for name in NCU_IMPLS]
        profile_once(runs)


def _stage_ncu():
    """ncu of ``_profile`` (``--clock-control none``; the sections and metrics of the backward's profile,
    ``tune_bwd_hopper``): per kernel duration, tensor-pipe activity, SM/L2/DRAM throughput, registers."""
    import subprocess
    from benchmarks._ncu import NCU_EXTRA, NCU_SECTIONS, summarize_ncu
    q = subprocess.run(["ncu", "--query-metrics", "--chip", "gh100"], capture_output=True, text=True)
    names = {line.split()[0] for line in q.stdout.splitlines() if line.strip()}
    metrics = [m + suf for m, suf in NCU_EXTRA.items() if m in names]
    csv_path = os.path.join(os.environ.get("BENCH_OUT", "/tmp"), "ncu_gluon_fwd.csv")
    cmd = ["ncu", "--csv", "--page", "details", "--clock-control", "none", "--profile-from-start", "off",
           *sum((["--section", s] for s in NCU_SECTIONS), []), "--metrics", ",".join(metrics),
           sys.executable, "-m", "benchmarks.course.bench_gluon", "--stage", "profile"]
    with open(csv_path, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    print("ncu rc", r.returncode, r.stderr[-1500:], flush=True)
    kernels = summarize_ncu(csv_path)
    labels = [f"{name} N={N} causal={causal}" for N, causal in NCU_CASES for name in NCU_IMPLS]
    if len(kernels) == len(labels):  # one kernel per forward (cuDNN's included)
        for kern, label in zip(kernels, labels):
            kern["case"] = label
    for kern in kernels:
        print("ncu", json.dumps(kern), flush=True)
    return {"cases": [list(c) for c in NCU_CASES], "impls": list(NCU_IMPLS), "kernels": kernels}


def plot(res, path):
    """Ours / cuDNN against N at d = 128 (non-causal and causal panels), one line per timed kernel, the 0.85 bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in res["bench"]["main"] if r["d"] == 128]
    names = [n for n in rows[0] if n not in ("d", "causal", "N", "B", "H", "cudnn") and "tflops" in rows[0][n]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        sel = [r for r in rows if r["causal"] == causal]
        for n in names:
            ax.plot([r["N"] for r in sel], [r[n]["tflops"] / r["cudnn"]["tflops"] for r in sel], marker="o", label=n)
        ax.axhline(0.85, color="k", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N (batch x N = 16k)")
        ax.set_title(f"{res['gpu']}, bf16 d=128, {'causal' if causal else 'non-causal'}")
    axes[0].set_ylabel("forward TFLOP/s / cuDNN's (same run)")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(names), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--stage", default="all", help="all | check:<schedule> | bench | ncu | profile")
    ap.add_argument("--stages", default=",".join(f"check:{s}" for s in SCHEDULES) + ",bench,ncu")
    ap.add_argument("--timeout", type=int, default=150, help="seconds per check stage (bench gets 3x)")
    ap.add_argument("--suffix", default="")
    ap.add_argument("--plot", default=None, help="only plot this results JSON (next to it, .png)")
    args = ap.parse_args(argv)
    if args.plot:
        with open(args.plot) as f:
            return plot(json.load(f), args.plot[:-len(".json")] + ".png")
    if args.stage == "profile":  # under ncu
        return _profile()
    if args.stage != "all":  # a child: run one stage, print its JSON last
        fn = {"bench": _stage_bench, "ncu": _stage_ncu}.get(args.stage) or (
            lambda: _stage_check(args.stage.split(":")[1]))
        result = fn()
        print("RESULT " + json.dumps(result), flush=True)
        return
    import torch
    from benchmarks._staged import run_stages
    from benchmarks._common import gpu_tag
    os.makedirs(args.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "capability": list(torch.cuda.get_device_capability()),
           "convention": "bf16 forward, batch*seqlen=16384, hidden=2048, heads=2048/d; flops 4BHN^2d (x0.5 "
                         "causal); do_bench(warmup=10 ms, rep=40 ms) medians; ratios from this run only"}
    import triton
    res["triton"] = triton.__version__
    path = os.path.join(args.out, f"{gpu_tag()}-gluon{args.suffix}.json")
    def env_of(stage, res):
        failed = [st.split(":", 1)[1] for st, r in res.items() if st.startswith("check:")
                  and not (isinstance(r, list) and all(row.get("ok") for row in r))]
        return {"BENCH_OUT": args.out, "BENCH_SKIP": ",".join(failed)}

    run_stages("benchmarks.course.bench_gluon", args.stages.split(","), lambda st: args.timeout * (1 if st.startswith("check") else 3),
               res, path, env_of)
    if "main" in res.get("bench", {}):
        plot(res, path[:-len(".json")] + ".png")


if __name__ == "__main__":
    main()
