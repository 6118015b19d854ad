"""``python -m autograder selftest``: every bundled correct, wrong and cheating submission (plus the solution
sources and the generated student notebooks) lands in its expected band, and the grader survives all of them."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.selftest
@pytest.mark.autograder
def test_selftest_passes():
    p = subprocess.run([sys.executable, "-m", "autograder", "selftest", "-j", "2", "--device", "cpu"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
    assert "as expected" in p.stdout
