"""Every lecture source opens with its learning objectives: a block right after the title, 3 to 5 numbered
objectives, each starting with an action verb a quiz or an exercise can check (not "understand" or "know")."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKABLE = {"Compute", "Explain", "State", "Draw", "Find", "Prove", "Merge", "Implement", "Classify", "Reproduce",
             "Trace", "Show", "Count", "Measure", "Derive", "List", "Map", "Contrast", "Read", "Say", "Describe",
             "Compare", "Split", "Quantify", "Fork", "Pack", "Share", "Separate", "Write", "Predict", "Profile",
             "Time", "Run", "Use", "Identify", "Estimate", "Choose", "Name", "Check", "Build", "Locate"}


def objectives(source: str) -> list:
    lines = source.split("\n")
    assert lines[1].startswith("# # "), "the title comes first"
    head = "\n".join(lines[2:20])
    m = re.match(r"#\n# \*\*Learning objectives\.\*\* After this lecture you can:\n#\n((?:# \d\. .+\n)+)", head + "\n")
    assert m, "no objectives block right after the title"
    return [re.sub(r"^# \d\. ", "", l) for l in m.group(1).splitlines()]


def test_every_lecture_states_three_to_five_checkable_objectives():
    sources = sorted((REPO / "lectures" / "src").glob("[0-9][0-9]*_*.py"))
    assert len(sources) >= 11
    for p in sources:
        objs = objectives(p.read_text())
        assert 3 <= len(objs) <= 5, p.name
        for o in objs:
            assert o.split()[0] in CHECKABLE, (p.name, o)


def test_the_parser_refuses_a_missing_or_vague_block():
    good = "# %% [markdown]\n# # Lecture X\n#\n# **Learning objectives.** After this lecture you can:\n#\n" \
           "# 1. Compute a.\n# 2. Explain b.\n# 3. Trace c.\n#\n# text\n"
    assert objectives(good) == ["Compute a.", "Explain b.", "Trace c."]
    try:
        objectives("# %% [markdown]\n# # Lecture X\n#\n# Some prose.\n")
    except AssertionError:
        pass
    else:
        raise AssertionError("a lecture without objectives passed")
    assert "Understand" not in CHECKABLE
