"""Is 0.84-0.87 of copy really the most one launch can read? A probe of the decode bar (B = 1, 32k keys).

An earlier probe measured a kernel that only streams the 32k decode's 134 MB of K/V (``read_ceiling.py``: 32 splits x
8 kv heads, 4 warps, 64-key blocks) at 0.84-0.87 of the 1 GiB copy bandwidth, under the decode rows' timing
(``_common.graph_ms``), and concluded that no one-launch decode reaches the 0.9 bar. This probe asks whether
that kernel was simply a weak reader. Timed the same way, over the same bytes and the same rotation of input
sets (larger than L2 together):

* the stream kernel with more programs (64, 128 splits), 128-key blocks and more stages, pointer loads and TMA;
* torch's own full reduction of the same bytes held as one tensor (``torch.sum(x, dtype=float32)``);
* a device-to-device copy of those bytes (read + write), i.e. the copy bandwidth at this size rather than at
  1 GiB: how much of the gap is the size of one launch, not the kernel;
* the decode itself (``flash_decode``, Hq = 32) with 32 (the heuristic's pick), 64 and 128 splits, pointer loads
  and TMA (``DecodeConfig.use_tma``): does the decode follow the stream kernel when it gets more programs?

Every stream variant is checked against torch first (``read_ceiling_ms`` asserts its sums), every decode
variant against float64 attention on the same inputs.

    python3 -m benchmarks.tuning.probe_read_ceiling --out DIR      # DIR/<gpu>-read-ceiling-probe.json
    python3 -m benchmarks.tuning.probe_read_ceiling --smoke        # CPU, interpreter, tiny shapes
    python3 -m benchmarks.tuning.probe_read_ceiling --ncu --out DIR    # ncu of the decode / stream kernel at 32
                                                                       # and 128 splits: DIR/<gpu>-read-ceiling-ncu.json

The ``--ncu`` mode (``h100-read-ceiling-ncu.json``) separated the two suspects of the decode row: per
kernel its duration, throughputs and warp-state sections, with the decode also profiled with its merge as a second
kernel. Stage 1 alone takes the same time at 32 and 128 splits; the fused merge grows from 0.5 to 6.4 us
(notes/serving_perf.md, "Decode at 32k: ncu of the merge").
"""
from __future__ import annotations

import argparse
import json
import math
import os

import torch

from benchmarks import _common, write_json
from benchmarks.course.read_ceiling import read_ceiling_ms

HKV, D = 8, 128
#: (splits, block_n, num_stages, tma): the earlier probe's ceiling first
VARIANTS = [(32, 64, 4, False), (32, 64, 4, True), (64, 64, 4, True), (128, 64, 4, True), (64, 128, 3, True),
            (128, 64, 4, False), (64, 128, 3, False)]


def decode_rows(sets, record, res, smoke):
    """``flash_decode`` at B = 1 over the same K/V with 32 / 64 / 128 splits (pointer loads; TMA on Hopper), each
    checked against float64 attention first (relative error of o < 2e-2 in bf16)."""
    import dataclasses
    from reference.triton import configs, flash_decode
    hq = 4 * HKV
    qs = [torch.randn(1, hq, D, device=sets[0][0].device, dtype=sets[0][0].dtype) for _ in sets]
    q64, k64, v64 = (x.double().cpu() for x in (qs[0], *sets[0]))
    s64 = torch.einsum("bhgd,bhnd->bhgn", q64.view(1, HKV, 4, D), k64) / D ** 0.5
    ref = torch.einsum("bhgn,bhnd->bhgd", torch.softmax(s64, -1), v64).reshape(1, hq, D)
    pin = configs.decode_pin("contiguous")
    for splits in ((8,) if smoke else (32, 64, 128)):
        for tma in ((False,) if smoke else (False, True)):
            name = f"flash_decode splits={splits} {'tma' if tma else 'pointer'}"
            cfg = dataclasses.replace(pin, use_tma=tma)
            try:
                o = flash_decode(qs[0], *sets[0], num_splits=splits, config=cfg)
                err = float((o.double().cpu() - ref).norm() / ref.norm())
                if err > 2e-2:
                    raise AssertionError(f"o relative error {err:.2e} vs float64")
                ms = _common.graph_ms([lambda q=q, k=k, v=v: flash_decode(q, k, v, num_splits=splits, config=cfg,
                                                                           validate=False)
                                       for q, (k, v) in zip(qs, sets)], smoke=smoke)
            except Exception as exc:  # noqa: BLE001 - one variant failing keeps the others
                res["rows"].append({"name": name, "error": repr(exc)[:300]})
                print(f"{name}: {exc!r}"[:300], flush=True)
                continue
            record(name, ms, splits=splits, tma=tma, rel_err_vs_float64=err)


