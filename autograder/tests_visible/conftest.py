"""Options and markers of ``make check`` (``autograder/tests_visible``).

    make check ASSIGNMENT=a1_attention [SUBMISSION=my.ipynb] [MARK=online_softmax]
    python -m pytest autograder/tests_visible --assignment a1 [--submission my.ipynb] [-m online_softmax]

One marker per graded function, named as the function (``-m online_softmax``, ``-m BlockAllocator``); the
default submission is the assignment's notebook, ``assignments/<aid>/<aid>.ipynb``.
"""
from __future__ import annotations


def pytest_addoption(parser):
    g = parser.getgroup("make check", "the course's visible checks on your own notebook")
    g.addoption("--assignment", help="a1_attention ... a6_ring (or a1, a3b, ...)")
    g.addoption("--submission", help="your notebook or .py module (default: assignments/<aid>/<aid>.ipynb)")


def pytest_configure(config):
    from autograder import visible
    from autograder.specs import ASSIGNMENTS
    names = set()
    for aid in ASSIGNMENTS:
        try:
            names |= set(visible.tasks(aid).values())
        except (KeyError, ValueError, OSError):
            continue
    for name in sorted(names):
        config.addinivalue_line("markers", f"{name}: the visible checks of {name} (make check MARK={name})")
