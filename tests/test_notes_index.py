"""``notes/README.md`` indexes every note: each ``notes/*.md`` has a row naming it, and every row names a note
that exists."""
import re
from pathlib import Path

NOTES = Path(__file__).resolve().parent.parent / "notes"


def test_notes_readme_indexes_every_note():
    index = (NOTES / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"^\| `([\w.-]+\.md)` \|", index, flags=re.MULTILINE))
    notes = {p.name for p in NOTES.glob("*.md")} - {"README.md"}
    assert notes - named == set(), f"notes missing from notes/README.md: {sorted(notes - named)}"
    assert named - notes == set(), f"notes/README.md names notes that do not exist: {sorted(named - notes)}"
