"""What every benchmark measures the same way: the device tag of result file names, timing, relative error, copy
bandwidth, the matmul ceiling and the SDPA baselines.

One home, so that two benchmarks that quote the same quantity (the copy bandwidth of ``bench_attention`` and of
``bench_decode``; the cuDNN backward of ``bench_gluon_bwd`` and of ``tune_bwd_hopper``) measure it alike.
Importing this module needs torch but no GPU; each function that times something needs CUDA unless it says not.
"""
from __future__ import annotations

import re
import statistics
import time

import torch

from benchmarks import RESULTS, ROOT

__all__ = ["RESULTS", "ROOT", "bench", "check_row", "copy_bandwidth", "device_name", "gpu_tag", "graph_ms", "loop_ms",
           "lse_abs", "matmul_tflops", "ref64", "rel_err", "result_tag", "run_sections", "sdpa", "sdpa_bwd_timer",
           "start_run", "sync", "timestamped_log"]

# Vendor words dropped from a device name before its first word becomes the tag ("NVIDIA H100 80GB HBM3" -> h100).
_VENDOR_WORDS = ("NVIDIA", "TESLA", "GEFORCE")


def gpu_tag(name: str | None = None) -> str:
    """The ``<gpu>`` of ``benchmarks/results/<gpu>-<benchmark>.json``: ``'NVIDIA H100 80GB HBM3' -> 'h100'``,
    ``'NVIDIA H200' -> 'h200'``; ``'cpu'`` without CUDA. ``name`` defaults to the current CUDA device's name."""
    if name is None:
        if not torch.cuda.is_available():
            return "cpu"
        name = torch.cuda.get_device_name()
    if not isinstance(name, str):
        raise TypeError(f"name must be a device name string, got {type(name).__name__}")
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name) if w and w.upper() not in _VENDOR_WORDS]
    return (words[0] if words else "gpu").lower()


def result_tag(smoke: bool = False) -> str:
    """``gpu_tag()``, or ``'cpu-smoke'`` for a ``--smoke`` run (CPU, Triton interpreter, tiny shapes)."""
    return "cpu-smoke" if smoke else gpu_tag()


def device_name(smoke: bool = False) -> str:
    """The CUDA device's name for a results file's ``meta``; a ``--smoke`` run says so."""
    return "cpu (Triton interpreter, smoke test)" if smoke else torch.cuda.get_device_name()


