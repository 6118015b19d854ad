"""The staged benchmark runner (``benchmarks/_staged.py``, run through its CPU smoke): a stage's limit counts run
time only, so compilations longer than the limit (on a freshly started machine) do not stop it, while a hang
does; a stopped or crashed stage keeps the items it finished and names the one it was on."""
from __future__ import annotations

from tests.common import run_smoke


def test_compilation_is_not_run_time_and_a_hang_names_what_it_was_checking(tmp_path):
    res = run_smoke("benchmarks._staged", tmp_path, "smoke-staged.json")
    limit, compile_s = res["limit_s"], res["compile_s"]
    assert compile_s > limit
    # two compilations, one of them in a process the stage started, each longer than the whole limit
    assert res["compile_slowly"] == {"ok": True}
    assert res["stage_compile"]["compile_slowly"]["compiles"] == 2
    assert res["stage_compile"]["compile_slowly"]["compile_seconds"] >= 2 * compile_s * 0.95
    assert res["stage_seconds"]["compile_slowly"] > 2 * compile_s
    # a hang is stopped after the limit, with the finished item and the one it was on
    hang = res["hang"]
    assert "timed out" in hang["error"] and hang["rc"] != 0
    assert hang["running"] == "config_b" and hang["partial"] == [{"config": "config_a", "ok": True}]
    assert limit <= res["stage_seconds"]["hang"] < limit + 20
    crash = res["crash"]
    assert crash["rc"] == 3 and crash["partial"] == [{"config": "config_a", "ok": True}] and "running" not in crash
