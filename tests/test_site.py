"""The course website (`make site`, docs/site/make_site.py): staging and link rewriting on a made-up repository,
the built-HTML checker on made-up pages, the real build, and the real site in headless Chromium.

The browser tests need Debian's `chromium` and `chromium-driver` (and selenium from requirements.txt); without
them they are skipped with the reason. `make site-test` runs this file on `build/site` and fails instead of
skipping when the browser is missing. Without COURSE_SITE_DIR the site is built once per test run into pytest's
temporary folder (shared by the xdist workers).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest

from assignments.release import REMOVED, solution_regions, strip_leaks
from tests import site_browser

pytestmark = pytest.mark.site
ROOT = Path(__file__).resolve().parents[1]


def _load_make_site():
    spec = importlib.util.spec_from_file_location("make_site", ROOT / "docs/site/make_site.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_site"] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


ms = _load_make_site()


# ---- staging on a made-up repository ----------------------------------------------------------------------------
def _notebook(*markdown: str) -> dict:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": m} for m in markdown]
    cells.append({"cell_type": "code", "metadata": {}, "execution_count": 1, "outputs": [], "source": "1 + 1"})
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _fake_repo(root: Path, lecture_md: str = "", docs_md: str = "") -> Path:
    files = {
        "pyproject.toml": '[project]\nname = "x"\n[tool.course-site]\nrepository = "https://github.com/acme/course"\n',
        "lectures/00_intro.ipynb": json.dumps(_notebook(
            "# Lecture 0 - Intro\n\n## Learning objectives\n\nAfter it you can:\n\n- explain the online softmax\n"
            "- derive the merge rule\n  of two states\n\n## Next\n\nbody",
            lecture_md or "See [the notes](../docs/notes.md#the-part) and [the code](../reference/mod.py).")),
        "lectures/01_more.ipynb": json.dumps(_notebook("# Lecture 1 - More\n\nno objectives here")),
        "lectures/README.md": "# Lectures\n\n[first](00_intro.ipynb)\n",
        "docs/notes.md": docs_md or "# Notes\n\n## The part\n\n[lecture](../lectures/00_intro.ipynb) "
                                    '<a href="../lectures/01_more.ipynb#top">raw</a> '
                                    "![plot](../benchmarks/results/cpu-x.png) `[in code](nowhere.md)`\n",
        "docs/quiz_answers.md": "# Answers\n\nsecret\n",
        "docs/quizzes/00_intro.md": "# Quiz: lecture 0\n\n1. Why?\n",
        "docs/design.md": "# Design\n",
        "docs/results.md": "# Measured numbers\n",
        "assignments/README.md": "# Assignments\n\n[a1](a1/)\n",
        "assignments/a1/README.md": "# A1\n\nOpen [`a1.ipynb`](a1.ipynb); the [solution](a1_solution.py).\n",
        "assignments/a1/a1.ipynb": json.dumps(_notebook("# a1 stub")),
        "assignments/a1/a1_solution.py": "SECRET = 42\n",
        "reference/mod.py": "x = 1\n",
        "benchmarks/results/cpu-x.png": "png",
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_staging_links_pages_copies_images_and_leaves_solutions_out(tmp_path):
    repo = _fake_repo(tmp_path / "repo")
    stage = tmp_path / "stage"
    sources = ms.stage(stage, repo)
    assert sources.lectures == ["lectures/00_intro.ipynb", "lectures/01_more.ipynb"]
    assert "docs/quiz_answers.md" not in sources.documents and not (stage / "docs/quiz_answers.md").exists()
    staged = sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file())
    assert not [p for p in staged if "solution" in p]
    assert not any("SECRET" in p.read_text(errors="ignore") for p in stage.rglob("*") if p.is_file())

    nb = json.loads((stage / "lectures/00_intro.ipynb").read_text())
    first, second = (c["source"] for c in nb["cells"][:2])
    assert first.startswith("# Lecture 0 - Intro\n\n```{container} course-links\n")
    assert "{download}`Download the notebook <../_notebooks/lectures/00_intro.ipynb>`" in first
    assert ("[Open in Colab](https://colab.research.google.com/github/acme/course/blob/main/lectures/00_intro.ipynb)"
            in first)
    assert first.endswith("[Quiz](../docs/quizzes/00_intro.md)\n```\n\n## Learning objectives\n\nAfter it you can:\n\n"
                          "- explain the online softmax\n- derive the merge rule\n  of two states\n\n## Next\n\nbody")
    assert "Quiz" not in json.loads((stage / "lectures/01_more.ipynb").read_text())["cells"][0]["source"]
    assert json.loads((stage / "_notebooks/lectures/00_intro.ipynb").read_text()) == json.loads(
        (repo / "lectures/00_intro.ipynb").read_text())
    assert ms.objectives_of(nb) == ["explain the online softmax", "derive the merge rule of two states"]
    assert ms.objectives_of(json.loads((stage / "lectures/01_more.ipynb").read_text())) == []
    # a page keeps its relative link (and anchor); a file the site does not carry goes to the repository
    assert "[the notes](../docs/notes.md#the-part)" in second
    assert "[the code](https://github.com/acme/course/blob/main/reference/mod.py)" in second

    notes = (stage / "docs/notes.md").read_text()
    assert '<a href="../lectures/01_more.html#top">raw</a>' in notes
    assert "[lecture](../lectures/00_intro.ipynb)" in notes and "`[in code](nowhere.md)`" in notes
    assert "![plot](../benchmarks/results/cpu-x.png)" in notes and (stage / "benchmarks/results/cpu-x.png").exists()
    a1 = (stage / "assignments/a1/README.md").read_text()
    assert "{download}`a1.ipynb <a1.ipynb>`" in a1 and (stage / "assignments/a1/a1.ipynb").exists()
    assert "the solution (not part of the site)" in a1
    assert "[a1](a1/README.md)" in (stage / "assignments/README.md").read_text()

    landing = (stage / "index.md").read_text()
    assert "1. [Lecture 0 - Intro](lectures/00_intro.ipynb)\n2. [Lecture 1 - More](lectures/01_more.ipynb)" in landing
    assert ":caption: Lectures\n\nReading path <lectures/README>\nlectures/00_intro\nlectures/01_more\n" in landing
    assert "Answers" not in landing and "{{" not in landing
    assert ":caption: Quizzes\n\ndocs/quizzes/00_intro\n```" in landing
    assert "- Quizzes, one per lecture: [00](docs/quizzes/00_intro.md)\n" in landing
    assert "A [quiz](docs/quizzes/00_intro.md) per lecture" in landing
    assert "```{figure} ../benchmarks/results/cpu-x.png" in (stage / "docs/results.md").read_text()


def test_graded_code_is_filtered_from_lectures_and_stops_a_page(tmp_path):
    """The site shows the lectures as the student release ships them; a README showing a solution fails."""
    solution = (ROOT / "assignments/a2_flash_numpy/a2_flash_numpy_solution.py").read_text()
    graded = solution.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
    repo = _fake_repo(tmp_path / "repo")
    nb = json.loads((repo / "lectures/01_more.ipynb").read_text())
    nb["cells"][-1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": graded}]
    (repo / "lectures/01_more.ipynb").write_text(json.dumps(nb))
    stage = tmp_path / "stage"
    ms.stage(stage, repo)
    for staged in (stage / "lectures/01_more.ipynb", stage / "_notebooks/lectures/01_more.ipynb"):
        out = json.loads(staged.read_text())["cells"][-1]["outputs"]
        assert out[0]["text"].startswith(REMOVED.split("(")[0]), staged
    assert not any(graded.strip().splitlines()[0].strip() in p.read_text(errors="ignore")
                   for p in stage.rglob("*") if p.is_file())
    with (repo / "docs/notes.md").open("a") as f:
        f.write("\n```python\n" + graded + "\n```\n")
    with pytest.raises(ms.SiteError, match="docs/notes.md shows graded code"):
        ms.stage(stage, repo)


@pytest.mark.parametrize("bad, why", [
    ("[gone](../docs/missing.md)", "docs/missing.md, which does not exist"),
    ("![gone](missing.png)", "lectures/missing.png, which does not exist"),
    ("[out](../../elsewhere.md)", "points outside the repository"),
    ('<img src="../benchmarks/results/nope.png">', "benchmarks/results/nope.png, which does not exist"),
])
def test_a_broken_link_fails_the_staging_and_names_it(tmp_path, bad, why):
    repo = _fake_repo(tmp_path / "repo", lecture_md=f"text {bad} text")
    with pytest.raises(ms.SiteError) as e:
        ms.stage(tmp_path / "stage", repo)
    assert "lectures/00_intro.ipynb" in str(e.value) and why in str(e.value)


def test_the_repository_url_is_one_setting_with_a_placeholder_default(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    s = ms.load_settings(tmp_path)
    assert s.is_placeholder and s.repository == ms.PLACEHOLDER_REPOSITORY
    (tmp_path / "pyproject.toml").write_text('[tool.course-site]\nrepository = "https://gitlab.com/a/b"\n')
    s = ms.load_settings(tmp_path)
    assert s.colab("lectures/x.ipynb") is None and s.blob("docs") == "https://gitlab.com/a/b/blob/main/docs"
    (tmp_path / "pyproject.toml").write_text('[tool.course-site]\nrepository = "not a url"\n')
    with pytest.raises(ms.SiteError, match="repository"):
        ms.load_settings(tmp_path)


# ---- the built-HTML checker on made-up pages --------------------------------------------------------------------
def test_check_site_finds_outside_loads_missing_files_and_anchors(tmp_path):
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static/ok.css").write_text("body { background: url('img.png') }")
    (tmp_path / "_static/bad.css").write_text("@import 'https://fonts.example.org/x.css';")
    (tmp_path / "b.html").write_text('<h1 id="top">B</h1>')
    (tmp_path / "a.html").write_text(
        '<script src="_static/x.js"></script><script src="https://cdn.example.org/m.js"></script>'
        '<link rel="stylesheet" href="//cdn.example.org/s.css"><img src="data:image/png;base64,AA==">'
        '<a href="b.html#top">ok</a><a href="b.html#nope">x</a><a href="c.html">x</a>'
        '<a href="https://example.org/">a link is not a load</a><a href="#here" id="here">self</a>')
    problems = ms.check_site(tmp_path)
    assert sorted(problems) == sorted([
        "a.html: loads _static/x.js, which is not in the site",
        "a.html: loads https://cdn.example.org/m.js from outside the site",
        "a.html: loads //cdn.example.org/s.css from outside the site",
        "a.html: link b.html#nope points to a missing anchor",
        "a.html: link c.html points to a missing file",
        "_static/bad.css: loads https://fonts.example.org/x.css from outside the site",
    ])
    (tmp_path / "_static/x.js").write_text("")
    for p in ("_static/bad.css",):
        (tmp_path / p).unlink()
    (tmp_path / "a.html").write_text('<script src="_static/x.js"></script><a href="b.html#top">ok</a>')
    assert ms.check_site(tmp_path) == []


# ---- the real site ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The built site: COURSE_SITE_DIR (make site-test), else built once per run into pytest's temp folder."""
    given = os.environ.get("COURSE_SITE_DIR")
    if given:
        out = Path(given).resolve()
        if not (out / "index.html").exists():
            pytest.fail(f"COURSE_SITE_DIR={given} holds no built site: run `make site` first")
        return out
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # one build for all workers
    out = root / "course-site" / "html"
    with FileLock(str(root / "course-site.lock")):
        if not (out / "index.html").exists():
            ms.build(out, root / "course-site" / "src", jobs="1")
    return out


