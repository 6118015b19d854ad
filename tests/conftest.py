import os

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A fresh generator per test; the seed is printed on failure so a case can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


def pytest_runtest_makereport(item, call):
    if call.when == "call" and call.excinfo is not None:
        for k, v in item.user_properties:
            if k == "seed":
                item.add_report_section("call", "seed", f"rng seed = {v}")


# CPU_REPORT=1 pytest ...: the tests that cost the most CPU (tests/cpu_report.py)
if os.environ.get("CPU_REPORT"):
    pytest_plugins = ["tests.cpu_report"]