def run_meta(smoke: bool = False, **extra) -> dict:
    """A results file's ``meta``: the device (``device_name``), the torch and Triton versions and the date, then
    ``extra`` (a script's own fields)."""
    import triton
    return dict(gpu=device_name(smoke), torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d %H:%M:%S"), **extra)


def start_run(script: str, smoke: bool, out_dir: str, body) -> int:
    """The start of a course benchmark's ``main``: returns 0 (after saying so) when ``script`` is asked for a GPU
    run where there is none (or under ``TRITON_INTERPRET=1``, where the full shapes would take hours), else
    creates ``out_dir`` and returns ``body(t0, log)``, ``log`` stamping seconds since ``t0``."""
    import os

    from reference.triton import INTERPRET
    if not smoke and (INTERPRET or not torch.cuda.is_available()):
        print(f"{script} needs a CUDA GPU; nothing run (try --smoke).")
        return 0
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.time()
    return body(t0, timestamped_log(t0)[0])


def sync() -> None:
    """Wait for the GPU (no-op without CUDA), so a host clock read after it covers the kernels before it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench(fn, *, warmup: int = 25, rep: int = 100, grad_to_none=None, wall: bool = False) -> float:
    """Median milliseconds of ``fn()`` by ``triton.testing.do_bench`` (CUDA events; ``warmup``/``rep`` in ms).

    ``wall=True`` (a CPU plumbing run under the Triton interpreter, where do_bench has no device to time) calls
    ``fn`` once and returns its wall-clock milliseconds."""
    if wall:
        t = time.perf_counter()
        fn()
        sync()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench
    return do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none, return_mode="median")


def rotated_rounds(fns: dict, rounds: int, timer, first_shift: int = 0) -> dict:
    """``{name: [ms of each round]}``: each of ``fns`` timed by ``timer(fn)`` once per round for ``rounds`` rounds,
    alternately in the listed and the reversed order, each rotated by one more place every second round (starting
    ``first_shift`` places in). A kernel timed right after another heavy one can run a few percent slower and the
    H100's clock drifts over a long run: with ``2 len(fns)`` rounds every implementation is timed twice in every
    position and behind at least two different ones (a rotation alone keeps each behind the same one: an
    FP8 kernel timed behind the bf16 forward in 4 of 5 rounds was 7-16% slower in those rounds)."""
    names = list(fns)
    ms = {n: [] for n in names}
    for i in range(rounds if names else 0):
        order = names if i % 2 == 0 else names[::-1]
        shift = (first_shift + i // 2) % len(names)
        for n in order[shift:] + order[:shift]:
            ms[n].append(timer(fns[n]))
    return ms


def checked_rounds(fns: dict, flops: float, ref=None, *, rounds: int, timer, rel=None, err_chars: int = 300,
                   skip=None, tol=None) -> dict:
    """Each of ``fns`` run once (its error ``rel(out, ref)`` as ``rel_vs_cudnn`` when ``ref`` is given; an exception
    is the row's ``error``, its last ``err_chars`` characters), then those that ran timed by ``rotated_rounds``:
    per name the median ``ms``, ``tflops = flops / ms / 1e9`` and ``rounds_ms``. ``skip`` (name -> why) and an
    error not below ``tol`` leave a row untimed, with ``error`` saying why."""
    rel = rel_err if rel is None else rel
    out = {n: {"error": f"not timed: {why}"} for n, why in (skip or {}).items() if n in fns}
    for n, fn in fns.items():
        if n in out:
            continue
        try:
            o = fn()
            o = o[0] if isinstance(o, tuple) else o
            out[n] = {"rel_vs_cudnn": rel(o, ref) if ref is not None else None}
            if tol is not None and ref is not None and not out[n]["rel_vs_cudnn"] < tol:   # NaN is not within it
                out[n]["error"] = f"not timed: {out[n]['rel_vs_cudnn']:.3g} from the reference (bound {tol})"
        except Exception as e:  # noqa: BLE001 - a failing implementation is a row, the others still run
            out[n] = {"error": f"{type(e).__name__}: {str(e)[-err_chars:]}"}
    sync()
    ms = rotated_rounds({n: f for n, f in fns.items() if "error" not in out[n]}, rounds, timer)
    for n, times in ms.items():
        m = statistics.median(times)
        out[n].update(ms=m, tflops=flops / m / 1e9, rounds_ms=times)
    return out


def both_ways(fns: dict, rounds: int, timer) -> tuple[dict, list]:
    """``_common.rotated_rounds`` for ``rounds // 2`` rounds in the listed order and ``rounds - rounds // 2`` in the
    reversed one, so each implementation is timed behind two different ones (a rotation alone keeps the cyclic
    order: in a key-loop run the default followed the bf16 forward in 4 of 5 rounds and was 7-16% slower
    there than in the fifth in 5 of 6 shapes). Returns ``({name: [ms per round]}, [the order of each round])``."""
    names = list(fns)
    half = rounds // 2
    ms = {n: [] for n in names}
    orders = []
    for order, k in ((names, half), (names[::-1], rounds - half)):
        got = rotated_rounds({n: fns[n] for n in order}, k, timer)
        for n in names:
            ms[n] += got[n]
        orders += [order[i % len(order):] + order[:i % len(order)] for i in range(k)]
    return ms, orders


def hopper_bench(fn) -> float:
    """Median ms, do_bench(warmup=10 ms, rep=40 ms): the convention of the Hopper benchmarks' results."""
    return bench(fn, warmup=10, rep=40)


def graph_ms(fns, reps: int = 20, *, smoke: bool = False) -> float:
    """GPU time per call (ms): capture all closures (one per input set) in one CUDA graph, median of replays.

    No host launch overhead is included (as in a serving engine that replays its decode step as a graph), and
    rotating over input sets larger than L2 keeps the K/V reads coming from HBM. ``smoke``: one wall-clock call
    of ``fns[0]`` (no CUDA)."""
    if smoke:
        return bench(fns[0], wall=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / len(fns))
    del g
    return sorted(times)[len(times) // 2]


def loop_ms(fn, n: int = 200, *, warmup: int = 20, smoke: bool = False) -> float:
    """Wall milliseconds per call of ``n`` back-to-back eager calls after ``warmup`` (what a Python serving loop
    sees: host launch overhead included); ``smoke``: 3 warm-up calls and 2 timed."""
    for _ in range(3 if smoke else warmup):
        fn()
    sync()
    n = 2 if smoke else n
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t) / n * 1e3


def rel_err(a, b) -> float:
    """``||a - b||_2 / ||b||_2`` over all elements, computed in float64 (``b`` is the reference)."""
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def lse_abs(a, b) -> float:
    """Largest ``|a - b|`` over the finite entries of the reference log-sum-exp ``b``; ``inf`` when ``a`` is finite
    where ``b`` is not (or the reverse): a row that may attend no key must give ``-inf`` (docs/design.md §3)."""
    fin = torch.isfinite(b)
    if not torch.equal(fin, torch.isfinite(a)):
        return float("inf")
    return float((a.double() - b.double())[fin].abs().max()) if fin.any() else 0.0


def ref64(q, k, v, causal):
    """float64 ``(o, lse)`` of ``(B, H, N, d)`` inputs on their device: bottom-right causal (docs/design.md §3),
    GQA by repeating the K/V heads, rows that see no key give 0 / -inf."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    nq, nk = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    return p @ v, lse


def copy_bandwidth(nbytes: int = 1 << 30, device: str = "cuda", wall: bool = False) -> float:
    """Bytes read plus bytes written per second by a device-to-device copy of ``nbytes`` (bf16): the memory
    roofline that the decode benchmarks divide their KV bytes by."""
    if not isinstance(nbytes, int) or nbytes < 2:
        raise ValueError(f"nbytes must be an int >= 2, got {nbytes!r}")
    x = torch.randn(nbytes // 2, device=device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x), wall=wall)
    moved = 2 * x.numel() * x.element_size()
    del x, y
    return moved / (ms * 1e-3)


def matmul_tflops(n: int = 8192, dtype=torch.bfloat16) -> float:
    """Dense ``n x n`` matmul TFLOP/s (``2 n^3`` FLOPs per product): the compute ceiling of the attention tables."""
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    return 2 * n ** 3 / bench(lambda: a @ b) / 1e9


def sdpa(backend):
    """``run(q, k, v, causal)``: ``torch.nn.functional.scaled_dot_product_attention`` forced to ``backend``
    (an ``SDPBackend``: FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION, MATH)."""
    from torch.nn.attention import sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def run(q, k, v, causal):
        with sdpa_kernel(backend):
            return scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def profile_once(runs) -> None:
    """ncu's profiled region (run under ``ncu --profile-from-start off``): each of ``runs`` (zero-argument
    callables) once to warm up (compilation and autotuning stay outside the region), then each once between
    ``cudaProfilerStart`` and ``cudaProfilerStop``; all under ``torch.no_grad()``."""
    with torch.no_grad():
        for fn in runs:
            fn()
        for fn in runs:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            fn()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()


def cuda_trace(fn, reps: int = 20):
    """A ``torch.profiler`` trace (CUDA activity) of ``reps`` eager calls of ``fn`` after one warm-up call."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return prof


def kernel_us(fn, reps: int = 20) -> dict:
    """Per-kernel GPU time of ``fn`` (``cuda_trace``): ``{kernel name (60 chars): mean microseconds}`` over
    ``reps`` eager calls after one warm-up call, kernels that took device time only."""
    return {e.key[:60]: round(e.device_time_total / e.count, 2) for e in cuda_trace(fn, reps).key_averages()
            if e.device_time_total > 0}


def profile_top(fn, n: int = 300, top: int = 14) -> list:
    """``cProfile`` over ``n`` calls of ``fn``: the ``top`` functions by own host time, per call (us; cProfile's
    own overhead inflates functions with many small calls, so read it for the ranking)."""
    import cProfile
    import io
    import os
    import pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in st.stats.items():
        rows.append(dict(fn=f"{os.path.basename(file)}:{line}:{name}", calls_per_call=nc / n,
                         own_us_per_call=tt / n * 1e6, cum_us_per_call=ct / n * 1e6))
    rows.sort(key=lambda r: -r["own_us_per_call"])
    return [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()} for r in rows[:top]]


