"""``benchmarks/tuning/probe_read_ceiling.py --smoke`` on the CPU (interpreter): every variant ran and passed its
check against torch (a stream kernel whose sums were off would record an error row), and the fractions are the
bytes read over the copy bandwidth measured in the same run."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_smoke_run_records_checked_rows(tmp_path):
    out = subprocess.run([sys.executable, "-m", "benchmarks.tuning.probe_read_ceiling", "--smoke", "--out",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads((tmp_path / "smoke-read-ceiling-probe.json").read_text())
    names = [r["name"] for r in res["rows"]]
    assert not [r for r in res["rows"] if "error" in r], res["rows"]
    assert any(n.startswith("stream") for n in names) and "torch.sum (one tensor, float32)" in names
    for r in res["rows"]:
        assert abs(r["frac_copy_bw"] - res["kv_bytes"] / (r["ms_graph"] * 1e-3) / res["copy_bw_bytes_per_s"]) \
            < 1e-9 * r["frac_copy_bw"]