def _lectures() -> list[str]:
    return ms.discover(ROOT).lectures


def _page(path: str) -> str:
    return str(Path(path).with_suffix(".html"))


def test_every_lecture_has_a_page_with_its_download_and_colab_links(site):
    """Each lecture's page, its download (the notebook as the student release ships it) and its Colab link."""
    settings, regions = ms.load_settings(ROOT), solution_regions()
    for path in _lectures():
        html = (site / _page(path)).read_text()
        nb = json.loads((ROOT / path).read_text())
        title = ms.title_of("\n".join(ms.notebook_markdown(nb)), "")
        assert title and f"<title>{title}" in html.replace("&#8212;", "—"), path
        link = re.search(r'<a class="reference download internal"[^>]*href="([^"]+)"', html)
        assert link, f"{path}: no download link"
        shipped = (site / Path(path).parent / link[1]).resolve().read_text()
        assert shipped == strip_leaks((ROOT / path).read_text(), regions), f"{path}: not the release's notebook"
        colab = settings.colab(path)
        assert colab is None or f'href="{colab}"' in html, path
    # the results page shows every committed plot
    results = (site / "docs/results.html").read_text()
    for png in sorted((ROOT / "benchmarks/results").glob("*.png")):
        assert png.name in results, png.name


# ---- the real site in headless Chromium -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    missing = site_browser.browser_missing()
    if missing:
        if os.environ.get("COURSE_SITE_REQUIRE_BROWSER"):
            pytest.fail(f"the browser test cannot run: {missing}")
        pytest.skip(f"browser test skipped: {missing}")
    driver = site_browser.chromium()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def base_url(site):
    with site_browser.serve(site) as url:
        yield url


