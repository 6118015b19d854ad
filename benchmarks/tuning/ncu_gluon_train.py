"""Where a GQA training step's time goes, ours vs cuDNN: every kernel of one ``o = f(q, k, v); o.backward(do)``
under ncu (the bar "Gluon training step with GQA at or above cuDNN").

``bench_gluon_train`` gives the ratio (0.98 / 0.99 at GQA 32/8 causal 8k / 32k, medians of rotated rounds); this
script gives the cause: per kernel of each step (the Gluon forward, the backward's preprocess, the warp-specialised
backward, any reduction; cuDNN's forward and backward kernels) its duration, tensor-pipe activity and
throughputs, and per step their sums. One ncu process per (implementation, shape), so each kernel belongs to the
step it was profiled in; each step runs once to warm up (compilation outside the profiled region), then once
between ``cudaProfilerStart`` and ``cudaProfilerStop``.

    python3 -m benchmarks.tuning.ncu_gluon_train --out DIR     # DIR/<gpu>-gluon-train-ncu.json (+ raw CSVs)
    python3 -m benchmarks.tuning.ncu_gluon_train --rows below --out DIR  # the rows below cuDNN (causal 2k MHA, GQA 8k)
    python3 -m benchmarks.tuning.ncu_gluon_train --rows short --out DIR  # 2k MHA, non-causal and causal
    python3 -m benchmarks.tuning.ncu_gluon_train --summarize A.csv    # the per-kernel table of one ncu CSV
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

#: (causal, N, B, Hq, Hkv): the GQA rows of ``bench_gluon_train`` (the training-step bar's rows), d = 128
SHAPES = [(True, 8192, 2, 32, 8), (True, 32768, 1, 32, 8)]
#: ``--rows``: which rows to profile. ``below``: the rows measured below cuDNN on an H200 (the causal 2k MHA
#: training step, 0.78x, B = 8, H = 16; and causal GQA 32/8 at 8k, whose backward was 0.79-0.81x on an H100)
#: ``short``: the 2k MHA rows left below cuDNN with the persistent causal backward (non-causal and causal, B = 8, H = 16)
ROWS = {"gqa": SHAPES, "below": [(True, 2048, 8, 16, 16), (True, 8192, 2, 32, 8)],
        "short": [(False, 2048, 8, 16, 16), (True, 2048, 8, 16, 16)]}
IMPLS = ("cudnn", "gluon")
D = 128


def _step(impl: str, causal: bool, N: int, B: int, Hq: int, Hkv: int):
    """A zero-argument training step of ``impl`` on fresh bf16 inputs (grads cleared each call)."""
    import torch
    from benchmarks._gluon_cases import cudnn_attention
    from reference.triton import flash_attention_gluon
    fn = (lambda q, k, v: cudnn_attention(q, k, v, causal, "native")) if impl == "cudnn" else \
        (lambda q, k, v: flash_attention_gluon(q, k, v, causal))
    q, do = (torch.randn(B, Hq, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    leaves = [x.requires_grad_(True) for x in (q, k, v)]

    def step():
        for x in leaves:
            x.grad = None
        fn(*leaves).backward(do)
    return step


def _profile(impl: str, shape: list) -> None:
    """Under ncu (``--profile-from-start off``): one warm-up step, then one profiled step."""
    import torch
    step = _step(impl, *shape)
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def step_summary(kernels: list[dict]) -> dict:
    """Sums over one step's kernels: total duration, the tensor-pipe-weighted activity, the largest kernel's share."""
    total = sum(k.get("duration_ns", 0.0) for k in kernels)
    busy = sum(k.get("duration_ns", 0.0) * k.get("tensor_pipe_active_pct", 0.0) for k in kernels)
    big = max(kernels, key=lambda k: k.get("duration_ns", 0.0)) if kernels else {}
    return {"kernels": len(kernels), "duration_us": total / 1e3,
            "tensor_pipe_active_pct_weighted": busy / total if total else 0.0,
            "largest": big.get("kernel"), "largest_share": big.get("duration_ns", 0.0) / total if total else 0.0}


def _ncu(impl: str, shape: tuple, out_dir: str) -> dict:
    from benchmarks._ncu import NCU_EXTRA, NCU_SECTIONS, summarize_ncu
    q = subprocess.run(["ncu", "--query-metrics", "--chip", "gh100"], capture_output=True, text=True)
    names = {line.split()[0] for line in q.stdout.splitlines() if line.strip()}
    metrics = [m + suf for m, suf in NCU_EXTRA.items() if m in names]
    tag = f"{impl}_{'c' if shape[0] else 'nc'}{shape[1] // 1024}k"
    csv_path = os.path.join(out_dir, f"ncu_train_{tag}.csv")
    cmd = ["ncu", "--csv", "--page", "details", "--clock-control", "none", "--profile-from-start", "off",
           *sum((["--section", s] for s in NCU_SECTIONS), []), "--metrics", ",".join(metrics),
           sys.executable, "-m", "benchmarks.tuning.ncu_gluon_train", "--profile", impl, json.dumps(list(shape))]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(csv_path, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, cwd=root)
    if r.returncode:
        return {"error": r.stderr[-2000:], "rc": r.returncode}
    kernels = summarize_ncu(csv_path)
    return {"kernels": kernels, "step": step_summary(kernels)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/ncu_train")
    ap.add_argument("--profile", nargs=2, metavar=("IMPL", "SHAPE_JSON"), help="(internal, under ncu)")
    ap.add_argument("--summarize", default=None, help="print the per-kernel summary of one ncu CSV")
    ap.add_argument("--rows", choices=sorted(ROWS), default="gqa", help="which training-step rows to profile")
    args = ap.parse_args(argv)
    if args.profile:
        impl, shape = args.profile
        if impl not in IMPLS:
            raise SystemExit(f"--profile IMPL must be one of {IMPLS}, got {impl!r}")
        return _profile(impl, json.loads(shape))
    if args.summarize:
        from benchmarks._ncu import summarize_ncu
        kernels = summarize_ncu(args.summarize)
        print(json.dumps({"kernels": kernels, "step": step_summary(kernels)}, indent=1))
        return
    import torch
    from benchmarks._common import gpu_tag
    os.makedirs(args.out, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "d": D,
           "convention": "one training step (forward + backward via autograd) per ncu process, bf16; "
                         "--clock-control none; durations are ncu's (kernel replay), not do_bench's",
           "rows": []}
    res["rows_set"] = args.rows
    for shape in ROWS[args.rows]:
        row = {"causal": shape[0], "N": shape[1], "B": shape[2], "H": shape[3], "H_kv": shape[4]}
        for impl in IMPLS:
            row[impl] = _ncu(impl, shape, args.out)
            s = row[impl].get("step", {})
            print(f"{impl} {shape}: {s.get('kernels')} kernels, {s.get('duration_us', 0):.0f} us, tensor pipe "
                  f"{s.get('tensor_pipe_active_pct_weighted', 0):.1f}% (duration-weighted)", flush=True)
            for k in row[impl].get("kernels", []):
                print(f"    {k.get('duration_ns', 0) / 1e3:9.1f} us  tensor {k.get('tensor_pipe_active_pct', 0):5.1f}%"
                      f"  issue {k.get('issue_slots_busy_pct', 0):5.1f}%  {k['kernel'][:70]}", flush=True)
        res["rows"].append(row)
        path = os.path.join(args.out, f"{gpu_tag()}-gluon-train-ncu.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
