"""A training step's attention on Hopper: forward + backward through autograd, ours vs cuDNN, in one run.

``reference.triton.flash_attention_gluon`` (the persistent Gluon forward + the warp-specialised Gluon backward)
against SDPA's cuDNN backend and our Triton ``flash_attention`` (FA2 forward + two-kernel backward), bf16,
FlashAttention convention (batch x seqlen = 16k, hidden 2048, d = 128; FLOPs 3.5 x the forward's: forward +
2.5 x for the backward), and GQA rows (Hq = 32, Hkv = 8, causal 8k and 32k, non-causal 8k) where cuDNN
runs GQA natively (``enable_gqa``; ``cudnn_repeat``: on K, V repeated per query head, as a model without
``enable_gqa`` would call it). Per shape, the three gradients of each implementation are first compared with
cuDNN's (relative error), then ``o = f(q, k, v); o.backward(do)`` is timed with ``do_bench`` (median).
``gluon_<option>`` (``KEY_LOOPS``): the Gluon op with the forward's key loop spelled out instead of its default.
Timing: ``ms`` / ``tflops`` are one ``do_bench`` median per implementation, in a fixed order (the method of the
earlier runs, which the quoted ratios use); ``rounds_ms`` adds ``ROUNDS - 1`` more rounds in rotated order
(``_common.rotated_rounds``) and ``tflops_rounds_median`` is the median over all ``ROUNDS`` (added after one run
showed two columns running identical kernels 25% apart: notes/hopper.md, "The training step and the FP8
quantisation, timed together").
The bench runs in a child process with a time limit (``benchmarks/_staged.py``).

``--grid bar``: the training-step bar's whole table instead (N = 2k..16k, causal and not, MHA and GQA 32/8, d = 64
and 128: 32 rows), cuDNN (GQA natively) against the Gluon op and the op with either backward schedule spelled out
(``SCHEDULES``: one CTA per key block, persistent), the same rounds.

    python3 -m benchmarks.course.bench_gluon_train --out DIR      # writes DIR/<gpu>-gluon-train.json
    python3 -m benchmarks.course.bench_gluon_train --grid bar --out DIR   # DIR/<gpu>-gluon-train-bar.json
"""
from __future__ import annotations

import json
import os
import statistics

from benchmarks import results_parser
from benchmarks._gluon_cases import BAR_ROWS

SEQLENS = [2048, 4096, 8192, 16384]
ROUNDS = 5  # timings per implementation: the fixed-order one, then rotated rounds (both directions)
TOKENS, HIDDEN, D = 16384, 2048, 128
#: GQA rows (the bar's table: Hq = 32, Hkv = 8, d = 128): (causal, N, B)
GQA_HEADS = (32, 8)
GQA_ROWS = [(True, 8192, 2), (True, 32768, 1), (False, 8192, 2)]
#: the Gluon forward's key loop spelled out, timed beside its pin (``flash_gluon.key_loop_constexprs``,
#: ``configs.GLUON_FWD_KEY_LOOP``: fence at d = 128)
KEY_LOOPS = {"off": {"peeled": False, "fence": False}, "fence": {"peeled": False, "fence": True}}
#: ``--grid bar``: the backward's two schedules spelled out beside the default op (persistent when causal,
#: ``configs.GLUON_BACKWARD_CAUSAL``): name -> ``GluonBackwardConfig.persistent``
SCHEDULES = {"gluon_blocks": False, "gluon_persistent": True}


def _stage_bench():
    """The timings with the Triton forward pinned (``configs.FWD_PINS["hopper_bench"]``), as before."""
    from reference.triton import configs
    with configs.pinned(fwd=configs.FWD_PINS["hopper_bench"]):
        return _timings()