def _pages(site: Path) -> list[str]:
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if p.relative_to(site).parts[0] not in ("_static", "_sources"))


SMART_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def _plain_start(text: str) -> str:
    """The words an objective starts with, before any markup (code, math, emphasis, links)."""
    return re.split(r"[`$*_\[\\]", text, maxsplit=1)[0].strip()


def test_every_page_loads_clean_with_images_and_math(site, browser, base_url):
    problems = []
    site_browser.requested_urls(browser), site_browser.console_errors(browser)  # drain
    lectures = {_page(p): p for p in _lectures()}
    for page in _pages(site):
        browser.get(base_url + page)
        site_browser.wait_loaded(browser)
        for e in site_browser.console_errors(browser):
            problems.append(f"{page}: console error {e}")
        for u in site_browser.requested_urls(browser):
            if not u.startswith((base_url, "data:", "blob:")):
                problems.append(f"{page}: requested {u} from outside the site")
        broken = browser.execute_script(
            "return Array.from(document.images).filter(i => !(i.naturalWidth > 0)).map(i => i.src)")
        problems += [f"{page}: image {src} did not load" for src in broken]
        math = browser.execute_script(
            "const m = Array.from(document.querySelectorAll('.math'));"
            "return [m.length, m.filter(e => !e.querySelector('mjx-container')).length,"
            "        document.querySelectorAll('mjx-merror').length]")
        if math[1] or math[2]:
            problems.append(f"{page}: {math[1]} of {math[0]} formulas not typeset, {math[2]} MathJax errors")
        if page in lectures:
            nb = json.loads((ROOT / lectures[page]).read_text())
            if re.search(r"\$[^$\n]+\$", "\n".join(ms.notebook_markdown(nb))) and not math[0]:
                problems.append(f"{page}: the lecture's formulas are not on its page")
            text = " ".join(browser.execute_script("return document.body.innerText").split())
            text = text.translate(SMART_QUOTES)   # Sphinx typesets ' and " as curly quotes
            for obj in ms.objectives_of(nb):
                start = _plain_start(obj)
                if len(start.split()) >= 2 and " ".join(start.split()) not in text:
                    problems.append(f"{page}: learning objective {obj!r} not shown")
    assert not problems, "\n".join(problems)


