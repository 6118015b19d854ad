"""Where the Gluon forwards wait for ``P_{j-1} V_{j-1}``: the key-loop options against their defaults, one process
(notes/hopper.md, "The peeled key loop").

FA3 Algorithm 2 overlaps the softmax of ``S_j`` with the warpgroup's own ``P_{j-1} V_{j-1}``; in the pinned
kernels ptxas puts that wait above the softmax's exps (the sm_90a SASS, ``aot_report --waits``). The options that
keep it below them (``flash_gluon.attend_overlapped``'s ``fence`` / ``peeled``, ``flash_fp8_gluon``'s ``peeled``)
were checked against float64 on the GPU by ``tests/test_triton_gluon*.py`` / ``tests/test_triton_fp8_gluon.py``;
here every timed output is also compared with cuDNN's (relative error) before timing.

* ``bf16``: ``flash_attention_forward_gluon`` with ``key_loop`` = both options off (the default of the first run),
  ``fence``, ``peeled + fence``, and cuDNN (SDPA), d = 128 and 64, causal and not, batch x N = 16k tokens,
  hidden 2048;
* ``fp8``: ``attention_fp8_gluon`` (kernel alone on quantised inputs) with the pinned schedule and with
  ``peeled``, beside the bf16 Gluon forward, d = 128, H = 16, N = 8k and 16k;
* ``train``: ``flash_attention_gluon`` forward + backward with the options off and with ``fence`` against cuDNN
  (``enable_gqa``), GQA Hq = 32, Hkv = 8, causal, N = 8k and 32k (the bar's row: 0.99x at 32k).

Each implementation of a shape is timed in ``ROUNDS`` rounds, the order rotated by one each round (a kernel timed
right after another heavy one can run a few percent slower), median per implementation; TFLOP/s by the
FlashAttention convention (4 B H N^2 d, halved causal; x 3.5 for the training step).

    python3 -m benchmarks.course.bench_key_loop --out DIR      # writes DIR/<gpu>-gluon-key-loop.json
"""
from __future__ import annotations

from benchmarks import results_parser, write_json

ROUNDS = 5
TOKENS, HIDDEN = 16384, 2048
#: bf16 forward shapes: (d, causal, N)
BF16_SHAPES = [(d, c, n) for d in (128, 64) for c in (False, True) for n in ((2048, 8192, 16384) if d == 128
                                                                           else (8192,))]
#: the bf16 forward's key-loop options (``flash_gluon.key_loop_constexprs``), spelled out whatever the default
KEY_LOOPS = {"off": {"peeled": False, "fence": False}, "fence": {"peeled": False, "fence": True},
             "peeled_fence": {"peeled": True, "fence": True}}
FP8_N = (8192, 16384)
#: training-step rows: (causal, N, B), GQA Hq = 32, Hkv = 8, d = 128
TRAIN_ROWS = [(True, 8192, 2), (True, 32768, 1)]


def rotated(fns: dict, flops: float, ref=None) -> dict:
    """Each of ``fns`` run once (error vs ``ref`` if given), then timed in ``ROUNDS`` rotated rounds: median ms,
    TFLOP/s, the round times (``_common.checked_rounds``)."""
    from benchmarks._common import checked_rounds
    from benchmarks._common import hopper_bench as bench
    return checked_rounds(fns, flops, ref, rounds=ROUNDS, timer=bench)


def _ratios(row: dict, base: str, names) -> str:
    g = lambda n: row[n].get("tflops", float("nan"))  # noqa: E731
    return " ".join(f"{n} {g(n):4.0f} ({g(n) / g(base):.3f}x {base})" for n in names)


def bf16_rows() -> list:
    import torch
    from torch.nn.attention import SDPBackend
    from benchmarks._common import sdpa
    from reference.triton.flash_fwd import forward_flops
    from reference.triton.hopper.flash_gluon import flash_attention_forward_gluon
    cudnn = sdpa(SDPBackend.CUDNN_ATTENTION)
    rows = []
    for d, causal, N in BF16_SHAPES:
        H, B = HIDDEN // d, TOKENS // N
        q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with torch.no_grad():
            ref = cudnn(q, k, v, causal)
            fns = {"cudnn": lambda: cudnn(q, k, v, causal)}
            for name, loop in KEY_LOOPS.items():
                fns[name] = (lambda loop: lambda: flash_attention_forward_gluon(q, k, v, causal=causal,
                                                                                key_loop=loop))(loop)
            row = {"d": d, "causal": causal, "N": N, "B": B, "H": H,
                   **rotated(fns, forward_flops(B, H, N, N, d, causal), ref)}
        print(f"bf16 d={d} causal={causal!s:5} N={N:5}: " + _ratios(row, "off", ("cudnn", *KEY_LOOPS)), flush=True)
        rows.append(row)
        del q, k, v, ref
    return rows


