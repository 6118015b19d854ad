"""CPU benchmark: naive NumPy attention vs tiled FlashAttention-2 in NumPy (docs/design.md §7, NumPy bar).

For N in {512, 1024, 2048, 4096}, d = 64, ONE head (q, k, v of shape (N, d), float32, standard normal), it
times forward and backward (median of ``--reps`` runs, default 7, after one warm-up) and measures the peak traced
allocation (``tracemalloc``, one separate untimed run) of:

* naive: ``reference.numpy.attention.attention`` / ``attention_backward`` (materialise S and P, N x N);
* tiled: ``reference.numpy.flash.flash_attention_forward`` / ``flash_attention_backward`` with the default
  tiles (docs/design.md §4) 64 x 64 and with larger 128 x 128 tiles (fewer Python-level iterations per FLOP).

The whole sweep runs once per BLAS thread setting (``--threads``, default: the library default and 1), because
on a small shared machine multi-threaded OpenBLAS on many small matmuls can be slowed badly by other load.
It also runs a small tile sweep at the largest N. Functions are timed interleaved (each repetition runs all
of them in turn) so that load from other processes skews the ratios as little as possible. Results go to ``benchmarks/results/cpu-numpy.json`` and
``benchmarks/results/cpu-numpy.png``; a table with the docs/design.md §7 verdicts is printed:

    tiled forward at N=4096, d=64 takes <= 3x the time of naive attention and <= 1/10 of its peak memory.

Run: ``make bench-cpu`` or ``python -m benchmarks.course.cpu_numpy [--reps 5] [--causal] [--threads default,1]``.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import platform
import statistics
import time
import tracemalloc
from pathlib import Path

import numpy as np

from benchmarks import RESULTS
from reference.numpy.attention import attention, attention_backward
from reference.numpy.flash import flash_attention_backward, flash_attention_forward

NS = (512, 1024, 2048, 4096)
D = 64
TILES = ((64, 64), (128, 128))
SWEEP = ((32, 32), (64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128), (256, 256))


class Blas:
    """Get/set the thread count of NumPy's bundled OpenBLAS through ctypes (None where that is unavailable)."""

    def __init__(self):
        self.lib = self.get = self.set = None
        libdir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
        for path in sorted(glob.glob(str(libdir / "*openblas*"))):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for get, set_ in (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                              ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                              ("openblas_get_num_threads", "openblas_set_num_threads")):
                if hasattr(lib, get) and hasattr(lib, set_):
                    self.lib, self.get, self.set = lib, getattr(lib, get), getattr(lib, set_)
                    self.set.argtypes = [ctypes.c_int]
                    self.path = path
                    return

    def threads(self):
        return int(self.get()) if self.get else None

    def set_threads(self, n):
        if self.set is None:
            raise RuntimeError("cannot control BLAS threads here (no bundled OpenBLAS found)")
        self.set(int(n))


def timed_interleaved(fns, reps):
    """Median wall time of each function; the functions take turns within every repetition, so a burst of
    load from other processes hits all of them alike instead of one whole measurement (the ratios matter)."""
    for fn in fns.values():
        fn()  # warm-up
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def inputs(n, seed=0):
    rng = np.random.default_rng(seed + n)
    return [rng.standard_normal((n, D)).astype(np.float32) for _ in range(4)]


def run_case(n, causal, reps):
    q, k, v, do = inputs(n)
    o, lse = flash_attention_forward(q, k, v, causal=causal)
    fns = {
        "naive_fwd": lambda: attention(q, k, v, causal=causal, return_lse=True),
        "naive_bwd": lambda: attention_backward(q, k, v, do, causal=causal),
    }
    for bq, bk in TILES:
        fns[f"tiled{bq}x{bk}_fwd"] = lambda bq=bq, bk=bk: flash_attention_forward(
            q, k, v, causal=causal, block_q=bq, block_k=bk)
        fns[f"tiled{bq}x{bk}_bwd"] = lambda bq=bq, bk=bk: flash_attention_backward(
            q, k, v, o, lse, do, causal=causal, block_q=bq, block_k=bk)
    row = {"N": n}
    times = timed_interleaved(fns, reps)
    for name, ts in times.items():
        row[name + "_s"] = statistics.median(ts)
    for bq, bk in TILES:  # ratio within each repetition (adjacent in time), then the median: robust to load
        for what in ("fwd", "bwd"):
            row[f"tiled{bq}x{bk}_{what}_ratio_median"] = statistics.median(
                t / n_ for t, n_ in zip(times[f"tiled{bq}x{bk}_{what}"], times[f"naive_{what}"]))
    for name, fn in fns.items():
        row[name + "_peak_bytes"] = peak_bytes(fn)
    return row


