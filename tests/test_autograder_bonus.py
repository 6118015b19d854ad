"""Optional parts are bonus points outside the denominator (docs/design.md §6): required tests out of 100 (80 on a
CPU for a3, where the GPU speed tests are not run), the bonus apart in the result JSON, the console table, the
grade-all CSV, Gradescope's results.json and the selftest's bands. Fast: no submission is graded here."""
import csv

import pytest

from autograder import specs
from autograder import engine
from autograder.grade_all import summary, write_csv
from autograder.report import table, to_gradescope, totals
from autograder.selftest import check_expectation, collect, graded_tests

# Required points of each assignment on a GPU. The course's rule is 100; a2 (forward_hbm_bytes, a required
# Part 3) and a5 (copy-on-write, required) total more; a6 (optional) is out of 100.
# These are listed, not re-weighted: a change to any of them must be a decision, so this test fails until the
# table is updated.
NOT_100 = {"a2_flash_numpy": 110.0, "a5_paged": 115.0}
OPTIONAL = {"a3_triton": ("a3.flash_attention_forward_fp8", 10.0), "a4_decoding": ("a4.lpt_schedule", 5.0)}


@pytest.mark.parametrize("aid", specs.ASSIGNMENTS)
def test_required_points_total_100_on_a_gpu(aid):
    spec = specs.load(aid)
    assert spec.max_points == NOT_100.get(aid, 100.0)
    assert spec.max_points + spec.max_bonus == sum(t.points for t in spec.tests)
    task, bonus = OPTIONAL.get(aid, (None, 0.0))
    assert spec.max_bonus == bonus
    # every test of the optional task is optional, and no other test is
    assert {t.name for t in spec.tests if t.optional} == {t.name for t in spec.tests if t.task == task}
    assert all("optional" in t.name for t in spec.tests if t.optional)


def _graded(aid, device="cpu", fail=(), partial=None):
    """The report of a grade of ``aid`` on ``device`` where every test passed except those whose name contains
    one of ``fail`` (0 points) or ``partial`` ({substring: fraction}); GPU-only tests are "not run" on the CPU
    (a "cuda" grade here is a Hopper one: every test ran). No child process: the sandbox probes are stubbed."""
    g = engine.Grader(aid, device, seed=1)
    g.sandbox_network = lambda: "off (stub)"
    g.sandbox_isolation = lambda: {"checkout": "stub", "processes": "stub"}
    for t in g.spec.tests:
        r = engine.TestResult(t.name, t.task, float(t.points))
        if t.gpu_only and device == "cpu":
            r.status, r.output = "not run", "not run: no GPU (excluded from max_score)"
        elif any(f in t.name for f in fail):
            r.status, r.output = "failed", "o: relative error 1 > tolerance"
        elif partial and any(k in t.name for k in partial):
            frac = next(v for k, v in partial.items() if k in t.name)
            r.status, r.score, r.output = "partial", frac * t.points, f"{frac:.0%}"
            r.extra = {"kind": "speed"}
        else:
            r.status, r.score = "passed", float(t.points)
        g.results.append(r)
    return g.report("sub.py", 1.5)


def test_a3_on_cpu_is_80_of_80_plus_7_bonus():
    r = _graded("a3_triton")
    assert (r["score"], r["max_score"], r["bonus"], r["max_bonus"]) == (80, 80, 7, 7)
    fp8 = [t for t in r["tests"] if t["optional"]]
    assert len(fp8) == 3 and all("optional (FP8)" in t["name"] for t in fp8)
    assert not any(t["optional"] for t in r["tests"] if "FP8" not in t["name"])
    assert "score 80 / 80 (100.0%) + 7 / 7 bonus on cpu" in table(r, width=200)
    # the bonus rows say so in the points column
    row = next(x for x in table(r, width=200).splitlines() if "optional (FP8): accuracy, normal" in x)
    assert "4/4 bonus" in row
    # without the bonus: still 100% of the required parts
    r = _graded("a3_triton", fail=("optional (FP8)",))
    assert (r["score"], r["max_score"], r["bonus"], r["max_bonus"]) == (80, 80, 0, 7)
    assert "score 80 / 80 (100.0%) + 0 / 7 bonus on cpu" in table(r, width=200)
    # a required failure costs required points only: 72 / 80 = 90%
    r = _graded("a3_triton", fail=("flash_attention_forward: GQA",))
    assert (r["score"], r["max_score"], r["bonus"]) == (72, 80, 7)
    assert "score 72 / 80 (90.0%) + 7 / 7 bonus" in table(r, width=200)


def test_a4_and_no_bonus_line_without_optional_tests():
    r = _graded("a4_decoding")
    assert (r["score"], r["max_score"], r["bonus"], r["max_bonus"]) == (90, 90, 5, 5)
    r = _graded("a1_attention")
    assert (r["score"], r["max_score"], r["bonus"], r["max_bonus"]) == (100, 100, 0, 0)
    text = table(r, width=200)
    assert "score 100 / 100 (100.0%) on cpu" in text and "bonus" not in text


def test_a3_on_a_gpu_is_out_of_100():
    r = _graded("a3_triton", device="cuda", partial={"optional (FP8): speed": 0.5})
    assert (r["score"], r["max_score"], r["bonus"], r["max_bonus"]) == (100, 100, 8.5, 10)


def test_totals_of_plain_dicts():
    tests = [{"score": 3, "max_score": 5}, {"score": 2, "max_score": 2, "optional": True},
             {"score": 0, "max_score": 0, "optional": True, "status": "not run"}, {"score": 1, "max_score": 1,
                                                                                 "optional": False}]
    assert totals(tests) == {"score": 4, "max_score": 6, "bonus": 2, "max_bonus": 2}


