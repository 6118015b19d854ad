"""``benchmarks/tuning/probe_read_ceiling.py --smoke`` on the CPU (interpreter): every variant ran and passed its
check against torch (a stream kernel whose sums were off would record an error row), and the fractions are the
bytes read over the copy bandwidth measured in the same run."""
from __future__ import annotations

from tests.common import run_smoke


def test_smoke_run_records_checked_rows(tmp_path):
    res = run_smoke("benchmarks.tuning.probe_read_ceiling", tmp_path, "smoke-read-ceiling-probe.json")
    names = [r["name"] for r in res["rows"]]
    assert not [r for r in res["rows"] if "error" in r], res["rows"]
    assert any(n.startswith("stream") for n in names) and "torch.sum (one tensor, float32)" in names
    for r in res["rows"]:
        assert abs(r["frac_copy_bw"] - res["kv_bytes"] / (r["ms_graph"] * 1e-3) / res["copy_bw_bytes_per_s"]) \
            < 1e-9 * r["frac_copy_bw"]
