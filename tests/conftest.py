import os

# One BLAS / OpenMP thread per test process, set before NumPy or torch is imported (grading children already run
# with one: sandbox.py). `make test` runs two xdist workers on two cores; torch's default two-thread pool made
# each small op hand work to a second thread that spin-waits for the next one on an oversubscribed machine: the
# a3b no-false-accusation sweep took 51.8 s of CPU with it, 12.8 s with one thread.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import gc  # noqa: E402

gc.disable()        # until the tests are collected: ``pytest_configure``

import atexit  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

# One folder of GPU-target (sm_90a) compile verdicts for every grading this run starts (the selftest items, the
# CLI and Gradescope tests: ``host_policy.CACHE_ENV``): a kernel is put through Triton's frontend once per run,
# not once per grading that launched it. Set before the xdist workers start, so they share it.
if not os.environ.get("AUTOGRADER_COMPILE_CACHE"):
    _verdicts = tempfile.mkdtemp(prefix="autograder-compiled-")
    os.environ["AUTOGRADER_COMPILE_CACHE"] = _verdicts
    atexit.register(shutil.rmtree, _verdicts, True)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The big imports' objects, frozen out of the collector's reach once per test process:
# ``runner.execute`` collects garbage before every graded call (so that garbage does not count in the memory
# tests), and in a test process that has imported torch and Triton (and sympy, which autograd's first backward
# imports) each collection walks their 200 000 objects, 0.1 s a call: the in-process visible-check tests made
# dozens of such calls. Frozen right after a full collection, so no garbage is frozen with them; objects made
# later (each test's own) are collected as before. The grading children do the same (``autograder/child.py``).
_FROZEN: set = set()


def pytest_configure(config):
    """Importing this file's and the test modules' imports (torch, Triton, every module of the course) makes about
    a million objects and almost no garbage, and the collector walked them all some twenty times per worker while
    it collected the tests (about 3 CPU-s a worker). Paused from this file's import until collection ends, when
    what was imported is frozen out of its reach; in xdist's controller, which collects nothing, from here on."""
    if not os.environ.get("PYTEST_XDIST_WORKER") and getattr(config.option, "numprocesses", None):
        pytest_collection_finish(None)


def pytest_collection_finish(session):
    if not gc.isenabled():
        gc.collect()
        gc.freeze()
        gc.enable()


def pytest_runtest_setup(item):
    heavy = {m for m in ("torch", "triton", "sympy") if m in sys.modules} - _FROZEN
    if heavy:
        gc.collect()
        gc.freeze()
        _FROZEN.update(heavy)


@pytest.fixture
def rng(request):
    """A fresh generator per test; the seed is printed on failure so a case can be replayed."""
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def _notebook_cells_put_back():
    """Each test leaves the process's notebook cells as it found them: ``adapter.load`` (and a test standing in for
    a grading child) registers sources in ``linecache`` and labels in ``where.CELL_LABELS`` under ``<cell N>``, and
    the interpreter reads a kernel's source from there by that name: a later test's kernel in its own "<cell 2>"
    would be rewritten from another test's cell (an order-dependent ``KeyError`` in the interpreter)."""
    from autograder.bugs_guide import cells_put_back
    with cells_put_back():
        yield


@pytest.fixture(scope="session")
def zygote_env():
    """``{AUTOGRADER_ZYGOTE: ..., AUTOGRADER_ZYGOTE_COMPILE: ...}`` of one pair of zygotes per test process
    (``autograder.zygote.started``; empty where namespaces are off), for the environment of the gradings a test
    starts: every selftest item and CPU grading of a worker forks its children from the same pair instead of
    starting its own (3 CPU-s a pair). Not in ``os.environ``: a test that checks when zygotes start sees none."""
    from autograder.zygote import started
    with started("cpu") as (addresses, _why):
        yield dict(addresses)


def pytest_runtest_makereport(item, call):
    if call.when == "call" and call.excinfo is not None:
        for k, v in item.user_properties:
            if k == "seed":
                item.add_report_section("call", "seed", f"rng seed = {v}")


# CPU_REPORT=1 pytest ...: the tests that cost the most CPU (tests/cpu_report.py)
if os.environ.get("CPU_REPORT"):
    pytest_plugins = ["tests.cpu_report"]


# Kernels of this process run in Triton's interpreter without its per-helper-call re-patching of
# ``triton.language`` (autograder/interp_fast.py: the same results, about a third less CPU). COURSE_INTERP_FAST=0
# runs the interpreter as shipped. ``reference.triton`` first: it decides whether kernels are interpreted (and
# sets TRITON_INTERPRET) before anything imports Triton.
if os.environ.get("COURSE_INTERP_FAST", "1") != "0":
    from reference.triton import INTERPRET as _INTERPRET  # noqa: E402

    if _INTERPRET:
        from autograder import interp_fast  # noqa: E402

        interp_fast.install()
