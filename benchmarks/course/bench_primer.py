"""Check and time the Triton primer's kernels on a GPU, with every timer lectures 05a and 05b compare.

    python3 -m benchmarks.course.bench_primer --out DIR     # -> DIR/<gpu>-primer.json
    ncu --csv --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats -k regex:softmax_row \\
        python3 -m benchmarks.course.bench_primer --ncu-region > raw.txt   # the softmax with 4 and 16 warps
    grep '^"' raw.txt > <gpu>-softmax-ncu.csv                              # ncu's own lines dropped

What it records (``reference.triton.primer``'s kernels; float64 torch as the oracle, fresh random inputs, outputs
poisoned with NaN before each check):

* ``checks``: the relative error of ``add`` (ragged n), ``softmax_rows`` (ragged rows) and ``matmul`` (ragged M,
  N, K; pinned tiles and autotuned) against float64;
* ``first_call``: the wall time of a kernel's first call (JIT compile included) and of a warm call;
* ``timers``: one vector add, small (fits in L2) and large, timed seven ways: a host clock without and with a
  synchronise, CUDA events around one call with and without an L2 flush before it, ``do_bench`` (median; it
  flushes L2), and CUDA-graph replay;
* ``noise``: the small add timed by ``do_bench`` ten times in a row (each a median);
* ``rounds``: add, softmax and matmul in rotated rounds (``_common.rotated_rounds``), each round a ``do_bench``;
* ``sweeps``: the softmax over ``num_warps``, the matmul over its tiles, ``num_warps`` and ``num_stages``, and the
  autotuner's choice;
* ``ceilings``: the copy bandwidth (bytes read + written per second) and torch's bf16 matmul TFLOP/s.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch

import reference.triton  # noqa: F401  (first: without CUDA it selects the interpreter before triton loads)
from benchmarks import _common, results_parser, write_json
from reference.triton import primer

SOFTMAX_SHAPE = (8192, 4096)           # fp16: 64 MiB in, 64 MiB out (larger than L2)
MATMUL_N = 4096                        # fp16 4096^3: 137 GFLOP
ADD_SMALL, ADD_LARGE = 1 << 20, 1 << 26  # fp32: 3 x 4 MiB (in L2) and 3 x 256 MiB


def _rel(a, b) -> float:
    return _common.rel_err(a, b)


def checks() -> list:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(int(time.time()))

    def run(name, fn, ref, tol, **info):
        row = dict(kernel=name, **info)

        def fill(r):
            out = fn()
            r["rel_err"] = _rel(out, ref)
            r["ok"] = bool(r["rel_err"] <= tol)
        rows.append(_common.check_row(row, fill))

    for n in (1, 1000, 4097, 123_457):
        x = torch.randn(n, device="cuda", generator=g)
        y = torch.randn(n, device="cuda", generator=g)
        out = torch.full_like(x, float("nan"))
        run("add", lambda: primer.add(x, y, out=out), x.double() + y.double(), 1e-7, n=n)
    for shape in ((5, 37), (300, 1000), (64, 4097)):
        x = torch.randn(*shape, device="cuda", generator=g, dtype=torch.float16) * 4
        run("softmax_rows", lambda: primer.softmax_rows(x), torch.softmax(x.double(), -1), 2e-3, shape=list(shape))
    for m, n, k in ((70, 45, 100), (512, 384, 1000), (1000, 1000, 1000)):
        a = torch.randn(m, k, device="cuda", generator=g, dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", generator=g, dtype=torch.float16)
        ref = a.double() @ b.double()
        run("matmul", lambda: primer.matmul(a, b), ref, 2e-3, shape=[m, n, k])
        run("matmul_tuned", lambda: primer.matmul_tuned(a, b)[0], ref, 2e-3, shape=[m, n, k])
    return rows


def _wall_ms(fn, n=50, sync=True) -> float:
    ts = []
    for _ in range(n):
        if sync:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(ts)


def _events_ms(fn, n=50, flush=None) -> float:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        if flush is not None:
            flush.zero_()           # writes 256 MiB: evicts the kernel's data from L2 (outside the events)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    return statistics.median(ts)


def timers() -> dict:
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    out = {}
    for label, n in (("small", ADD_SMALL), ("large", ADD_LARGE)):
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        z = torch.empty_like(x)
        fn = lambda: primer.add(x, y, out=z)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        row = dict(n=n, bytes=3 * 4 * n)
        row["host_no_sync_ms"] = _wall_ms(fn, sync=False)
        row["host_sync_ms"] = _wall_ms(fn)
        row["events_ms"] = _events_ms(fn)
        row["events_flush_ms"] = _events_ms(fn, flush=flush)
        row["do_bench_ms"] = _common.bench(fn)
        row["graph_ms"] = _common.graph_ms([fn], reps=50)
        out[label] = row
    del flush
    return out


def first_call() -> dict:
    x, y = torch.randn(ADD_SMALL, device="cuda"), torch.randn(ADD_SMALL, device="cuda")
    fn = lambda: primer.add(x, y, block=2048)  # noqa: E731  (a BLOCK no other part compiles)
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    first = (time.perf_counter() - t) * 1e3
    return dict(first_ms=first, warm_ms=_wall_ms(fn))


def workloads() -> dict:
    xs = torch.randn(*SOFTMAX_SHAPE, device="cuda", dtype=torch.float16)
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.float16)
    b = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.float16)
    x, y = torch.randn(ADD_LARGE, device="cuda"), torch.randn(ADD_LARGE, device="cuda")
    z = torch.empty_like(x)
    return {"add": (lambda: primer.add(x, y, out=z), 3 * 4 * ADD_LARGE, 0),
            "softmax": (lambda: primer.softmax_rows(xs), 2 * 2 * xs.numel(), 0),
            "matmul": (lambda: primer.matmul(a, b, 128, 128, 64, 8, 3), 3 * 2 * MATMUL_N ** 2, 2 * MATMUL_N ** 3),
            "_tensors": (xs, a, b)}


def sweeps(w) -> dict:
    xs, a, b = w["_tensors"]
    soft = []
    for nw in (1, 2, 4, 8, 16, 32):
        ms = _common.bench(lambda: primer.softmax_rows(xs, num_warps=nw))
        soft.append(dict(num_warps=nw, ms=ms, gbps=2 * 2 * xs.numel() / ms / 1e6))
    mm = []
    for bm, bn, bk, nw, ns in ((128, 128, 64, 8, 1), (128, 128, 64, 8, 2), (128, 128, 64, 8, 3),
                               (128, 128, 64, 8, 4), (128, 128, 64, 4, 3), (64, 64, 32, 4, 2), (64, 64, 32, 4, 4),
                               (32, 32, 32, 4, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4)):
        row = dict(block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns)
        try:
            ms = _common.bench(lambda: primer.matmul(a, b, bm, bn, bk, nw, ns))
            row.update(ms=ms, tflops=2 * MATMUL_N ** 3 / ms / 1e9)
        except Exception as e:  # noqa: BLE001 -- e.g. out of shared memory: recorded, not fatal
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        mm.append(row)
    t = time.perf_counter()
    _, cfg = primer.matmul_tuned(a, b)
    torch.cuda.synchronize()
    tune_s = time.perf_counter() - t
    ms = _common.bench(lambda: primer.matmul_tuned(a, b))
    tuned = dict(config=dict(**cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages), ms=ms,
                 tflops=2 * MATMUL_N ** 3 / ms / 1e9, first_call_s=tune_s)
    torch_ms = _common.bench(lambda: a @ b)
    return dict(softmax=dict(shape=list(SOFTMAX_SHAPE), dtype="float16", rows=soft),
                matmul=dict(n=MATMUL_N, dtype="float16", rows=mm, autotuned=tuned, torch_ms=torch_ms,
                            torch_tflops=2 * MATMUL_N ** 3 / torch_ms / 1e9))


def main(argv=None) -> int:
    ap = results_parser(__doc__)
    ap.add_argument("--ncu-region", action="store_true", help="run only the softmax once per num_warps in 4, 16 "
                    "between cudaProfilerStart/Stop (under ncu --profile-from-start off)")
    ap.add_argument("--torch-profile", metavar="PATH", help="without ncu: write torch.profiler's table of the same "
                    "softmax launches to PATH")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_primer needs a CUDA GPU; nothing run.")
        return 0
    if args.ncu_region:
        xs = torch.randn(*SOFTMAX_SHAPE, device="cuda", dtype=torch.float16)
        _common.profile_once([lambda: primer.softmax_rows(xs, num_warps=4),
                              lambda: primer.softmax_rows(xs, num_warps=16)])
        return 0
    if args.torch_profile:
        xs = torch.randn(*SOFTMAX_SHAPE, device="cuda", dtype=torch.float16)
        for nw in (4, 16):
            primer.softmax_rows(xs, num_warps=nw)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for nw in (4, 16):
                primer.softmax_rows(xs, num_warps=nw)
            torch.cuda.synchronize()
        with open(args.torch_profile, "w") as f:
            f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10) + "\n")
        return 0
    t0 = time.time()
    doc = dict(meta=_common.run_meta(script="benchmarks.course.bench_primer"))
    doc["first_call"] = first_call()
    doc["checks"] = checks()
    print(f"[{time.time() - t0:5.1f} s] checks: {sum(r['ok'] for r in doc['checks'])}/{len(doc['checks'])} ok",
          flush=True)
    doc["timers"] = timers()
    w = workloads()
    xa, ya = torch.randn(ADD_SMALL, device="cuda"), torch.randn(ADD_SMALL, device="cuda")
    small = lambda: primer.add(xa, ya)  # noqa: E731
    doc["noise"] = dict(kernel="add", n=ADD_SMALL, do_bench_ms=[_common.bench(small) for _ in range(10)])
    fns = {k: v[0] for k, v in w.items() if not k.startswith("_")}
    doc["rounds"] = dict(rounds=_common.rotated_rounds(fns, 6, _common.bench),
                         bytes={k: v[1] for k, v in w.items() if not k.startswith("_")},
                         flops={k: v[2] for k, v in w.items() if not k.startswith("_")})
    print(f"[{time.time() - t0:5.1f} s] timers, noise, rounds", flush=True)
    doc["sweeps"] = sweeps(w)
    doc["ceilings"] = dict(copy_bytes_per_s=_common.copy_bandwidth(1 << 30),
                           torch_bf16_matmul_tflops=_common.matmul_tflops(8192))
    doc["meta"]["seconds"] = round(time.time() - t0, 1)
    path = write_json(args.out, f"{_common.gpu_tag()}-primer.json", doc)
    t = doc["timers"]
    print(f"[{time.time() - t0:5.1f} s] wrote {path}")
    for k in ("small", "large"):
        print(k, {m: round(v, 4) for m, v in t[k].items() if m.endswith("_ms")})
    print("copy GB/s", doc["ceilings"]["copy_bytes_per_s"] / 1e9, "bad checks",
          [r for r in doc["checks"] if not r["ok"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
