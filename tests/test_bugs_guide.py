"""The common-bugs guide (``python -m autograder.bugs_guide``, docs/common_bugs/) is generated from the grader's zoo
of wrong submissions and cannot drift from it: regenerating gives the committed files (NumPy entries recomputed,
Triton and Gluon ones from the per-entry hash cache), every wrong entry has its section, and a new entry makes
the guide stale until the script runs."""
import json
import shutil
from pathlib import Path

import pytest

from autograder import bugs_guide, specs

REPO = Path(__file__).resolve().parent.parent


def test_the_committed_guides_are_what_the_zoo_generates():
    stale = bugs_guide.generate(check_only=True, log=lambda m: None)
    assert stale == [], f"run `python -m autograder.bugs_guide` and commit: {[str(p) for p in stale]}"


def test_every_wrong_entry_has_a_section_with_cause_symptom_test_and_hint():
    for aid in specs.ASSIGNMENTS:
        text = (REPO / "docs" / "common_bugs" / f"{aid}.md").read_text()
        for e in bugs_guide.entries(aid):
            section = text.split(f"\n## {e['name']}\n", 1)[1].split("\n## ", 1)[0]
            assert e["cause"][:40] in section
            assert "**Symptom**" in section and "```text\ncheck " in section or "is not defined" in section
            assert "**Caught by.**" in section and "**How to find it.**" in section
            if e["expect"].get("fail"):
                assert "fails" in section, (aid, e["name"])
            symptom = section.split("```text\n", 1)[-1].split("```", 1)[0]
            if "FAIL" not in symptom and not e["find"]:
                # check() shows nothing: the hint says that only hidden or GPU tests see it
                assert "`check()` passes" in section or "`check()` cannot see it" in section, (aid, e["name"])


def test_the_guide_shows_no_a7_answer():
    from assignments.release import answer_patterns, redact_answers
    text = (REPO / "docs" / "common_bugs" / "a7_gluon.md").read_text()
    assert redact_answers(text, answer_patterns())[1] == 0


def test_a_new_zoo_entry_makes_the_guide_stale(tmp_path):
    """Positive control on a copy of a1's zoo: a new mutant shows up only after regeneration, with its own cause
    and the FAIL row check() prints for it; an entry that does not say what it does wrong is refused."""
    sub, out = tmp_path / "submissions", tmp_path / "common_bugs"
    shutil.copytree(REPO / "autograder" / "submissions" / "a1_attention", sub / "a1_attention")
    out.mkdir()
    shutil.copy(REPO / "docs" / "common_bugs" / "a1_attention.md", out)
    cache = json.loads((REPO / "docs" / "common_bugs" / "symptoms.json").read_text())
    (out / "symptoms.json").write_text(json.dumps({k: v for k, v in cache.items() if k.startswith("a1")}))
    base = "autograder/submissions/a1_attention/correct/own_numpy.py"
    line = "        lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(np.where(l[..., 0] > 0, l[..., 0], 1)), -np.inf)\n"
    assert line in (REPO / base).read_text()
    mutant = {"base": base, "why": "WRONG: lse off by one (a made-up mistake for this test).",
              "edits": [{"old": line, "new": line.replace("-np.inf)", "-np.inf) + 1"), "count": 1}]}
    (sub / "a1_attention" / "wrong" / "w_made_up.mutant.json").write_text(json.dumps(mutant))
    exp = json.loads((sub / "a1_attention" / "wrong" / "expected.json").read_text())
    exp["w_made_up.py"] = {"fail": ["attention: lse"]}
    (sub / "a1_attention" / "wrong" / "expected.json").write_text(json.dumps(exp))
    # the unchanged entries' symptoms come from the cache (their recomputation is the test above's): only the new
    # entry's check() runs
    quick = {"log": lambda m: None, "sub": sub, "out": out, "recompute_numpy": False}
    assert bugs_guide.generate(["a1"], check_only=True, **quick) == [out / "a1_attention.md"]
    bugs_guide.generate(["a1"], log=lambda m: None, sub=sub, out=out)
    text = (out / "a1_attention.md").read_text()
    section = text.split("\n## w_made_up\n", 1)[1]
    assert "lse off by one (a made-up mistake for this test)." in section and "FAIL" in section
    assert bugs_guide.generate(["a1"], check_only=True, **quick) == []
    mutant["why"] = " "
    (sub / "a1_attention" / "wrong" / "w_made_up.mutant.json").write_text(json.dumps(mutant))
    with pytest.raises(ValueError, match="must say what it does wrong"):
        bugs_guide.entries("a1_attention", sub)


def test_a_relative_error_moved_by_the_cpus_blas_is_not_a_stale_guide():
    """The float32 error of a case at the rounding level differs between AVX-512 and AVX2 OpenBLAS kernels; any
    other change (a word, a shape, an error off by more than a factor 2, a sign) still makes the guide stale."""
    row = "memory O(N d): no N x N matrix   FAIL    {}     2e-05   peak traced memory 12.2 MiB > limit 3.0 MiB"
    old = row.format("2.9e-07")
    assert bugs_guide.same_but_rounding(old, row.format("3.4e-07"))
    assert bugs_guide.same_but_rounding(old, old)
    assert not bugs_guide.same_but_rounding(old, row.format("6.1e-07"))
    assert not bugs_guide.same_but_rounding(old, row.format("-2.9e-07"))
    assert not bugs_guide.same_but_rounding(old, row.format("0.0"))
    assert not bugs_guide.same_but_rounding(old, old.replace("12.2 MiB", "12.3 MiB"))
    assert not bugs_guide.same_but_rounding(old, old.replace("FAIL", "ok"))
    assert not bugs_guide.same_but_rounding(old, old.replace("2e-05", "3e-05"))  # a tolerance is not an error
