"""The course autograder: grades student submissions of the eight assignments (a1-a7 with a3b; a6 and a7 optional)
in a sandbox.

Students use the in-notebook checker, which runs the visible cases of one function in the notebook's process::

    from autograder.check import check
    check("a2.flash_attention_forward", flash_attention_forward)   # prints which case failed and by how much

Instructors use the command line (``python -m autograder --help`` lists every command and option)::

    python -m autograder grade a2_flash_numpy alice.ipynb --json alice.json
    python -m autograder grade-all a2_flash_numpy submissions/ -j 4 --csv grades.csv
    python -m autograder gradescope a2_flash_numpy -o a2.zip

``autograder.specs`` holds one spec per assignment (tasks, tests, cases, tolerances, points). The design of the
grader and the threats it defends against (T1-T18) are in ``docs/design.md`` §6; ``autograder/README.md`` is
the instructor guide.
"""
