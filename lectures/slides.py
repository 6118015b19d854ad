"""Slide decks of the executed lectures: ``python -m lectures.slides [NN ...] [--out build/slides]`` (``make slides``).

Each ``lectures/NN_topic.ipynb`` becomes ``NN_topic.slides.html``, a reveal.js deck through nbconvert's
``SlidesExporter``, with the notebook's outputs (plots are embedded PNGs). The notebooks carry no slide
metadata: it is derived here, on a copy (``slide_types``): the title cell and every cell that starts a ``## ``
section begin a slide, a ``### `` subsection a vertical sub-slide, every other cell continues the slide
(scrollable, since a lecture section is longer than a screen).

Offline: the decks load nothing from the network when viewed. reveal.js 4 (the layout nbconvert's template
reads), RequireJS (the template loads reveal.js through it), jQuery (its scroll code) and MathJax 2 (the
template configures ``MathJax.Hub``) come from pinned PyPI wheels (``VENDOR``), downloaded once into
``build/slides-vendor`` without installing them, and the parts a deck uses are copied to ``<out>/lib/``; the exporter's URLs point there, relative to the deck, so the folder
can be zipped and opened anywhere. ``remote_loads`` lists what a page would fetch from another host (scripts,
stylesheets, images, RequireJS modules, CSS ``url()``/``@import``), and ``build`` refuses a deck that has any.
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat

LECTURES = Path(__file__).resolve().parent
ROOT = LECTURES.parent
#: where each script a deck loads comes from: a pinned wheel on PyPI (the index ``make setup`` already uses) and,
#: per package, the folder inside the wheel and the parts of it a deck needs. reveal.js 4 is the copy that
#: sphinx-revealjs ships, RequireJS and jQuery nbclassic's, MathJax 2 (HTML-CSS output, STIX-Web fonts, the
#: configuration the classic notebook used) jupyter-server-mathjax's.
VENDOR = {
    "reveal.js": ("sphinx-revealjs==2.9.3", "sphinx_revealjs/themes/sphinx_revealjs/static/revealjs4/",
                  ("dist/", "plugin/notes/")),
    "requirejs": ("nbclassic==1.3.3", "nbclassic/static/components/requirejs/", ("require.js",)),
    "jquery": ("nbclassic==1.3.3", "nbclassic/static/components/jquery/", ("dist/jquery.min.js",)),
    "mathjax": ("jupyter-server-mathjax==0.2.6", "jupyter_server_mathjax/static/",
                ("MathJax.js", "LICENSE", "config/", "extensions/", "jax/input/TeX/", "jax/output/HTML-CSS/",
                 "jax/element/", "localization/en/", "fonts/HTML-CSS/STIX-Web/woff/")),
}


def slide_types(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` with ``metadata.slideshow.slide_type`` on every cell (module docstring)."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(nb.cells):
        first = cell.source.lstrip().split("\n", 1)[0] if cell.cell_type == "markdown" else ""
        if i == 0 or first.startswith("## "):
            kind = "slide"
        elif first.startswith("### "):
            kind = "subslide"
        else:
            kind = "-"
        cell.setdefault("metadata", {})["slideshow"] = {"slide_type": kind}
    return nb


def vendor(cache: Path) -> Path:
    """The wheels of ``VENDOR`` in ``cache`` (downloaded once with pip, no dependencies, nothing installed);
    raises with the command if pip cannot fetch them."""
    cache.mkdir(parents=True, exist_ok=True)
    wanted = sorted({spec for spec, _, _ in VENDOR.values()})
    missing = [spec for spec in wanted if not _wheel(cache, spec)]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(cache),
               *missing]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0 or any(not _wheel(cache, spec) for spec in missing):
            raise RuntimeError(f"make slides fetches reveal.js, RequireJS, jQuery and MathJax once from PyPI: "
                               f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return cache


def _wheel(cache: Path, spec: str):
    name, version = spec.split("==")
    found = sorted(cache.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def copy_lib(cache: Path, out: Path) -> None:
    """The parts of each vendored package a deck loads into ``out/lib/<package>/``."""
    import zipfile
    for pkg, (spec, prefix, parts) in VENDOR.items():
        dst_root = out / "lib" / pkg
        if (dst_root / ".complete").exists():
            continue
        with zipfile.ZipFile(_wheel(cache, spec)) as z:
            for member in z.namelist():
                rel = member[len(prefix):] if member.startswith(prefix) else None
                if rel and not member.endswith("/") and any(rel == p or (p.endswith("/") and rel.startswith(p))
                                                            for p in parts):
                    dst = dst_root / rel
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_bytes(z.read(member))
        (dst_root / ".complete").write_text(spec)


_LOADS = (r"<script[^>]*\bsrc\s*=\s*[\"']([^\"']+)", r"<link[^>]*\bhref\s*=\s*[\"']([^\"']+)",
          r"<img[^>]*\bsrc\s*=\s*[\"']([^\"']+)", r"url\(\s*[\"']?([^\"')]+)", r"@import\s+[\"']([^\"']+)",
          r"\bimport\b[^;'\"]*?\bfrom\s*[\"']([^\"']+)", r"\bimport\s*\(\s*[\"']([^\"']+)")
# nbconvert's template imports Mermaid from a CDN in every page; the lectures draw no Mermaid diagram
_MERMAID = re.compile(r"<script type=\"module\">\s*import mermaid from [^<]*</script>\s*", re.S)


def remote_loads(html: str) -> list:
    """What the page would fetch from another host when opened: script, stylesheet and image sources, CSS
    ``url()``/``@import``, and the module URLs of ``require([...])`` calls (hyperlinks are not loads)."""
    found = [u for pat in _LOADS for u in re.findall(pat, html, re.I)]
    for block in re.findall(r"require\s*\(\s*\{.*?\}\s*,\s*\[(.*?)\]", html, re.S):
        found += re.findall(r"[\"']([^\"']+)[\"']", block)
    return sorted({u for u in found if re.match(r"(?:https?:)?//", u.strip())})


def build(names=(), out: Path = ROOT / "build" / "slides", cache: Path = ROOT / "build" / "slides-vendor") -> list:
    """Write a deck per lecture (those whose file name contains one of ``names``; all by default) into ``out``;
    return their paths."""
    import nbconvert
    from nbconvert import SlidesExporter
    # the templates of the environment nbconvert is installed in (a venv layered on another finds them there)
    data = Path(nbconvert.__file__).resolve().parents[4] / "share" / "jupyter"
    if data.is_dir() and str(data) not in os.environ.get("JUPYTER_PATH", "").split(os.pathsep):
        os.environ["JUPYTER_PATH"] = os.pathsep.join(x for x in (str(data), os.environ.get("JUPYTER_PATH")) if x)
    nbs = sorted(LECTURES.glob("[0-9][0-9]*_*.ipynb"))
    if names:
        nbs = [p for p in nbs if any(n in p.name for n in names)]
        if not nbs:
            raise ValueError(f"no lecture notebook matches {list(names)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copy_lib(vendor(Path(cache)), out)
    exporter = SlidesExporter(reveal_url_prefix="lib/reveal.js", reveal_scroll=True, reveal_theme="white",
                              reveal_transition="none", require_js_url="lib/requirejs/require.js",
                              jquery_url="lib/jquery/dist/jquery.min.js",
                              mathjax_url="lib/mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe",
                              font_awesome_url="")
    written = []
    for p in nbs:
        nb = nbformat.read(p, as_version=4)
        html, _ = exporter.from_notebook_node(slide_types(nb))
        if not any("```mermaid" in c.source for c in nb.cells):
            html = _MERMAID.sub("", html)
        remote = remote_loads(html)
        if remote:
            raise RuntimeError(f"{p.name}: the deck would load {remote[:5]} from the network")
        dst = out / f"{p.stem}.slides.html"
        dst.write_text(html, encoding="utf-8")
        written.append(dst)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lectures.slides", description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="lectures whose file name contains one of these (default: all)")
    ap.add_argument("--out", default=str(ROOT / "build" / "slides"), help="folder for the decks and lib/")
    args = ap.parse_args(argv)
    for p in build(args.names, Path(args.out)):
        print(f"wrote {p}")
    print(f"open {Path(args.out).resolve()}/<lecture>.slides.html in a browser (offline: everything is in lib/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