#: (kind, splits) profiled by ``--ncu``, in launch order; ``decode_unfused`` is the decode with the merge as a
#: second kernel (``DecodeConfig(fuse_merge=False)``): stage 1 alone, then the merge, timed apart
NCU_CASES = [("decode", 32), ("decode", 128), ("decode_unfused", 32), ("decode_unfused", 128), ("stream", 32),
             ("stream", 128)]
#: kernels each kind launches
NCU_KERNELS = {"decode": 1, "decode_unfused": 2, "stream": 1}


def _profile_cases() -> None:
    """Under ncu (``--profile-from-start off``): each of ``NCU_CASES`` once to warm up, then once profiled."""
    import dataclasses
    from benchmarks.course.read_ceiling import _stream_kernel
    from reference.triton import configs, flash_decode
    unfused = dataclasses.replace(configs.decode_pin("contiguous"), fuse_merge=False)
    k, v = (torch.randn(1, HKV, 32768, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(1, 4 * HKV, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(HKV * 128, device="cuda", dtype=torch.float32)
    runs = []
    for kind, splits in NCU_CASES:
        if kind == "decode":
            runs.append(lambda s=splits: flash_decode(q, k, v, num_splits=s, validate=False))
        elif kind == "decode_unfused":
            runs.append(lambda s=splits: flash_decode(q, k, v, num_splits=s, validate=False, config=unfused))
        else:
            runs.append(lambda s=splits: _stream_kernel[(s, HKV)](k, v, out, k, v, 32768, 32768 // s, BLOCK_N=64,
                                                                   HEAD_DIM=D, USE_TMA=False, num_warps=4,
                                                                   num_stages=4))
    _common.profile_once(runs)


def run_ncu(out_dir: str) -> None:
    """``ncu`` over ``--profile-cases`` (the sections and metrics of ``tune_bwd_hopper``); the summary per kernel
    labelled with its case, the raw CSV beside it."""
    import subprocess
    import sys
    from benchmarks._ncu import NCU_EXTRA, NCU_SECTIONS, summarize_ncu
    q = subprocess.run(["ncu", "--query-metrics", "--chip", "gh100"], capture_output=True, text=True)
    names = {line.split()[0] for line in q.stdout.splitlines() if line.strip()}
    metrics = [m + suf for m, suf in NCU_EXTRA.items() if m in names]
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "ncu_read_ceiling.csv")
    cmd = ["ncu", "--csv", "--page", "details", "--clock-control", "none", "--profile-from-start", "off",
           *sum((["--section", s] for s in NCU_SECTIONS), []), "--metrics", ",".join(metrics),
           sys.executable, "-m", "benchmarks.tuning.probe_read_ceiling", "--profile-cases"]
    with open(csv_path, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, cwd=_common.ROOT)
    res = {"gpu": torch.cuda.get_device_name(), "cases": NCU_CASES, "rc": r.returncode, "stderr": r.stderr[-2000:]}
    if r.returncode == 0:
        kernels = summarize_ncu(csv_path)
        res["kernels"] = kernels
        labels = [list(case) for case in NCU_CASES for _ in range(NCU_KERNELS[case[0]])]
        if len(kernels) == len(labels):
            for kern, label in zip(kernels, labels):
                kern["case"] = label
        for kern in kernels:
            print(json.dumps(kern), flush=True)
    path = os.path.join(out_dir, f"{_common.gpu_tag()}-read-ceiling-ncu.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {path}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(_common.RESULTS))
    ap.add_argument("--smoke", action="store_true", help="CPU: interpreter, N = 512, two variants")
    ap.add_argument("--ncu", action="store_true", help="profile NCU_CASES under ncu instead of timing")
    ap.add_argument("--profile-cases", action="store_true", help="(internal, under ncu)")
    args = ap.parse_args(argv)
    if args.profile_cases:
        return _profile_cases()
    if args.ncu:
        return run_ncu(args.out)
    smoke = args.smoke
    device = "cpu" if smoke else "cuda"
    dtype = torch.float32 if smoke else torch.bfloat16
    N = 512 if smoke else 32768
    kv_bytes = 2 * HKV * N * D * (4 if smoke else 2)
    copy_bw = _common.copy_bandwidth(1 << (21 if smoke else 30), device=device, wall=smoke)
    if smoke:
        n_sets = 1
    else:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
        n_sets = int(min(32, max(1, math.ceil(3 * l2 / kv_bytes))))
    sets = [(torch.randn(1, HKV, N, D, device=device, dtype=dtype),
             torch.randn(1, HKV, N, D, device=device, dtype=dtype)) for _ in range(n_sets)]
    tma_ok = not smoke and torch.cuda.get_device_capability() >= (9, 0)
    res = {"gpu": "cpu (smoke)" if smoke else torch.cuda.get_device_name(), "N": N, "kv_bytes": kv_bytes,
           "input_sets": n_sets, "copy_bw_bytes_per_s": copy_bw,
           "timing": "_common.graph_ms (CUDA-graph replay over the input sets), as bench_decode's rows", "rows": []}

    def record(name, ms, **kw):
        row = {"name": name, "ms_graph": ms, "frac_copy_bw": kv_bytes / (ms * 1e-3) / copy_bw, **kw}
        res["rows"].append(row)
        print(f"{name:40s} {ms * 1e3:7.1f} us  {row['frac_copy_bw']:.3f} of copy", flush=True)

    for splits, block_n, stages, tma in (VARIANTS[:1] + VARIANTS[5:6] if smoke else VARIANTS):
        if tma and not tma_ok:
            continue
        splits = min(splits, N // block_n)
        name = f"stream splits={splits} block={block_n} stages={stages} {'tma' if tma else 'pointer'}"
        try:
            ms = read_ceiling_ms(sets, splits, tma, block_n=block_n, num_stages=stages, smoke=smoke)
        except Exception as exc:  # noqa: BLE001 - one variant failing keeps the others
            res["rows"].append({"name": name, "error": repr(exc)[:300]})
            print(f"{name}: {exc!r}"[:300], flush=True)
            continue
        record(name, ms, splits=splits, block_n=block_n, stages=stages, tma=tma)
    decode_rows(sets, record, res, smoke)
    flat = [torch.cat([k.flatten(), v.flatten()]) for k, v in sets]
    ref = flat[0].double().sum()
    got = torch.sum(flat[0], dtype=torch.float32).double()
    assert abs(float(got - ref)) <= 1e-3 * float(flat[0].double().abs().sum()), "torch.sum check"
    record("torch.sum (one tensor, float32)", _common.graph_ms(
        [lambda x=x: torch.sum(x, dtype=torch.float32) for x in flat], smoke=smoke))
    dst = [torch.empty_like(x) for x in flat]
    ms = _common.graph_ms([lambda x=x, y=y: y.copy_(x) for x, y in zip(flat, dst)], smoke=smoke)
    record("copy of the same bytes (read + write)", ms,
           copy_bw_at_this_size=2 * kv_bytes / (ms * 1e-3), note="frac_copy_bw counts the bytes read only")
    path = write_json(args.out, "smoke-read-ceiling-probe.json" if smoke else f"{_common.gpu_tag()}-read-ceiling-probe.json", res)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