def test_navigation_reaches_every_lecture_from_the_landing_page(browser, base_url):
    from selenium.webdriver.common.by import By

    want = [base_url + _page(p) for p in _lectures()]
    browser.get(base_url + "index.html")
    site_browser.wait_loaded(browser)
    nav = browser.execute_script(
        "return Array.from(document.querySelectorAll('nav.bd-docs-nav a')).map(a => a.href.split('#')[0])")
    assert not [u for u in want if u not in nav], "lectures missing from the landing page's navigation"
    # a reader clicking "next" from the landing page walks through every lecture, in order
    visited = []
    for _ in range(200):
        nxt = browser.find_elements(By.CSS_SELECTOR, "a.right-next")
        if not nxt or set(want) <= set(visited):
            break
        browser.execute_script("arguments[0].scrollIntoView()", nxt[0])
        nxt[0].click()
        site_browser.wait_loaded(browser)
        visited.append(browser.current_url.split("#")[0])
    order = [u for u in visited if u in want]
    assert order == want


def _search_words() -> dict[str, str]:
    """For each lecture, a word of its prose that no other lecture's prose has (the most frequent such word)."""
    words = {}
    for p in _lectures():
        text = "\n".join(ms.notebook_markdown(json.loads((ROOT / p).read_text())))
        text = re.sub(r"`[^`]*`|\$[^$]*\$|\([^)]*\)", " ", text)
        words[p] = re.findall(r"\b[a-z]{7,}\b", text.lower())
    out = {}
    for p, ws in words.items():
        others = {w for q, o in words.items() if q != p for w in o}
        unique = sorted({w for w in ws if w not in others}, key=lambda w: (-ws.count(w), w))
        if unique:
            out[p] = unique[0]
    return out


def test_search_finds_each_lecture_by_a_word_of_its_text(browser, base_url):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    words = _search_words()
    assert len(words) >= len(_lectures()) - 1, words
    misses = []
    for n, (lecture, word) in enumerate(words.items()):
        if n == 0:          # the first from the landing page's search button, as a reader starts
            browser.get(base_url + "index.html")
            site_browser.wait_loaded(browser)
            buttons = browser.find_elements(By.CSS_SELECTOR, "button.search-button__button")
            [b for b in buttons if b.is_displayed()][0].click()
        box = WebDriverWait(browser, 10).until(   # then from the results page's own box, as a reader searches again
            lambda d: [i for i in d.find_elements(By.CSS_SELECTOR, "input[name='q']") if i.is_displayed()])[0]
        box.clear()
        box.send_keys(word + Keys.ENTER)
        WebDriverWait(browser, 20).until(lambda d: f"q={word}" in d.current_url and d.execute_script(
            "const s = document.querySelector('#search-results');"
            "return s && /Search finished|did not match/.test(s.innerText)"))
        hits = browser.execute_script(
            "return Array.from(document.querySelectorAll('#search-results li a')).map(a => a.href.split(/[?#]/)[0])")
        if base_url + _page(lecture) not in hits:
            misses.append(f"{word!r} (from {lecture}): results {hits[:5]}")
    assert not misses, "search did not find the lecture:\n" + "\n".join(misses)
