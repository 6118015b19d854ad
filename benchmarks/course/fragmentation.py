"""Run the KV-cache fragmentation simulator (reference.simulators.fragmentation) on the default workload and write
benchmarks/results/cpu-fragmentation.json and cpu-fragmentation.png.

Workload: 1000 ShareGPT-like requests (lognormal, mean prompt 161 / output 338 tokens, max 2048), seeds 0-2,
served from a 40 GB pool of OPT-13B KV slots (800 KiB per token: 48,828 slots). CPU only, ~10 s.

    python -m benchmarks.course.fragmentation [--out benchmarks/results]
"""
from __future__ import annotations

import os
import sys

import numpy as np

from benchmarks import run_and_write
from reference.simulators.fragmentation import (CATEGORIES, DEFAULT_POOL_TOKENS, KV_BYTES_PER_TOKEN_13B,
                                                make_requests, simulate)

BLOCKS = (1, 2, 4, 8, 16, 32, 64)
CONTIGUOUS = ("static", "pow2", "oracle")
SEEDS = (0, 1, 2)
N_REQUESTS = 1000


def run() -> dict:
    runs = {}
    for seed in SEEDS:
        reqs = make_requests(N_REQUESTS, seed=seed)
        for pol in CONTIGUOUS:
            runs.setdefault(pol, []).append(simulate(reqs, pol).as_dict())
        for b in BLOCKS:
            runs.setdefault(f"paged_{b}", []).append(simulate(reqs, "paged", block_size=b).as_dict())
    keys = ("utilisation", "utilisation_of_allocated", "mean_concurrency", "max_concurrency",
            "mean_waste_per_seq", "max_waste_per_seq", "preemptions", "steps")
    summary = {}
    for name, rs in runs.items():
        s = {k: float(np.mean([r[k] for r in rs])) for k in keys}
        s["utilisation_std"] = float(np.std([r["utilisation"] for r in rs]))
        s["max_waste_per_seq"] = int(max(r["max_waste_per_seq"] for r in rs))
        s["breakdown"] = {c: float(np.mean([r["breakdown"][c] for r in rs])) for c in CATEGORIES}
        summary[name] = s
    return {
        "note": "Simulated with reference.simulators.fragmentation (python -m benchmarks.course.fragmentation); fractions are of the "
                "whole KV pool, averaged over the steps where requests were waiting, mean over seeds.",
        "workload": {"n_requests": N_REQUESTS, "seeds": list(SEEDS), "prompt_mean": 161.0, "output_mean": 338.0,
                     "sigma": 1.0, "max_seq_len": 2048},
        "pool": {"pool_tokens": DEFAULT_POOL_TOKENS, "bytes_per_token": KV_BYTES_PER_TOKEN_13B,
                 "pool_bytes": DEFAULT_POOL_TOKENS * KV_BYTES_PER_TOKEN_13B,
                 "model": "OPT-13B: 2 x 40 layers x 5120 x fp16 = 800 KiB/token; 40 GB pool"},
        "seeds_claims": {"static_utilisation_range": [0.20, 0.40], "paged_waste_per_seq_below": "block_size"},
        "summary": summary,
        "runs": runs,
    }


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["summary"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    paged_u = [s[f"paged_{b}"]["utilisation"] * 100 for b in BLOCKS]
    paged_a = [s[f"paged_{b}"]["utilisation_of_allocated"] * 100 for b in BLOCKS]
    ax1.plot(BLOCKS, paged_u, "o-", label="paged: token states / pool")
    ax1.plot(BLOCKS, paged_a, "s--", ms=4, label="paged: token states / allocated")
    styles = {"static": ("tab:red", "static (max_seq_len)"), "pow2": ("tab:orange", "contiguous, pow2"),
              "oracle": ("tab:green", "contiguous, exact length")}
    for pol, (col, lab) in styles.items():
        ax1.axhline(s[pol]["utilisation"] * 100, color=col, ls=":", label=f"{lab}: {s[pol]['utilisation']:.0%}")
    ax1.axhspan(20, 40, color="grey", alpha=0.12, label="seeds: 20-40 %")
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(BLOCKS, [str(b) for b in BLOCKS])
    ax1.set_ylim(0, 102)
    ax1.set_xlabel("block size (tokens)")
    ax1.set_ylabel("KV memory holding real tokens (%)")
    ax1.set_title("KV-cache utilisation")
    ax1.legend(fontsize=7.5, loc="center right", bbox_to_anchor=(1.0, 0.7))
    ax2.plot(BLOCKS, [s[f"paged_{b}"]["mean_concurrency"] for b in BLOCKS], "o-", label="paged")
    for pol, (col, lab) in styles.items():
        ax2.axhline(s[pol]["mean_concurrency"], color=col, ls=":", label=lab)
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(BLOCKS, [str(b) for b in BLOCKS])
    ax2.set_ylim(0, None)
    ax2.set_xlabel("block size (tokens)")
    ax2.set_ylabel("requests running at once (mean)")
    ax2.set_title(f"Batch size in a {result['pool']['pool_bytes'] / 1e9:.0f} GB pool (13B model)")
    ax2.legend(fontsize=7.5, loc="center right", bbox_to_anchor=(1.0, 0.62))
    fig.suptitle(f"{result['workload']['n_requests']} ShareGPT-like requests, seeds {result['workload']['seeds']}"
                 " (simulated)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(result, out) -> None:
    """Plot ``cpu-fragmentation.png`` into ``out`` and print the per-policy table."""
    plot(result, os.path.join(out, "cpu-fragmentation.png"))
    print(f"{'policy':<10}{'util':>7}{'of alloc':>10}{'running':>9}{'waste/seq':>11}{'max waste':>11}{'preempt':>9}")
    for name, r in result["summary"].items():
        print(f"{name:<10}{r['utilisation']:7.1%}{r['utilisation_of_allocated']:10.1%}{r['mean_concurrency']:9.1f}"
              f"{r['mean_waste_per_seq']:11.1f}{r['max_waste_per_seq']:11d}{r['preemptions']:9.0f}")
    print(f"wrote {os.path.join(out, 'cpu-fragmentation.png')}")


def main(argv=None) -> int:
    return run_and_write(__doc__, "cpu-fragmentation.json", run, report, argv)


if __name__ == "__main__":
    sys.exit(main())
