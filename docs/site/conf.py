"""Sphinx configuration of the course website (used by `docs/site/build.py`, which passes `-c docs/site`).

The sources are not read from the repository directly: `build.py` stages them (lectures, assignment READMEs,
docs/, the landing page) into `build/site-src/` with links rewritten, and points Sphinx at that folder.
"""

import shutil
import sys
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_site import load_settings  # noqa: E402

_settings = load_settings()

project = "Fast attention, from NumPy to PagedAttention"
author = "the course authors"
copyright = "the course authors"

extensions = ["myst_nb", "sphinx.ext.githubpages"]  # githubpages: writes .nojekyll, so Pages serves _static/

# The notebooks are built with their committed outputs: nothing is executed.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 4
myst_dmath_double_inline = True

# The staging folder holds the original notebooks under `_notebooks/` (offered for download) next to the pages.
exclude_patterns = ["_notebooks/**", "**/*_solution*", ".ipynb_checkpoints"]
# Cosmetic warnings of the repository's Markdown (a table cell starting with a heading level the page skips);
# broken links and missing references are still errors under `-W`.
suppress_warnings = ["myst.header"]

html_theme = "sphinx_book_theme"
html_title = "Fast attention"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_favicon = "favicon.svg"  # without one, browsers ask the host for /favicon.ico and log a 404
# The theme's light/dark switch starts from this mode; left empty, its script logs an error on a first visit.
html_context = {"default_mode": "auto"}
html_last_updated_fmt = None
html_show_sourcelink = False
html_copy_source = False

html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": not _settings.is_placeholder,
    "repository_url": _settings.repository,
    "repository_branch": _settings.branch,
    "navigation_with_keys": False,
    "navbar_persistent": [],
}

# Math is typeset in the browser by a MathJax copy shipped inside the site (no CDN): the files come from the
# pinned `sphinx-mathjax-offline` wheel, copied by `_copy_mathjax` below.
mathjax_path = "mathjax/tex-chtml.js"
_MATHJAX_PARTS = ("tex-chtml.js", "input", "output", "ui", "a11y", "sre", "adaptors")


def _mathjax_dir() -> Path:
    dist = metadata.distribution("sphinx-mathjax-offline")
    for f in dist.files or ():
        if f.name == "tex-chtml.js":
            return Path(dist.locate_file(f)).parent
    raise RuntimeError("sphinx-mathjax-offline is installed without its MathJax files")


def _copy_mathjax(app, exc):
    if exc is not None or app.builder.format != "html":
        return
    src, dst = _mathjax_dir(), Path(app.outdir) / "_static" / "mathjax"
    for part in _MATHJAX_PARTS:
        s = src / part
        if s.is_dir():
            shutil.copytree(s, dst / part, dirs_exist_ok=True)
        else:
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, dst / part)


def setup(app):
    _mathjax_dir()  # fail early, before the build, when the MathJax files are missing
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
