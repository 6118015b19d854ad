"""``benchmarks/tuning/ncu_gluon_train.py`` off the GPU: its per-step summary of an ncu CSV (run as a script, as on
the device), and its bad-argument message. The profiling itself needs ncu and a Hopper GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _csv(kernels) -> str:
    """An ``ncu --csv --page details`` file: a preamble, then one row per (kernel, metric)."""
    rows = ['==PROF== Connected to process 1', '"ID","Kernel Name","Block Size","Grid Size","Section Name",'
            '"Metric Name","Metric Unit","Metric Value"']
    for i, (name, dur_ns, tensor_pct) in enumerate(kernels):
        for metric, value in (("Duration", f"{dur_ns:,.0f}"),
                              ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                               f"{tensor_pct}")):
            rows.append(f'"{i}","{name}","(384, 1, 1)","(132, 1, 1)","S","{metric}","u","{value}"')
    return "\n".join(rows) + "\n"


def _summarize(tmp_path, kernels) -> dict:
    path = tmp_path / "k.csv"
    path.write_text(_csv(kernels))
    out = subprocess.run([sys.executable, "-m", "benchmarks.tuning.ncu_gluon_train", "--summarize", str(path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_step_summary_sums_the_kernels_and_weights_the_tensor_pipe(tmp_path):
    rng = np.random.default_rng()
    kernels = [(f"k{i}", float(d), round(float(t), 2)) for i, (d, t) in
               enumerate(zip(rng.integers(1_000, 5_000_000, 4), rng.uniform(0, 90, 4)))]
    got = _summarize(tmp_path, kernels)
    durs = np.array([d for _, d, _ in kernels])
    pct = np.array([t for _, _, t in kernels])
    assert got["step"]["kernels"] == 4 and len(got["kernels"]) == 4
    assert abs(got["step"]["duration_us"] - durs.sum() / 1e3) < 1e-6 * durs.sum()
    assert abs(got["step"]["tensor_pipe_active_pct_weighted"] - (durs * pct).sum() / durs.sum()) < 1e-6
    assert got["step"]["largest"] == kernels[int(durs.argmax())][0]
    assert abs(got["step"]["largest_share"] - durs.max() / durs.sum()) < 1e-9


def test_a_bad_implementation_is_named():
    out = subprocess.run([sys.executable, "-m", "benchmarks.tuning.ncu_gluon_train", "--profile", "flash", "[]"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--profile IMPL" in out.stderr


def test_a_bad_row_set_is_named():
    out = subprocess.run([sys.executable, "-m", "benchmarks.tuning.ncu_gluon_train", "--rows", "slow"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--rows" in out.stderr and "below" in out.stderr