def tile_sweep(n, causal, reps):
    q, k, v, _ = inputs(n)
    fns = {"naive": lambda: attention(q, k, v, causal=causal)}
    for bq, bk in SWEEP:
        fns[f"{bq}x{bk}"] = lambda bq=bq, bk=bk: flash_attention_forward(
            q, k, v, causal=causal, block_q=bq, block_k=bk)
    times = timed_interleaved(fns, reps)
    return {"N": n, **{f"{name}_fwd_s": statistics.median(ts) for name, ts in times.items()}}


def verdicts(row):
    out = {}
    for bq, bk in TILES:
        t = f"tiled{bq}x{bk}_fwd"
        tr = row[t + "_ratio_median"]
        mr = row[t + "_peak_bytes"] / row["naive_fwd_peak_bytes"]
        out[f"{bq}x{bk}"] = {"time_ratio": tr, "time_ratio_of_medians": row[t + "_s"] / row["naive_fwd_s"],
                             "mem_ratio": mr, "time_ok": tr <= 3.0, "mem_ok": mr <= 0.1}
    return out


def print_table(rows, label):
    print(f"\n== {label} ==")
    hdr = (f"{'N':>5} | {'naive fwd':>9} {'t64 fwd':>8} {'t128 fwd':>8} | {'naive bwd':>9} {'t64 bwd':>8} "
           f"{'t128 bwd':>8} | {'naive MiB':>9} {'t64 MiB':>7} {'t128 MiB':>8} | {'bwd naive/t64 MiB':>17}")
    print(hdr)
    print("-" * len(hdr))
    mib = 2.0 ** 20
    for r in rows:
        print(f"{r['N']:>5} | {r['naive_fwd_s']*1e3:>7.1f}ms {r['tiled64x64_fwd_s']*1e3:>6.1f}ms "
              f"{r['tiled128x128_fwd_s']*1e3:>6.1f}ms | {r['naive_bwd_s']*1e3:>7.1f}ms "
              f"{r['tiled64x64_bwd_s']*1e3:>6.1f}ms {r['tiled128x128_bwd_s']*1e3:>6.1f}ms | "
              f"{r['naive_fwd_peak_bytes']/mib:>9.1f} {r['tiled64x64_fwd_peak_bytes']/mib:>7.2f} "
              f"{r['tiled128x128_fwd_peak_bytes']/mib:>8.2f} | "
              f"{r['naive_bwd_peak_bytes']/mib:>8.1f}/{r['tiled64x64_bwd_peak_bytes']/mib:<8.2f}")
    big = [r for r in rows if r["N"] == 4096]
    if big:
        for tiles, v in verdicts(big[0]).items():
            print(f"docs/design.md §7 bar, N=4096 d=64, tiles {tiles}: time {v['time_ratio']:.2f}x naive (median of "
                  f"per-repetition ratios; ratio of medians {v['time_ratio_of_medians']:.2f}x) "
                  f"({'PASS' if v['time_ok'] else 'FAIL'}, bar <= 3x), peak memory {v['mem_ratio']:.3f} of naive "
                  f"({'PASS' if v['mem_ok'] else 'FAIL'}, bar <= 0.1)")


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.6))
    styles = {"naive": ("tab:red", "o"), "tiled64x64": ("tab:blue", "s"), "tiled128x128": ("tab:green", "^")}
    dashes = ["-", "--", ":", "-."]
    for ri, run in enumerate(runs):
        ns = [r["N"] for r in run["rows"]]
        for key, (color, marker) in styles.items():
            lab = f"{key} ({run['label']})"
            for ax, what in ((axes[0], "fwd_s"), (axes[1], "bwd_s")):
                ax.plot(ns, [r[f"{key}_{what}"] * 1e3 for r in run["rows"]], dashes[ri % 4], color=color,
                        marker=marker, label=lab)
            if key != "naive":
                axes[2].plot(ns, [r[f"{key}_fwd_ratio_median"] for r in run["rows"]], dashes[ri % 4], color=color,
                             marker=marker, label=f"{key} forward ({run['label']})")
            if ri == 0:
                axes[3].plot(ns, [r[f"{key}_fwd_peak_bytes"] / 2**20 for r in run["rows"]], "-", color=color,
                             marker=marker, label=f"{key} forward")
    if runs:
        ns = [r["N"] for r in runs[0]["rows"]]
        axes[3].plot(ns, [n * n * 4 / 2**20 for n in ns], "k:", label="N x N float32")
        axes[2].axhline(3.0, color="k", ls=":", label="docs/design.md §7 bar (3x)")
        axes[2].axhline(1.0, color="gray", lw=0.8)
    for ax, title, ylabel in ((axes[0], "forward time", "ms (median)"), (axes[1], "backward time", "ms (median)"),
                              (axes[2], "tiled / naive forward time", "ratio (median over repetitions)"),
                              (axes[3], "forward peak traced memory", "MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N (d = 64, one head, float32)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("NumPy on CPU: naive attention vs tiled FlashAttention-2 (reference.numpy)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per measurement (median reported)")
    ap.add_argument("--causal", action="store_true", help="causal masking (default: full attention)")
    ap.add_argument("--threads", default="default,1",
                    help="comma list of BLAS thread counts to run the sweep with ('default' = library default)")
    ap.add_argument("--ns", default=",".join(map(str, NS)), help="comma list of sequence lengths")
    ap.add_argument("--out", default=str(RESULTS / "cpu-numpy.json"))
    args = ap.parse_args(argv)
    ns = [int(x) for x in args.ns.split(",")]

    blas = Blas()
    default_threads = blas.threads()
    info = {
        "machine": platform.machine(), "processor": platform.processor() or None, "platform": platform.platform(),
        "cpu_count": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
        "blas": getattr(blas, "path", None) and Path(blas.path).name, "blas_default_threads": default_threads,
        "env": {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
                if k in os.environ},
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    print("machine:", json.dumps(info))
    runs = []
    for spec in args.threads.split(","):
        spec = spec.strip()
        if spec != "default":
            if blas.set is None:
                print(f"skipping threads={spec}: BLAS threads cannot be controlled here")
                continue
            blas.set_threads(int(spec))
        elif default_threads is not None:
            blas.set_threads(default_threads)
        label = f"BLAS threads={blas.threads()}" if blas.get else "BLAS threads=library default"
        rows = [run_case(n, args.causal, args.reps) for n in ns]
        sweep = tile_sweep(max(ns), args.causal, max(3, args.reps // 2))
        run = {"label": label, "blas_threads": blas.threads(), "rows": rows, "tile_sweep": sweep,
               "verdicts_at_4096": verdicts(rows[-1]) if rows[-1]["N"] == 4096 else None,
               "loadavg_after": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
        runs.append(run)
        print_table(rows, f"{label}, {'causal' if args.causal else 'full'} attention, d={D}, 1 head, float32")
        best = min((k for k in sweep if k.endswith("_fwd_s") and k != "naive_fwd_s"), key=sweep.__getitem__)
        print(f"tile sweep at N={sweep['N']} (forward, median): naive {sweep['naive_fwd_s']*1e3:.1f} ms; "
              + ", ".join(f"{k[:-6]} {sweep[k]*1e3:.1f}" for k in sweep if k.endswith("_fwd_s")
                          and k != "naive_fwd_s") + f" ms; best {best[:-6]}")
    if default_threads is not None:
        blas.set_threads(default_threads)
    result = {"benchmark": "reference.numpy naive vs tiled FlashAttention-2, CPU", "d": D, "heads": 1,
              "dtype": "float32", "causal": args.causal, "reps": args.reps, "timing": "median wall time",
              "memory": "tracemalloc peak of one call", "machine": info, "runs": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(runs, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
