"""``make slides`` (``lectures.slides``): a lecture becomes a reveal.js deck with its plots that loads nothing
from the network. One deck is built (lecture 01) and opened in headless Chromium with every host name unresolvable:
reveal.js must initialise, MathJax must typeset, the figures must be there."""
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from lectures.slides import build, remote_loads, slide_types

REPO = Path(__file__).resolve().parent.parent
LECTURE = REPO / "lectures" / "01_softmax.ipynb"


def test_slide_types_follow_the_sections():
    nb = nbformat.read(LECTURE, as_version=4)
    types = [c.metadata["slideshow"]["slide_type"] for c in slide_types(nb).cells]
    sections = sum(1 for c in nb.cells if c.cell_type == "markdown" and c.source.lstrip().startswith("## "))
    assert types[0] == "slide" and types.count("slide") == sections + (0 if nb.cells[0].source.startswith("## ") else 1)
    assert set(types) <= {"slide", "subslide", "-"}
    assert "slideshow" not in nbformat.read(LECTURE, as_version=4).cells[0].metadata   # the notebook is untouched


def test_remote_loads_finds_what_a_page_would_fetch():
    page = ('<script src="https://cdn.example/x.js"></script><link rel="stylesheet" href="//cdn.example/a.css">'
            '<style>@import "https://f.example/font.css"; .a{background:url(https://i.example/b.png)}</style>'
            '<script type="module">import m from "https://cdn.example/m.mjs";</script>'
            '<script>require({waitSeconds: 15}, ["https://cdn.example/reveal.js", "lib/x.js"], function(){})</script>'
            '<a href="https://arxiv.org/abs/2205.14135">the paper</a><img src="data:image/png;base64,AAAA">')
    assert remote_loads(page) == ["//cdn.example/a.css", "https://cdn.example/m.mjs", "https://cdn.example/reveal.js",
                                  "https://cdn.example/x.js", "https://f.example/font.css", "https://i.example/b.png"]


@pytest.fixture(scope="module")
def deck(tmp_path_factory):
    out = tmp_path_factory.mktemp("slides")
    try:
        (path,) = build(["01_softmax"], out)
    except RuntimeError as e:   # no route to PyPI for the pinned reveal.js / MathJax wheels
        if "pip download" not in str(e):
            raise
        pytest.skip(f"the slide libraries could not be fetched from PyPI: {str(e)[:300]}")
    return path


def test_the_deck_loads_nothing_remote_and_ships_its_libraries(deck):
    html = deck.read_text()
    assert remote_loads(html) == []
    assert "https://cdnjs" not in html and "unpkg.com" not in html
    local = set(re.findall(r'(?:src|href)="(lib/[^"?]+)', html)) | set(re.findall(r'"(lib/reveal\.js/[^"]+)"', html))
    assert {"lib/jquery/dist/jquery.min.js", "lib/requirejs/require.js", "lib/mathjax/MathJax.js"} <= local
    assert all((deck.parent / (p if p.endswith((".js", ".css")) else p + ".js")).exists() for p in local), local
    nb = nbformat.read(LECTURE, as_version=4)
    pngs = sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
    assert pngs and html.count("data:image/png;base64,") >= pngs


def test_the_deck_runs_offline_in_headless_chromium(deck, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed")
    p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
                        "--virtual-time-budget=15000", "--dump-dom", deck.as_uri()],
                       capture_output=True, text=True, timeout=180)
    dom = p.stdout
    assert re.search(r'class="reveal [^"]*\bready\b', dom), "reveal.js did not initialise"
    assert dom.count("MathJax_Display") + dom.count('class="MathJax"') > 5, "MathJax did not typeset the formulas"
    nb = nbformat.read(LECTURE, as_version=4)
    sections = sum(1 for c in nb.cells if c.cell_type == "markdown" and c.source.lstrip().startswith("## "))
    assert len(re.findall(r"<section\b", dom)) > sections