def _stage_bar():
    """The bar's table: cuDNN against the Gluon op (and the op on either backward schedule), per row their gradients
    compared with cuDNN's and ``ROUNDS`` rotated rounds."""
    import dataclasses
    from reference.triton.configs import GLUON_BACKWARD
    from benchmarks._common import rel_err as rel
    from benchmarks._common import rotated_rounds
    from benchmarks._gluon_cases import cudnn_attention, train_steps
    from benchmarks._common import hopper_bench as bench
    from reference.triton import flash_attention_gluon
    from reference.triton.flash_fwd import forward_flops

    out = []
    for d in sorted({r[0] for r in BAR_ROWS}):
        impls = {"cudnn": lambda q, k, v, c: cudnn_attention(q, k, v, c, "native"), "gluon": flash_attention_gluon}
        for name, persistent in SCHEDULES.items():
            cfg = dataclasses.replace(GLUON_BACKWARD[d], persistent=persistent)
            impls[name] = (lambda cfg: lambda q, k, v, c: flash_attention_gluon(q, k, v, c, bwd_config=cfg))(cfg)
        shapes = [r[1:] for r in BAR_ROWS if r[0] == d]
        for causal, N, B, H, Hkv, leaves, step in train_steps(shapes, d):
            flops = 3.5 * forward_flops(B, H, N, N, d, causal)
            row = {"d": d, "N": N, "B": B, "H": H, "H_kv": Hkv, "causal": causal}
            grads = {}
            for name, fn in impls.items():
                try:
                    step(fn)
                    grads[name] = [x.grad.clone() for x in leaves]
                    row[name] = {"ms": bench(lambda: step(fn))}
                except Exception as e:  # noqa: BLE001
                    row[name] = {"error": f"{type(e).__name__}: {str(e)[-300:]}"}
            for name in impls:
                if name != "cudnn" and name in grads and "cudnn" in grads:
                    row[name]["grad_rel_vs_cudnn"] = max(rel(g, r) for g, r in zip(grads[name], grads["cudnn"]))
            del grads
            timed = {n: fn for n, fn in impls.items() if "ms" in row[n]}
            more = rotated_rounds(timed, ROUNDS - 1, lambda fn: bench(lambda: step(fn)), first_shift=1)
            for n, extra in more.items():
                rounds = [row[n]["ms"], *extra]
                row[n].update(rounds_ms=rounds, tflops_rounds_median=flops / statistics.median(rounds) / 1e9)
            if "gluon" in timed and "cudnn" in timed:
                row["ratio_rounds_median"] = (row["gluon"]["tflops_rounds_median"]
                                              / row["cudnn"]["tflops_rounds_median"])
            if "cudnn" in timed:
                row["ratios_rounds_median"] = {n: row[n]["tflops_rounds_median"] / row["cudnn"]["tflops_rounds_median"]
                                               for n in timed if n != "cudnn"}
            print(f"d={d} causal={causal!s:5} N={N:5} H={H}/{Hkv}: " + "; ".join(
                f"{n} {row[n].get('tflops_rounds_median', float('nan')):4.0f} TFLOP/s" for n in impls)
                + "; x cudnn " + " ".join(f"{n} {r:.3f}" for n, r in row.get("ratios_rounds_median", {}).items())
                + f", grad err {max(row[n].get('grad_rel_vs_cudnn', -1) for n in impls if n != 'cudnn'):.0e}",
                flush=True)
            out.append(row)
    return out


def _print_row(row: dict, options) -> None:
    """One shape's line: each implementation's TFLOP/s of its first timing, its ratio to cuDNN and its gradient
    error; then the ratios of the medians over all rounds."""
    g = lambda n: row[n].get("tflops", float("nan"))  # noqa: E731
    gm = lambda n: row[n].get("tflops_rounds_median", float("nan"))  # noqa: E731
    names = [n for n in ("cudnn_repeat", "triton", "gluon", *options) if n in row]
    print(f"causal={row['causal']!s:5} N={row['N']:5} H={row['H']}/{row['H_kv']}: cudnn {g('cudnn'):4.0f} TFLOP/s; "
          + "; ".join(f"{n} {g(n):4.0f} ({g(n) / g('cudnn'):.2f}x, grad err {row[n].get('grad_rel_vs_cudnn', -1):.0e})"
                      for n in names), flush=True)
    print(f"    median of {ROUNDS} rotated rounds: " + "; ".join(f"{n} {gm(n) / gm('cudnn'):.2f}x" for n in names),
          flush=True)