def test_gradescope_score_is_required_plus_bonus():
    r = _graded("a3_triton", fail=("optional (FP8): accuracy, outlier",))
    gs = to_gradescope(r)
    assert gs["score"] == 84 and r["score"] == 80 and r["bonus"] == 4
    assert "80 / 80 (100.0%) + 4 / 7 bonus" in gs["output"] and "Gradescope score 84" in gs["output"]
    bonus = [t for t in gs["tests"] if t["name"].endswith("[bonus]")]
    assert len(bonus) == 3 and all(t["output"].startswith("Bonus test") for t in bonus)
    assert not any("bonus" in t["name"].lower() for t in gs["tests"] if "FP8" not in t["name"])
    assert sum(t["score"] for t in gs["tests"]) == gs["score"]
    # without optional tests the total is the score, and the text has no bonus
    gs = to_gradescope(_graded("a1_attention"))
    assert gs["score"] == 100 and "bonus" not in gs["output"].lower()


def test_csv_has_bonus_columns_and_percent_of_required(tmp_path):
    results = {"alice.py": _graded("a3_triton"), "bob.py": _graded("a3_triton", fail=("optional (FP8)",)),
               "carol.py": _graded("a3_triton", fail=("flash_attention_forward: GQA", "optional (FP8): accuracy, "
                                                                                      "normal"))}
    write_csv(results, tmp_path / "g.csv")
    with open(tmp_path / "g.csv") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == ["student", "score", "max_score", "percent", "bonus", "max_bonus", "flags",
                                     "status", "submission"]
        rows = {r["student"]: r for r in reader}
    got = {s: (float(r["score"]), float(r["max_score"]), float(r["percent"]), float(r["bonus"]),
               float(r["max_bonus"])) for s, r in rows.items()}
    assert got == {"alice": (80, 80, 100.0, 7, 7), "bob": (80, 80, 100.0, 0, 7), "carol": (72, 80, 90.0, 3, 7)}
    rows = write_csv(results, tmp_path / "g2.csv")
    assert "mean 96.7%" in summary(rows) and "2 with bonus points" in summary(rows)


def test_selftest_bands_are_of_the_required_max():
    full = _graded("a3_triton")
    assert check_expectation(full, {"score": [100, 100], "bonus": [100, 100], "others_pass": True}) == []
    no_bonus = _graded("a3_triton", fail=("optional (FP8)",))
    # required 100% without the bonus; the bonus band catches the missing bonus, a fail list finds bonus tests
    assert check_expectation(no_bonus, {"score": [100, 100]}) == []
    assert check_expectation(no_bonus, {"score": [100, 100], "bonus": [100, 100]}) == ["bonus 0.0% outside [100, 100]"]
    assert check_expectation(no_bonus, {"fail": ["optional (FP8): accuracy"], "others_pass": True}) == []
    assert check_expectation(full, {"fail": ["optional (FP8): accuracy"]}) != []
    gqa = _graded("a3_triton", fail=("flash_attention_forward: GQA",))
    assert check_expectation(gqa, {"score": [90, 90]}) == []          # 72 / 80, the bonus not in it
    # a bonus speed test on partial credit is slack in the bonus band, never in the required one
    gpu = _graded("a3_triton", device="cuda", partial={"optional (FP8): speed": 0.5})
    assert check_expectation(gpu, {"score": [100, 100], "bonus": [100, 100], "others_pass": True}) == []
    # the bonus band is skipped where no bonus test ran (a1 has none)
    assert check_expectation(_graded("a1_attention"), {"score": [100, 100], "bonus": [100, 100]}) == []


def test_selftest_solutions_must_earn_the_full_bonus_and_stubs_none():
    items = collect(["a3", "a4"])
    sols = [exp for _aid, _p, exp, label in items if label.endswith("solution source")]
    stubs = [exp for _aid, _p, exp, label in items if label.endswith("(stubs)")]
    assert sols and all(e["score"] == [100, 100] and e["bonus"] == [100, 100] for e in sols)
    assert stubs and all(e["score"] == [0, 0] and e["bonus"] == [0, 0] for e in stubs)


def test_selftest_grades_bonus_tests_only_where_the_expectation_checks_them():
    """The selftest leaves a3's FP8 bonus (3.5 s of interpreter a grading) out of entries whose expectation
    looks at no bonus test; where it does -- a bonus band, a fail/pass pattern -- it runs."""
    spec = specs.load("a3_triton")
    required = {t.name for t in spec.tests if not t.optional}
    fp8 = {t.name for t in spec.tests if t.optional}
    assert fp8 and required
    assert graded_tests("a3_triton", {"score": [100, 100], "bonus": [100, 100], "others_pass": True}) is None
    for exp in ({"fail": ["flash_attention_forward: GQA"], "others_pass": True}, {"score": [0, 10]},
                {"score": [0, 0], "flags": ["T10"], "zero_tasks": ["a3.flash_attention_forward"]}):
        assert set(graded_tests("a3_triton", exp)) == required
    assert graded_tests("a3_triton", {"fail": ["optional (FP8)"], "others_pass": True}) is None
    outlier = set(graded_tests("a3_triton", {"fail": ["optional (FP8): accuracy, outlier"]})) - required
    assert outlier and all("outlier" in n for n in outlier) and outlier < fp8
    assert graded_tests("a1_attention", {"fail": ["online_softmax"]}) is None        # no optional test: all
    # every entry of the zoo: the bonus runs wherever a test name of the expectation matches a bonus test
    for aid, _p, exp, label in collect(["a3", "a4"]):
        keep = graded_tests(aid, exp)
        named = [*exp.get("fail", []), *exp.get("pass", [])]
        if "bonus" in exp or any(pat in n for pat in named for n in fp8):
            assert keep is None or any(pat in n for n in keep for pat in named), label
