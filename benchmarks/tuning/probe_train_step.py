"""Why is one training-step row far below its kernels? A probe of the causal N = 2k row (GPU only).

``bench_gluon_train --grid bar`` measured the causal d = 128 MHA N = 2k step (B = 8, H = 16) at 0.69x cuDNN, while
``ncu_gluon_train --rows below`` summed that step's kernels at 1152 us against cuDNN's 1080 (0.94x). The step is
either host-bound (Python and launch cost above the GPU time), or the GPU idles between or inside kernels in a
way a replayed kernel does not show. Per row and implementation (cuDNN, the Gluon op) this probe measures, in one
process:

* ``step_ms``: ``do_bench`` medians of the step in rounds, both orders (``_common.rotated_rounds``);
* ``host_us``: the host time of one step, steps issued while a sleep kernel holds the GPU (``_common.host_us``);
* ``kernels``: ``torch.profiler`` over ``STEPS`` back-to-back steps: each kernel's mean GPU time, the kernels' sum
  per step, and the wall span per step on the GPU's clock (first kernel start to last kernel end, divided by the
  steps): span minus the sum is the GPU's idle time between kernels;
* ``cprofile``: at the Gluon op, the top functions by own host time per step.

``gluon`` repeats its recorded launches (``reference.triton._fastlaunch``) from the second step on; ``gluon_jit``
forgets them before every step, so each launch takes Triton's own path (the op before the recorded launches),
and its dK, dV must equal ``gluon``'s bit for bit (dQ is added with fp32 atomics in no fixed order: compared by its
relative error).

    python3 -m benchmarks.tuning.probe_train_step --out DIR     # DIR/<gpu>-train-step-probe.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

#: (d, causal, N, B, Hq, Hkv): the row below its kernels, its d = 64 and GQA neighbours, and causal 4k as a control
ROWS = [(128, True, 2048, 8, 16, 16), (64, True, 2048, 8, 32, 32), (128, True, 2048, 8, 32, 8),
        (128, True, 4096, 4, 16, 16)]
STEPS = 20
ROUNDS = 6


def _kernels(step, steps: int = STEPS) -> dict:
    """Per-kernel mean GPU time and the GPU's busy and idle time per step, from a ``torch.profiler`` trace."""
    from torch.autograd import DeviceType
    from benchmarks._common import cuda_trace
    events = [e for e in cuda_trace(step, steps).events() if e.device_type == DeviceType.CUDA]
    starts = [e.time_range.start for e in events]
    ends = [e.time_range.end for e in events]
    per = {}
    for e in events:
        per.setdefault(e.name[:90], []).append(e.time_range.end - e.time_range.start)
    busy = sum(ends[i] - starts[i] for i in range(len(events)))
    span = (max(ends) - min(starts)) if events else 0.0
    return {"per_kernel_us": {k: round(sum(v) / steps, 1) for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1]))},
            "launches_per_step": len(events) / steps, "busy_us_per_step": round(busy / steps, 1),
            "span_us_per_step": round(span / steps, 1), "idle_us_per_step": round((span - busy) / steps, 1)}


def probe() -> dict:
    import torch
    from benchmarks import _common
    from benchmarks._common import hopper_bench as bench
    from benchmarks._common import profile_top, rel_err, rotated_rounds
    from benchmarks._gluon_cases import cudnn_attention, train_steps
    from reference.triton import flash_attention_gluon

    from reference.triton.hopper.flash_gluon_autograd import clear_recorded_launches

    def gluon_jit(q, k, v, c):  # every launch through Triton's own path (the recorded launches forgotten first)
        clear_recorded_launches()
        return flash_attention_gluon(q, k, v, c)
    impls = {"cudnn": lambda q, k, v, c: cudnn_attention(q, k, v, c, "native"), "gluon": flash_attention_gluon,
             "gluon_jit": gluon_jit}
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for d in sorted({r[0] for r in ROWS}, reverse=True):
        for causal, N, B, H, Hkv, leaves, step in train_steps([r[1:] for r in ROWS if r[0] == d], d):
            row = {"d": d, "causal": causal, "N": N, "B": B, "H": H, "H_kv": Hkv}
            grads = {}
            for name, fn in impls.items():
                step(fn)
                step(fn)  # the Gluon op's second call repeats its recorded launches
                grads[name] = [x.grad.clone() for x in leaves]
            row["grad_rel_vs_cudnn"] = max(rel_err(g, r) for g, r in zip(grads["gluon"], grads["cudnn"]))
            # dk, dv are deterministic; dq is added with fp32 atomics in no fixed order, so compared by its error
            row["jit_vs_recorded_dkdv_bitwise"] = all(torch.equal(a, b) for a, b in
                                                      zip(grads["gluon"][1:], grads["gluon_jit"][1:]))
            row["jit_vs_recorded_dq_rel"] = rel_err(grads["gluon"][0], grads["gluon_jit"][0])
            del grads
            steps = {n: (lambda fn=fn: step(fn)) for n, fn in impls.items()}
            rounds = rotated_rounds(steps, ROUNDS, lambda s: bench(s))
            for n, s in steps.items():
                row[n] = {"step_ms": [round(x, 4) for x in rounds[n]],
                          "step_ms_median": round(statistics.median(rounds[n]), 4),
                          "host_us": [round(_common.host_us(s, 20), 1) for _ in range(3)],
                          "kernels": _kernels(s)}
            row["gluon"]["cprofile"] = profile_top(steps["gluon"], 50, 16)
            row["ratio"] = row["cudnn"]["step_ms_median"] / row["gluon"]["step_ms_median"]
            row["ratio_jit"] = row["cudnn"]["step_ms_median"] / row["gluon_jit"]["step_ms_median"]
            g, c = row["gluon"], row["cudnn"]
            print(f"d={d} causal={causal} N={N} H={H}/{Hkv}: step gluon {g['step_ms_median']:.3f} ms / cudnn "
                  f"{c['step_ms_median']:.3f} ms ({row['ratio']:.3f}x; Triton's launch path {row['ratio_jit']:.3f}x,"
                  f" host us {row['gluon_jit']['host_us']}, dk dv bitwise {row['jit_vs_recorded_dkdv_bitwise']}, dq rel {row['jit_vs_recorded_dq_rel']:.0e}); "
                  f"host us gluon {g['host_us']} cudnn "
                  f"{c['host_us']}; GPU busy/span/idle per step gluon {g['kernels']['busy_us_per_step']}/"
                  f"{g['kernels']['span_us_per_step']}/{g['kernels']['idle_us_per_step']} cudnn "
                  f"{c['kernels']['busy_us_per_step']}/{c['kernels']['span_us_per_step']}/"
                  f"{c['kernels']['idle_us_per_step']}", flush=True)
            for n in impls:
                print(f"    {n}: " + "; ".join(f"{k[:40]} {v}" for k, v in row[n]["kernels"]["per_kernel_us"].items()),
                      flush=True)
            out["rows"].append(row)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/probe_train_step")
    args = ap.parse_args(argv)
    from benchmarks._common import gpu_tag
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{gpu_tag()}-train-step-probe.json")
    res = probe()
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
