"""The persistent Gluon backward against one CTA per key block: checks, then the backward kernels alone (GPU only).

``configs.GluonBackwardConfig.persistent`` runs the warp-specialised backward (``hopper.flash_gluon_bwd_ws``) as
one CTA per SM looping over a host-made list schedule of the key blocks (``persistent_schedule``) instead of one
CTA per key block. Per row of the training-step bar (``_gluon_cases.BAR_ROWS``: N = 2k..16k, causal and not,
MHA and GQA 32/8, d = 64 and 128), in one process:

* checks: dK, dV of the persistent launch bit for bit equal to the one-CTA-per-block launch's (each item runs the
  same code in the same order), dQ (fp32 atomics in no fixed order) by its relative difference;
* ``ms``: the backward alone (the Gluon op's three launches: preprocess, kernel, dQ conversion), ``do_bench``
  medians in ``ROUNDS`` rounds in both orders (``_common.rotated_rounds``), beside cuDNN's backward (SDPA's cuDNN
  backend, GQA natively, its forward outside the timing).

    python3 -m benchmarks.tuning.probe_bwd_persistent --out DIR     # DIR/<gpu>-bwd-persistent-probe.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics

ROUNDS = 4


def _row(d, causal, N, B, Hq, Hkv) -> dict:
    import torch
    from benchmarks._common import hopper_bench as bench
    from benchmarks._common import rotated_rounds
    from benchmarks._gluon_cases import cudnn_attention
    from reference.triton.configs import GLUON_BACKWARD
    from reference.triton.flash_fwd import forward_flops
    from reference.triton.hopper.flash_gluon import flash_attention_forward_gluon
    from reference.triton.hopper.flash_gluon_bwd_ws import flash_attention_backward_gluon_ws as bwd

    q, do = (torch.randn(B, Hq, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(B, Hkv, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o, lse = flash_attention_forward_gluon(q, k, v, causal=causal)
    cfgs = {name: dataclasses.replace(GLUON_BACKWARD[d], persistent=p)
            for name, p in (("blocks", False), ("persistent", True))}
    got = {name: bwd(q, k, v, o, lse, do, causal=causal, config=c) for name, c in cfgs.items()}
    a, b = got["blocks"], got["persistent"]
    row = {"d": d, "causal": causal, "N": N, "B": B, "H": Hq, "H_kv": Hkv,
           "dkdv_bitwise_equal": bool(torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])),
           "dq_rel_diff": ((a[0].float() - b[0].float()).norm() / a[0].float().norm()).item()}
    del got, a, b
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    oc = cudnn_attention(qg, kg, vg, causal, "native")
    fns = {"cudnn": lambda: torch.autograd.grad(oc, (qg, kg, vg), do, retain_graph=True)}
    for name, c in cfgs.items():
        fns[name] = (lambda c: lambda: bwd(q, k, v, o, lse, do, causal=causal, config=c))(c)
    ms = rotated_rounds(fns, ROUNDS, lambda fn: bench(fn))
    flops = 2.5 * forward_flops(B, Hq, N, N, d, causal)
    med = {n: statistics.median(r) for n, r in ms.items()}
    row.update(rounds_ms=ms, tflops={n: flops / m / 1e9 for n, m in med.items()},
               x_cudnn={n: med["cudnn"] / m for n, m in med.items() if n != "cudnn"},
               persistent_vs_blocks=med["blocks"] / med["persistent"])
    print(f"d={d} causal={causal!s:5} N={N:5} H={Hq}/{Hkv}: bitwise {row['dkdv_bitwise_equal']} dq {row['dq_rel_diff']:.0e}; "
          + " ".join(f"{n} {t:4.0f}" for n, t in row["tflops"].items()) + " TFLOP/s; x cudnn "
          + " ".join(f"{n} {x:.3f}" for n, x in row["x_cudnn"].items()), flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import torch
    import triton
    from benchmarks._common import gpu_tag
    from benchmarks._gluon_cases import BAR_ROWS
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "convention": "backward alone (preprocess + kernel + dQ conversion) vs SDPA cuDNN's backward, bf16; "
                         "flops 2.5 x 4BHN^2d (x0.5 causal); do_bench medians over rounds in both orders",
           "rows": [_row(*r) for r in BAR_ROWS]}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{gpu_tag()}-bwd-persistent-probe.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