def sdpa_bwd_timer(backend, q, k, v, do, causal):
    """A zero-argument callable that runs SDPA's backward (``backend``) for ``do`` once per call; the forward
    runs once here, outside what is timed."""
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = sdpa(backend)(qg, kg, vg, causal)
    return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)


def check_row(row: dict, fill) -> dict:
    """Run one correctness check: ``fill(row)`` records the errors and ``row["ok"]``; an exception (a kernel that
    fails to compile or launch) records ``row["error"]`` and ``ok = False`` instead of ending the benchmark."""
    try:
        fill(row)
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
        row["ok"] = False
    return row


def timestamped_log(t0: float):
    """``(log, lines)``: ``log(s)`` prints ``s`` stamped with the seconds since ``t0`` and keeps it in ``lines``."""
    lines = []

    def log(s):
        s = f"[{time.time() - t0:6.1f}s] {s}"
        print(s, flush=True)
        lines.append(s)
    return log, lines



def run_sections(sections: dict, names: str, out: dict, path: str, log, t0: float) -> dict:
    """Run ``sections[name]()`` for each comma-separated name in ``names`` into ``out[name]``, rewriting ``path``
    (JSON) after each, so a run cut short keeps what it measured. A section that raises is recorded in
    ``out["failed"]`` and the others still run. A name that is no section raises before anything runs. Returns
    ``out``."""
    import json
    unknown = [n for n in names.split(",") if n not in sections]
    if unknown:
        raise ValueError(f"--sections: unknown section(s) {', '.join(unknown)}; expected a comma-separated list of "
                         f"{', '.join(sections)}")
    for name in names.split(","):
        log(f"== {name}")
        try:
            out[name] = sections[name]()
        except Exception as exc:  # noqa: BLE001 - keep the other sections' numbers
            out.setdefault("failed", {})[name] = repr(exc)[:500]
            log(f"  {name} FAILED: {exc!r}"[:600])
        out.setdefault("meta", {})["seconds"] = time.time() - t0
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    return out


def host_us(fn, n: int = 20, *, warm: bool = True) -> float:
    """Host time per eager call (us): ``n`` calls of ``fn`` issued while a sleep kernel holds the GPU (~100 ms),
    so the wall time is the Python and launch cost alone, not the GPU's. ``warm``: one call (and a sync) first."""
    if warm:
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / n * 1e6
