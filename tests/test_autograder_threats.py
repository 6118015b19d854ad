"""The threat registry (``autograder/threats.py``) is the one list of threat ids: docs/design.md §6's table is
generated from it, and every threat id the grader writes is registered."""
from __future__ import annotations

import re
from pathlib import Path

from autograder import threats

ROOT = Path(__file__).resolve().parent.parent


def test_design_doc_table_is_the_registry():
    doc = (ROOT / "docs/design.md").read_text()
    sec6 = doc[doc.index("## 6. Autograder"):doc.index("## 7.")]
    assert threats.markdown_table() in sec6, "regenerate docs/design.md §6's table: threats.markdown_table()"
    rows = re.findall(r"^\| (T\d+) \|", sec6, re.M)
    assert rows == [t.id for t in threats.THREATS]
    for t in threats.THREATS:            # each states a guarantee and a limit
        assert t.guarantee.strip() and t.limit.strip() and t.attack.strip() and t.name.strip()


def test_every_threat_id_in_the_grader_is_registered():
    ids = set(threats.BY_ID)
    assert [t.id for t in threats.THREATS] == [f"T{i}" for i in range(1, len(ids) + 1)]
    for path in (ROOT / "autograder").rglob("*.py"):
        if "submissions" in path.parts:
            continue
        for tid in re.findall(r"[\"'](T\d+)[\"']", path.read_text()):
            assert tid in ids, f"{path.relative_to(ROOT)} names an unregistered threat {tid}"


def test_engine_zeroes_exactly_the_registry_zeroing_threats():
    from autograder import engine
    assert engine.ZEROING == threats.ZEROING
    assert {"T10", "T17"} <= threats.ZEROING and not {"T5", "T12", "T20"} & threats.ZEROING
    assert threats.explain("T17") and threats.explain("T99") == ""
