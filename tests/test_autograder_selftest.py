"""``python -m autograder selftest``: every bundled correct, wrong and cheating submission (plus the solution
sources and the generated student notebooks) lands in its expected band, and the grader survives all of them."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


# one item per assignment, so that pytest-xdist spreads the zoo over the workers (one selftest of everything
# ran 6 minutes on one worker while the other idled)
from autograder.specs import ASSIGNMENTS  # noqa: E402


@pytest.mark.selftest
@pytest.mark.autograder
@pytest.mark.parametrize("aid", ASSIGNMENTS)
def test_selftest_passes(aid, zygote_env):
    # the worker's zygotes (``zygote_env``) serve every item it runs, instead of a pair started per item
    # -j 2 inside each item as well: a grading waits on its sandboxed child (start-up, pipes, time limits) for a
    # fifth of its time, which the other grading fills (a1 alone: 47 s with -j 1, 27 s with -j 2, 2 cores)
    p = subprocess.run([sys.executable, "-m", "autograder", "selftest", "--only", aid, "-j", "2", "--device", "cpu",
                        "--out", str(REPO / "build" / "selftest" / aid)], cwd=REPO,
                       capture_output=True, text=True, timeout=600, env={**os.environ, **zygote_env})
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    assert "as expected" in p.stdout
