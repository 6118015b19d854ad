"""Opt-in per-test CPU report: ``CPU_REPORT=1 pytest ...`` prints, after the run, the tests
that used the most CPU time -- this process's (``time.process_time``) plus its finished children's
(``resource.getrusage(RUSAGE_CHILDREN)``, user + sys; a grading subprocess, the zygote and its forks count when
they are reaped; the long-lived sm_90a compile child reports its CPU per command, ``tests/sm90_compile.py``) -- over setup, call and teardown (a module- or session-scoped fixture is charged to the first
test that sets it up). Wall time is noise on a shared 2-core machine; CPU time is what ``make test`` pays.

``CPU_REPORT=N`` shows the top N (default 25); ``CPU_REPORT_FILE=path`` also writes every test's CPU as
JSON lines (``{"nodeid", "cpu_s", "self_s", "children_s", "start", "end", "worker"}``: wall-clock span from
setup to teardown, and the xdist worker that ran it). Works with pytest-xdist: each worker measures its
own tests and the numbers travel to the controller in the reports' ``user_properties``.
"""
import json
import os
import resource
import sys
import time

import pytest

_KEY = "cpu_report"


def _children_cpu():
    """Finished children's CPU, plus what the long-lived sm_90a compile child reported for this process's commands
    (``tests/sm90_compile.py``: it is reaped only when the process ends, so its CPU would otherwise go uncharged)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    compile_child = sys.modules.get("tests.sm90_compile")
    return r.ru_utime + r.ru_stime + (compile_child.cpu_seconds() if compile_child else 0.0)


def _measure(item, when):
    t0, c0, w0 = time.process_time(), _children_cpu(), time.time()
    yield
    spent = item.__dict__.setdefault("_cpu_report", {})
    spent[when] = (time.process_time() - t0, _children_cpu() - c0)
    span = item.__dict__.setdefault("_cpu_report_span", [w0, w0])
    span[1] = time.time()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _measure(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _measure(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _measure(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    spent = item.__dict__.get("_cpu_report", {}).get(call.when)
    if spent is not None:
        rep.user_properties.append((_KEY, [round(spent[0], 4), round(spent[1], 4)]))
    if call.when == "teardown" and "_cpu_report_span" in item.__dict__:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        rep.user_properties.append((_KEY + "_span", [*item.__dict__["_cpu_report_span"], worker]))


class _Collector:
    def __init__(self, top):
        self.top = top
        self.per_test = {}
        self.spans = {}

    def pytest_runtest_logreport(self, report):
        for key, value in report.user_properties:
            if key == _KEY + "_span":
                self.spans[report.nodeid] = value
            if key == _KEY:
                self_s, children_s = self.per_test.get(report.nodeid, (0.0, 0.0))
                self.per_test[report.nodeid] = (self_s + value[0], children_s + value[1])

    def pytest_terminal_summary(self, terminalreporter):
        rows = sorted(self.per_test.items(), key=lambda kv: -sum(kv[1]))
        total = sum(sum(v) for _, v in rows)
        tr = terminalreporter
        tr.write_sep("=", f"CPU per test (top {self.top} of {len(rows)}; all tests: {total:.1f} s of CPU)")
        tr.write_line(f"{'cpu s':>8} {'self':>7} {'child':>7}  test")
        for nodeid, (self_s, children_s) in rows[: self.top]:
            tr.write_line(f"{self_s + children_s:8.1f} {self_s:7.1f} {children_s:7.1f}  {nodeid}")
        out = os.environ.get("CPU_REPORT_FILE")
        if out:
            with open(out, "w") as f:
                for nodeid, (self_s, children_s) in rows:
                    start, end, worker = self.spans.get(nodeid, (None, None, None))
                    f.write(json.dumps({"nodeid": nodeid, "cpu_s": round(self_s + children_s, 3),
                                        "self_s": round(self_s, 3), "children_s": round(children_s, 3),
                                        "start": start, "end": end, "worker": worker}) + "\n")
            tr.write_line(f"every test's CPU: {out}")


def pytest_configure(config):
    if getattr(config, "workerinput", None) is not None:
        return  # an xdist worker: it measures; the controller prints
    value = os.environ.get("CPU_REPORT", "")
    top = int(value) if value.isdigit() and int(value) > 1 else 25
    config.pluginmanager.register(_Collector(top), "cpu_report_collector")
