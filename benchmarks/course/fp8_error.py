"""FP8 attention error with and without a random Hadamard rotation (lecture 6 section 3; FA3 paper section 4.3,
Table 3; talk slide 24's "2.6x"), on the CPU: writes ``benchmarks/results/cpu-fp8-error.json``.

``reference.simulators.fp8_error.fp8_incoherent_experiment`` (e4m3 rounding by ``torch.float8_e4m3fn``,
per-tensor scale, d = 128, N(0, 1) entries plus 0.1% outliers of N(0, 10^2), softmax in float64), two runs:

* ``lecture``: the lecture's cell, one head per length N = 512 ... 4096 drawn in order from
  ``default_rng(6)`` (the numbers the lecture prints);
* ``draws``: N = 4096 and 8192, one head each from ``default_rng(seed)`` for ``SEEDS`` (the spread of the
  reduction and how it grows with N).

    python3 -m benchmarks.course.fp8_error [--out benchmarks/results]      # CPU only, one to two minutes
"""
from __future__ import annotations

import sys
import time

import numpy as np

from benchmarks import run_and_write
from reference.simulators.fp8_error import fp8_incoherent_experiment

LECTURE_SEED, LECTURE_NS = 6, (512, 1024, 2048, 4096)
DRAWS_NS, SEEDS = (4096, 8192), tuple(range(12))
KEYS = ("s_plain", "s_hadamard", "s_ratio", "o_plain", "o_hadamard", "o_ratio")


def run() -> dict:
    t0 = time.time()
    rng = np.random.default_rng(LECTURE_SEED)
    lecture = []
    for n in LECTURE_NS:
        r = fp8_incoherent_experiment(rng, n=n, d=128, n_heads=1)
        lecture.append({"n": n, **{k: r[k] for k in KEYS}})
    draws, summary = [], {}
    for n in DRAWS_NS:
        for seed in SEEDS:
            r = fp8_incoherent_experiment(np.random.default_rng(seed), n=n, d=128, n_heads=1)
            draws.append({"seed": seed, "n": n, **{k: r[k] for k in KEYS}})
        ratios = [x["o_ratio"] for x in draws if x["n"] == n]
        summary[str(n)] = {"o_ratio_min": min(ratios), "o_ratio_max": max(ratios),
                           "o_ratio_mean": float(np.mean(ratios)), "draws": len(ratios)}
    return {"gpu": "cpu", "setup": {"d": 128, "outlier_frac": 1e-3, "outlier_std": 10.0, "scale": "per-tensor",
                                    "format": "e4m3", "lecture_seed": LECTURE_SEED},
            "lecture": lecture, "draws": draws,
            "draws_summary": summary,
            "seconds": round(time.time() - t0, 1)}


def report(res, out) -> None:
    """Print the per-N range of the error reduction."""
    for n, s in res["draws_summary"].items():
        print(f"O error reduction at N = {n}: {s['o_ratio_min']:.2f}-{s['o_ratio_max']:.2f}x "
              f"(mean {s['o_ratio_mean']:.2f}x over {s['draws']} draws)")


def main(argv=None) -> int:
    return run_and_write(__doc__, "cpu-fp8-error.json", run, report, argv)


if __name__ == "__main__":
    sys.exit(main())