def fp8_rows() -> list:
    import torch
    from torch.nn.attention import SDPBackend
    from benchmarks._common import sdpa
    from reference.triton.configs import FP8_GLUON_SCHEDULE
    from reference.triton.flash_fwd import forward_flops
    from reference.triton.hopper import flash_fp8_gluon as fg
    from reference.triton.hopper.flash_gluon import flash_attention_forward_gluon
    cudnn = sdpa(SDPBackend.CUDNN_ATTENTION)
    d, H = 128, 16
    rows = []
    for causal in (False, True):
        for N in FP8_N:
            B = TOKENS // N
            q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            x = fg.prepare_fp8_gluon(q, k, v, causal=causal)
            with torch.no_grad():
                ref = cudnn(q, k, v, causal)
                fns = {"gluon_bf16": lambda: flash_attention_forward_gluon(q, k, v, causal=causal),
                       "fp8_pin": lambda: fg.attention_fp8_gluon(x),
                       "fp8_peeled": lambda: fg.attention_fp8_gluon(x, schedule=dict(FP8_GLUON_SCHEDULE,
                                                                                     peeled=True))}
                row = {"d": d, "causal": causal, "N": N, "B": B, "H": H, "pin": dict(FP8_GLUON_SCHEDULE),
                       **rotated(fns, forward_flops(B, H, N, N, d, causal), ref)}
            print(f"fp8 causal={causal!s:5} N={N:5}: " + _ratios(row, "fp8_pin", ("gluon_bf16", "fp8_peeled")),
                  flush=True)
            rows.append(row)
            del q, k, v, x, ref
    return rows


def train_rows() -> list:
    from benchmarks._gluon_cases import cudnn_attention, train_steps
    from reference.triton import flash_attention_gluon
    from reference.triton.flash_fwd import forward_flops
    Hq, Hkv, d = 32, 8, 128
    rows = []
    for causal, N, B, _, _, leaves, step in train_steps([(c, N, B, Hq, Hkv) for c, N, B in TRAIN_ROWS], d):
        impls = {"cudnn": lambda q, k, v, c: cudnn_attention(q, k, v, c, "native"),
                 **{f"gluon_{name}": (lambda loop: lambda q, k, v, c: flash_attention_gluon(q, k, v, c, key_loop=loop))(
                     loop) for name, loop in KEY_LOOPS.items() if name != "peeled_fence"}}
        ref = step(impls["cudnn"]).clone()
        fns = {n: (lambda fn: lambda: step(fn))(fn) for n, fn in impls.items()}
        row = {"causal": causal, "N": N, "B": B, "H": Hq, "H_kv": Hkv, "d": d,
               **rotated(fns, 3.5 * forward_flops(B, Hq, N, N, d, causal), ref)}
        print(f"train GQA {Hq}/{Hkv} causal={causal} N={N}: " + _ratios(row, "cudnn", ("gluon_off", "gluon_fence")),
              flush=True)
        rows.append(row)
    return rows


def main(argv=None):
    ap = results_parser(__doc__)
    ap.add_argument("--parts", default="bf16,fp8,train", help="comma-separated: bf16, fp8, train")
    args = ap.parse_args(argv)
    from benchmarks._common import gpu_tag, run_meta
    from reference.triton import configs
    res = {"meta": run_meta(rounds=ROUNDS, pins={"GLUON_FWD_KEY_LOOP": configs.GLUON_FWD_KEY_LOOP,
                                                 "FP8_GLUON_SCHEDULE": configs.FP8_GLUON_SCHEDULE},
                            convention="do_bench(warmup=10 ms, rep=40 ms) medians of rotated rounds; flops "
                                       "4BHN^2d (x0.5 causal, x3.5 train); batch x N = 16k; ratios from this "
                                       "run only")}
    parts = {"bf16": bf16_rows, "fp8": fp8_rows, "train": train_rows}
    for part in args.parts.split(","):
        res[part] = parts[part]()
        path = write_json(args.out, f"{gpu_tag()}-gluon-key-loop.json", res)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
