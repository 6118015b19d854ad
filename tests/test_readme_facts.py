"""What README.md and lectures/README.md state about the course, kept equal to the course itself: the number of
assignments (their folders), the IO model's HBM bytes (``reference.simulators.iosim``), the reading paths (every
lecture and assignment, in the order the assignments need them), which lectures need Triton (the platform
table), and no development-history labels."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LECTURES_README = ROOT / "lectures" / "README.md"
WORDS = "zero one two three four five six seven eight nine ten eleven twelve".split()


def _text(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def _assignments() -> list[str]:
    return sorted(p.name for p in (ROOT / "assignments").glob("a*_*") if (p / "README.md").exists())


def _optional() -> list[str]:
    return [a for a in _assignments()
            if "optional" in (ROOT / "assignments" / a / "README.md").read_text(encoding="utf-8").splitlines()[0]]


def test_assignment_counts_match_the_folders():
    """Every place that counts the assignments says as many as there are folders (and the grader's specs)."""
    from autograder.specs import ASSIGNMENTS
    folders, optional = _assignments(), _optional()
    assert sorted(ASSIGNMENTS) == folders
    n, k = WORDS[len(folders)], WORDS[len(optional)]
    assert f"{n} graded assignments" in _text(README)
    assert " and ".join(f"`{a.split('_')[0]}`" for a in optional) + " optional" in _text(README)
    assert f"the {n} assignments" in _text(ROOT / "autograder" / "__init__.py")
    assert (f"{n.capitalize()} assignments, {WORDS[len(folders) - len(optional)]} required and {k} optional"
            in _text(ROOT / "assignments" / "README.md"))


def test_the_io_model_is_quoted_as_it_computes_next_to_the_paper():
    """The READMEs quote the model's standard / FlashAttention HBM bytes (``iosim.seeds_table``) and the paper's
    figures as the paper's, never the paper's 4.4 GB as "reproduced"."""
    from reference.simulators import iosim
    table = iosim.seeds_table(verbose=False)
    model = f"{table['standard']['hbm_gb']:.1f} GB standard vs {table['flash']['hbm_gb']:.2f} GB FlashAttention"
    paper = f"the paper: {iosim.SEEDS['standard']['hbm_gb']} vs {iosim.SEEDS['flash']['hbm_gb']} GB"
    for path in (README, LECTURES_README):
        text = _text(path)
        assert model in text and paper in text, (path.name, model, paper)
        assert not re.search(r"4\.4 GB[^|]{0,40}reproduced", text), path.name


def _reading_path(path: Path) -> list[str]:
    """The reading-path table's entries in order: lecture stems (``05a_triton_primer``) and assignment ids."""
    text = path.read_text(encoding="utf-8")
    table = text[text.index("## Reading path"):]
    table = table[:table.index("\n\n", table.index("| step"))]
    return [re.search(r"\[`([^`]+)`\]", row).group(1) for row in table.splitlines() if re.match(r"\| \d+ \|", row)]


@pytest.mark.parametrize("path", [README, LECTURES_README], ids=["README", "lectures-README"])
def test_reading_path_lists_every_lecture_and_assignment_in_order(path):
    entries = _reading_path(path)
    lectures = sorted(p.stem for p in (ROOT / "lectures").glob("[0-9][0-9]*_*.ipynb"))
    assert [e for e in lectures + _assignments() if e not in entries] == [], f"{path.name}: missing from the path"
    assert len(entries) == len(set(entries)), f"{path.name}: listed twice"
    at = {e: i for i, e in enumerate(entries)}
    assert at["05_triton_kernels"] < at["05a_triton_primer"] < at["05b_profiling"] < at["a3_triton"] < at["a3b_triton_backward"]
    assert at["06_fa3_hopper"] < at["a7_gluon"]
    assert at["01_softmax"] < at["a1_attention"] < at["02_io_awareness"]
    assert at["04_backward_recomputation"] < at["a2_flash_numpy"] < at["05_triton_kernels"]
    assert at["07_decoding"] < at["a4_decoding"] and at["06_fa3_hopper"] < at["a4_decoding"]  # a4's LPT bonus
    assert at["08_paged_attention"] < at["a5_paged"] and at["10_ring_attention"] < at["a6_ring"]


@pytest.mark.parametrize("path", [README, LECTURES_README], ids=["README", "lectures-README"])
def test_an_assignment_row_that_names_graded_functions_names_them_all(path):
    """A reading-path row that lists some of an assignment's graded functions lists every one (a5's
    copy-on-write pair, a6's backward step)."""
    from autograder.specs import load
    rows = {re.search(r"\[`([^`]+)`\]", r).group(1): r for r in path.read_text(encoding="utf-8").splitlines()
            if re.match(r"\| \d+ \|", r)}
    checked = 0
    for aid in _assignments():
        names = {t.split(".", 1)[1] for t in load(aid).tasks}
        named = {n for n in names if f"`{n}`" in rows.get(aid, "")}
        if named:
            checked += 1
            assert named == names, f"{path.name}, {aid}: lists {sorted(named)}, not {sorted(names - named)}"
    assert checked >= 4


def _platform_rows() -> dict[str, set[str]]:
    """The README platform table's lecture rows: 'numpy' and 'triton' -> lecture numbers ('00', '05a', ...)."""
    rows = {}
    for row in README.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| lectures ([0-9a-z, -]+) \(", row)
        if m:
            nums = set()
            for tok in m.group(1).replace(" and ", ", ").split(", "):
                lo, _, hi = tok.partition("-")
                nums |= {f"{i:02d}" for i in range(int(lo), int(hi) + 1)} if hi else {tok}
            rows["triton" if "Triton" in row.split("|")[1] else "numpy"] = nums
    return rows


PROBE = """
import json, sys
sys.modules["triton"] = None  # as on macOS or Windows: any import of Triton fails
out = {}
for name, code in json.loads(sys.argv[1]).items():
    try:
        exec(code, {})
        out[name] = "ok"
    except ImportError as e:
        out[name] = repr(e)
print(json.dumps(out))
"""


def _uses_triton(tree: ast.AST) -> bool:
    """Imports Triton or ``reference.triton``, or asks for a Triton/Gluon local step (``step="triton"``)."""
    for n in ast.walk(tree):
        mods = [a.name for a in n.names] if isinstance(n, ast.Import) else \
            [n.module or ""] if isinstance(n, ast.ImportFrom) else []
        if any(m.split(".")[0] == "triton" or m.startswith("reference.triton") for m in mods):
            return True
        if isinstance(n, ast.keyword) and n.arg == "step" and isinstance(n.value, ast.Constant) \
                and n.value.value in ("triton", "gluon"):
            return True
    return False


def test_platform_table_says_which_lectures_need_triton():
    """The table's Triton row holds the lectures that use Triton, its NumPy row the others, whose imports
    are run here with ``triton`` blocked (as on macOS or Windows); every lecture is in exactly one row."""
    rows = _platform_rows()
    assert set(rows) == {"numpy", "triton"} and not rows["numpy"] & rows["triton"]
    without = {}
    for src in sorted((ROOT / "lectures" / "src").glob("[0-9][0-9]*_*.py")):
        num = src.stem.split("_")[0]
        tree = ast.parse(src.read_text(encoding="utf-8"))
        row = "triton" if _uses_triton(tree) else "numpy"
        assert num in rows[row], f"{src.name} belongs in the platform table's {row} row"
        if row == "numpy":
            without[num] = "\n".join(ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps(without)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True)
    failed = {n: r for n, r in json.loads(res.stdout.strip().splitlines()[-1]).items() if r != "ok"}
    assert len(without) >= 5 and failed == {}, f"these lectures do not import without Triton: {failed}"


# Development-history labels in these files (and everywhere else) are tests/test_no_history_labels.py's.
