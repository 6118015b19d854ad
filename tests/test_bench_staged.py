"""The staged benchmark runner (``benchmarks/_staged.py``, run through ``benchmarks/staged_smoke.py``): a stage's
limit counts run time only, so compilations longer than the limit (on a freshly started machine) do not stop
it, while a hang does; a stopped or crashed stage keeps the items it finished and names the one it was on.
And ``bench_fp8_gluon``'s use of it: a check that fails or runs out of time is named, and the bench times only
what passed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.common import run_smoke


def test_compilation_is_not_run_time_and_a_hang_names_what_it_was_checking(tmp_path):
    res = run_smoke("benchmarks.staged_smoke", tmp_path, "smoke-staged.json")
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


FP8_GATE = """
import json
from benchmarks.course import bench_fp8_gluon as b
configs = b.check_configs()
res = {"check:pinned": [{"config": "pinned", "shape": [1], "causal": False, "ok": True}],
       "check:hadamard": {"error": "timed out after 120 s of run time (deadlock?)", "running": "hadamard shape=[2]",
                          "partial": [{"config": "hadamard", "shape": [1], "causal": True, "ok": True}]},
       "check:plain_keys": [{"config": "plain_keys", "shape": [3], "causal": True, "ok": False},
                            {"config": "plain_keys", "shape": [4], "causal": True, "ok": True}],
       "check:" + configs[3]: {"error": "Traceback (most recent call last):\\nRuntimeError: boom", "rc": 1}}
failed = b.collect_checks(res, list(res))
plan = b.variant_plan(set(failed))
print(json.dumps({"configs": configs, "failed": failed, "rows": len(res["check"]), "keys": sorted(res),
                  "plan": plan, "all_pass": b.variant_plan(set()), "variants": b.VARIANTS,
                  "schedules": b.SCHEDULES}))
"""


def test_fp8_gluon_check_names_what_failed_and_the_bench_times_only_what_passed():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", FP8_GATE], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    configs, failed = got["configs"], got["failed"]
    assert configs[:3] == ["pinned", "hadamard", "plain_keys"] and len(configs) == 3 + len(got["schedules"])
    # the rows of every check (a stopped stage's finished rows too) stay in one list, the stage keys go
    assert got["rows"] == 4 and got["keys"] == ["check", "check_failed"]
    assert set(failed) == {"hadamard", "plain_keys", configs[3]}
    assert "timed out" in failed["hadamard"] and "hadamard shape=[2]" in failed["hadamard"]
    assert "1 of 2" in failed["plain_keys"] and "shape=[3]" in failed["plain_keys"]
    assert failed[configs[3]] == "RuntimeError: boom"
    # every variant needs the pinned kernel; one that needs a failed configuration is not timed, the others are
    plan = got["plan"]
    assert len(plan) == len(got["variants"]) and all("pinned" in v["need"] for v in plan)
    for v, (stages, permuted, *_rest) in zip(plan, got["variants"]):
        bad = set(v["need"]) & set(failed)
        assert bool(v["skip"]) == bool(bad), v
        assert ("plain_keys" in v["need"]) == (not permuted)
    assert any(v["skip"] for v in plan) and any(not v["skip"] for v in plan)
    assert not any(v["skip"] for v in got["all_pass"])
    # a variant is float64-checked only at the pinned ring depth with a schedule the check ran
    assert any(v["covered"] for v in plan) and not all(v["covered"] for v in plan)


STAGE_ARGS = """
import json, sys
from benchmarks._staged import run_child, stage_parser
ap = stage_parser("Title line.\\nmore", ["check", "bench"], "/tmp/r", 150, "seconds per stage (bench gets 2x)")
a = ap.parse_args(sys.argv[1:])
ran = []
fns = {"check": lambda: ran.append("check") or {"n": 1}, "bench": lambda: ran.append("bench") or [2.5]}
try:
    done = run_child(a.stage, fns)
except KeyError as e:
    done = "KeyError " + str(e)
print("PARSED " + json.dumps([ap.description, a.out, a.stage, a.stages, a.timeout, done, ran]))
"""


def _stage_args(*argv):
    out = subprocess.run([sys.executable, "-c", STAGE_ARGS, *argv], cwd=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


def test_stage_parser_and_run_child_hand_a_stage_its_result_line():
    """A staged script's arguments (``stage_parser``) and a child's part (``run_child``): the parent (``all``) runs
    nothing; a child runs its stage only and prints the ``RESULT`` line ``run_stage`` reads back."""
    lines = _stage_args()
    assert lines == ["PARSED " + json.dumps(["Title line.", "/tmp/r", "all", "check,bench", 150, False, []])]
    lines = _stage_args("--stage", "bench", "--timeout", "7")
    assert lines[0] == "RESULT [2.5]"
    assert json.loads(lines[1][len("PARSED "):])[2:] == ["bench", "check,bench", 7, True, ["bench"]]
    assert json.loads(_stage_args("--stage", "retime")[-1][len("PARSED "):])[5] == "KeyError 'retime'"