def _timings():
    from torch.nn.attention import SDPBackend
    from benchmarks._common import rel_err as rel
    from benchmarks._common import rotated_rounds, sdpa
    from benchmarks._gluon_cases import cudnn_attention, train_steps
    from benchmarks._common import hopper_bench as bench
    from reference.triton import flash_attention, flash_attention_gluon
    from reference.triton.flash_fwd import forward_flops

    # the forward's key-loop options (flash_gluon.attend_overlapped), timed beside the default in the same process
    options = {f"gluon_{name}": (lambda loop: lambda q, k, v, c: flash_attention_gluon(q, k, v, c, key_loop=loop))(loop)
               for name, loop in KEY_LOOPS.items()}
    impls = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "triton": flash_attention, "gluon": flash_attention_gluon,
             **options}
    # GQA: cuDNN natively (enable_gqa) as the base, and on K, V repeated per query head (repeat + group sums timed)
    gqa_impls = {"cudnn": lambda q, k, v, c: cudnn_attention(q, k, v, c, "native"),
                 "cudnn_repeat": lambda q, k, v, c: cudnn_attention(q, k, v, c, "repeat"),
                 "triton": flash_attention, "gluon": flash_attention_gluon, **options}
    shapes = [(c, N, TOKENS // N, HIDDEN // D, HIDDEN // D) for c in (False, True) for N in SEQLENS]
    shapes += [(c, N, B) + GQA_HEADS for c, N, B in GQA_ROWS]
    out = []
    for causal, N, B, H, Hkv, leaves, step in train_steps(shapes, D):
        flops = 3.5 * forward_flops(B, H, N, N, D, causal)
        row = {"N": N, "B": B, "H": H, "H_kv": Hkv, "causal": causal}
        ref = None
        for name, fn in (impls if Hkv == H else gqa_impls).items():
            try:
                step(fn)
                grads = [x.grad.clone() for x in leaves]
                if ref is None:
                    ref = grads
                ms = bench(lambda: step(fn))
                row[name] = {"ms": ms, "tflops": flops / ms / 1e9,
                             "grad_rel_vs_cudnn": max(rel(g, r) for g, r in zip(grads, ref))}
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": f"{type(e).__name__}: {str(e)[-300:]}"}
        timed = {n: fn for n, fn in (impls if Hkv == H else gqa_impls).items() if "ms" in row[n]}
        more = rotated_rounds(timed, ROUNDS - 1, lambda fn: bench(lambda: step(fn)), first_shift=1)
        for n, extra in more.items():
            rounds = [row[n]["ms"], *extra]
            row[n].update(rounds_ms=rounds, tflops_rounds_median=flops / statistics.median(rounds) / 1e9)
        _print_row(row, options)
        out.append(row)
    return out


def main(argv=None):
    ap = results_parser(__doc__)
    ap.add_argument("--stage", default="all", help="all | bench | bar")
    ap.add_argument("--grid", default="main", choices=("main", "bar"),
                    help="main: the MHA d = 128 rows + 3 GQA rows, every implementation; bar: the bar's 32 rows, "
                         "cuDNN vs Gluon")
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args(argv)
    if args.stage in ("bench", "bar"):
        print("RESULT " + json.dumps(_stage_bench() if args.stage == "bench" else _stage_bar()), flush=True)
        return
    import torch
    import triton
    from benchmarks._staged import run_stages
    from benchmarks._common import gpu_tag
    os.makedirs(args.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "convention": "bf16 forward+backward via autograd, batch*seqlen=16384, hidden=2048, d=128; flops "
                         "3.5 x 4BHN^2d (x0.5 causal); do_bench(warmup=10 ms, rep=40 ms) medians; ratios from this "
                         "run only"}
    if args.grid == "bar":
        res["convention"] = res["convention"].replace("d=128", "d=64 and 128 (MHA hidden 2048; GQA Hq=32, Hkv=8)")
    suffix = "-bar" if args.grid == "bar" else ""
    path = os.path.join(args.out, f"{gpu_tag()}-gluon-train{suffix}.json")
    stage = "bar" if args.grid == "bar" else "bench"
    run_stages("benchmarks.course.bench_gluon_train", [stage], lambda st: args.timeout, res, path)


if __name__ == "__main__":
    main()
