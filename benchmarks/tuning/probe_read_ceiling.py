"""Is 0.84-0.87 of copy really the most one launch can read? A probe of issue 25's decode row (B = 1, 32k keys).

Session 5 measured a kernel that only streams the 32k decode's 134 MB of K/V (``read_ceiling.py``: 32 splits x
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
"""
from __future__ import annotations

import argparse
import json
import math
import os

import torch

from benchmarks import _common
from benchmarks.course.read_ceiling import read_ceiling_ms

HKV, D = 8, 128
#: (splits, block_n, num_stages, tma): the session-5 ceiling first
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(_common.RESULTS))
    ap.add_argument("--smoke", action="store_true", help="CPU: interpreter, N = 512, two variants")
    args = ap.parse_args(argv)
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
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "smoke-read-ceiling-probe.json" if smoke else
                        f"{_common.gpu_tag()}-read-ceiling-probe.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
