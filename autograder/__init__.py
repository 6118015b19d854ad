"""The course autograder (docs/design.md §6).

* ``from autograder.check import check``: the in-notebook checker (visible cases, in-process).
* ``python -m autograder grade|grade-all|selftest|gradescope``: the sandboxed grader (``autograder.cli``).
* ``autograder.specs``: one spec per assignment (tasks, tests, cases, tolerances, points).
"""
