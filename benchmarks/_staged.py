"""Run a benchmark's stages each in a child process with a time limit, saving the JSON after every stage.

A Gluon kernel with a wrong mbarrier phase hangs the GPU instead of failing, so ``bench_gluon.py`` and
``bench_gluon_bwd.py`` run each stage (``python -m module --stage NAME``, which prints ``RESULT <json>``
last) in its own process: a hang costs that stage (its stdout tail is kept), not the whole device call.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback


def run_stages(module: str, stages: list[str], limit_of, res: dict, path: str, env_of=None) -> dict:
    """Run ``stages`` of ``module`` (``python -m module --stage NAME`` from the repository root) in order;
    ``limit_of(stage)`` seconds each; ``env_of(stage, res)`` may return extra environment variables for the
    child (from the results so far). ``res[stage]`` gets each stage's
    result (or its error); ``res`` is written to ``path`` after every stage."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    t0 = time.time()
    for stage in stages:
        limit = limit_of(stage)
        env = {**os.environ, **(env_of(stage, res) if env_of else {})}
        t = time.time()
        try:
            p = subprocess.run([sys.executable, "-m", module, "--stage", stage], capture_output=True,
                               text=True, timeout=limit, cwd=root, env=env)
            lines = p.stdout.splitlines()
            print("\n".join(x for x in lines if not x.startswith("RESULT ")), flush=True)
            got = [x for x in lines if x.startswith("RESULT ")]
            res[stage] = json.loads(got[-1][7:]) if got else {"error": p.stderr[-4000:], "rc": p.returncode}
            if not got:
                print(p.stderr[-4000:], flush=True)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else str(e.stdout or "")
            res[stage] = {"error": f"timed out after {limit} s (deadlock?)", "stdout_tail": out[-8000:]}
            print(f"{stage}: TIMED OUT after {limit} s", flush=True)
        except Exception:  # noqa: BLE001
            res[stage] = {"error": traceback.format_exc()[-3000:]}
        res.setdefault("stage_seconds", {})[stage] = round(time.time() - t, 1)
        res["seconds"] = round(time.time() - t0, 1)
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
    print(f"wrote {path}", flush=True)
    return res
