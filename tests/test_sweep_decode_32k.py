"""``benchmarks/tuning/sweep_decode_32k.py --smoke`` on the CPU (interpreter): both variants (the default configuration
and a two-level merge) passed their check against float64 attention and a repeated call (an error row otherwise),
and each fraction of copy is the K/V bytes over the median time and the copy bandwidth of the same run."""
from __future__ import annotations

from tests.common import run_smoke


def test_smoke_run_records_checked_rows(tmp_path):
    res = run_smoke("benchmarks.tuning.sweep_decode_32k", tmp_path, "smoke-decode-split-sweep.json")
    assert not [r for r in res["rows"] if "error" in r], res["rows"]
    assert [r["name"] for r in res["rows"]] == ["pin", "mr32_s8_g4"]
    assert res["rows"][1]["config"]["merge_group"] == 4
    for r in res["rows"]:
        assert r["rel_err_vs_float64"] < 2e-2
        assert abs(r["frac_copy_bw"] - res["kv_bytes"] / (r["ms_graph"] * 1e-3) / res["copy_bw_bytes_per_s"]) \
            < 1e-9 * r["frac_copy_bw"]
