"""The course autograder (SPEC section 6).

* ``autograder.check.check(task_id, fn)``: the in-notebook checker (visible cases, in-process).
* ``python -m autograder grade|grade-all|selftest|gradescope``: the sandboxed grader (``autograder.cli``).
* ``autograder.specs``: one spec per assignment (tasks, tests, cases, tolerances, points).
"""
__all__ = ["check"]


def __getattr__(name):
    if name == "check":
        from .check import check
        return check
    raise AttributeError(name)
