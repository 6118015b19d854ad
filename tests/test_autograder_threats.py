"""The threat registry (``autograder/threats.py``) is the one list of threat ids: docs/design.md §6's table is
generated from it, and the grader's code names a threat only through it (no threat id written as a string)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from autograder import threats

ROOT = Path(__file__).resolve().parent.parent


THREAT_ID = re.compile(r"^T\d+$")


def _table_block(text: str, header: str) -> str:
    """The markdown table that starts at ``header``: its consecutive ``|`` lines."""
    lines = text[text.index(header):].splitlines()
    end = next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))
    return "\n".join(lines[:end])


def test_design_doc_table_is_the_registry():
    doc = (ROOT / "docs/design.md").read_text()
    sec6 = doc[doc.index("## 6. Autograder"):doc.index("## 7.")]
    table = threats.markdown_table()
    header = table.splitlines()[0]
    assert sec6.count(header) == 1, "docs/design.md §6 holds one threat table"
    assert _table_block(sec6, header) == table, "regenerate docs/design.md §6's table: threats.markdown_table()"
    assert re.findall(r"^\| (T\d+) \|", sec6, re.M) == [t.id for t in threats.THREATS]
    for t in threats.THREATS:            # each states a guarantee and a limit
        assert t.guarantee.strip() and t.limit.strip() and t.attack.strip() and t.name.strip()


def threat_id_literals(source: str) -> list[tuple[int, str]]:
    """``(line, column, text)`` of every string constant in ``source`` that is a bare threat id ("T10")."""
    return sorted((node.lineno, node.col_offset, node.value) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and THREAT_ID.match(node.value))


def test_threat_id_literal_finder_sees_every_spelling():
    src = 'A = {"x": "T10"}\nf("T3", t=\'T17\')\ns = "T10 and more"\nd = """T4"""\n'
    assert [(line, text) for line, _, text in threat_id_literals(src)] == [(1, "T10"), (2, "T3"), (2, "T17"), (4, "T4")]


def test_grader_code_names_threats_only_through_the_registry():
    """Outside ``threats.py`` a threat id is a registry name (``threats.T10`` / ``from .threats import T10``),
    never a string: a misspelt id fails at import instead of flagging an unknown threat."""
    assert [t.id for t in threats.THREATS] == [f"T{i}" for i in range(1, len(threats.THREATS) + 1)]
    assert all(getattr(threats, t.id) == t.id for t in threats.THREATS)
    found = []
    for path in sorted((ROOT / "autograder").rglob("*.py")):
        if "submissions" in path.parts or path.name == "threats.py":
            continue
        where = path.relative_to(ROOT)
        found += [f"{where}:{line}: {text!r}" for line, _, text in threat_id_literals(path.read_text())]
    assert not found, "threat ids written as strings (use autograder.threats' names):\n" + "\n".join(found)


def test_engine_zeroes_exactly_the_registry_zeroing_threats():
    from autograder import engine
    assert engine.ZEROING == threats.ZEROING
    assert {"T10", "T17"} <= threats.ZEROING and not {"T5", "T12", "T20"} & threats.ZEROING
    assert threats.explain("T17") and threats.explain("T99") == ""
