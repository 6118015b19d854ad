"""Build the course website: `python docs/site/make_site.py [--out build/site]` (what `make site` runs).

Three steps:
1. Stage: copy what the repository holds into `build/site-src/` with the repository's own layout: the executed
   lecture notebooks (their committed outputs, nothing executed, filtered as the student release filters them:
   an output that shows graded code is replaced by a note), every Markdown page under `lectures/` and `docs/`,
   the assignments' READMEs (never a solution file; a page that shows graded code stops the build), and the
   landing page rendered from `docs/site/index.md`. Pages are found by globbing, so a new lecture or document
   gets a page without an edit here. Each lecture gets a line under its title: download the notebook, open it
   in Colab, its quiz. Every relative link is checked against the repository: a link to a page stays a link, an
   image is copied in, a file the site does not carry becomes a link to it in the repository (`[tool.course-site]
   repository` in pyproject.toml), a solution file becomes plain text, and a link to nothing is an error.
2. Sphinx with MyST-NB (`-W --keep-going -n`: any warning, an unresolved reference or heading anchor included,
   fails the build) writes the HTML.
3. `check_site` reads the built HTML: no page loads a script, style sheet, font or image from outside the site,
   and every internal link and `#anchor` lands on a file and an id that exist.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = Path(__file__).resolve().parent
if str(REPO) not in sys.path:  # run as a script: `assignments` (the release's leak filter) is not installed
    sys.path.insert(1, str(REPO))

from assignments.release import find_leaks, solution_regions, strip_leaks  # noqa: E402

PLACEHOLDER_REPOSITORY = "https://github.com/OWNER/attention-course"
# Files that never become pages: instructor answers, solutions, private notes.
PRIVATE = re.compile(r"answer|solution|private", re.IGNORECASE)
IMAGE_SUFFIXES = {".png", ".svg", ".jpg", ".jpeg", ".gif", ".webp"}
NOTEBOOK_DIR = "_notebooks"  # the notebooks offered for download, excluded from the pages in conf.py


class SiteError(Exception):
    """A problem in the sources (a broken link, a bad setting) that fails the build."""


# --------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    repository: str  # public URL of the repository, e.g. https://github.com/org/name
    branch: str

    @property
    def is_placeholder(self) -> bool:
        return self.repository == PLACEHOLDER_REPOSITORY

    def blob(self, path: str, is_dir: bool = False) -> str:
        return f"{self.repository}/{'tree' if is_dir else 'blob'}/{self.branch}/{path}"

    def colab(self, path: str) -> str | None:
        """Colab opens notebooks of public GitHub repositories only; None for another host."""
        m = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?", self.repository)
        if not m:
            return None
        return f"https://colab.research.google.com/github/{m[1]}/{m[2]}/blob/{self.branch}/{path}"


def load_settings(repo: Path = REPO) -> Settings:
    """`[tool.course-site]` of pyproject.toml: the one place the repository's public URL is set."""
    data = tomllib.loads((repo / "pyproject.toml").read_text())
    conf = data.get("tool", {}).get("course-site", {})
    url = str(conf.get("repository", PLACEHOLDER_REPOSITORY)).rstrip("/")
    if not re.fullmatch(r"https?://[^\s/]+/\S+", url):
        raise SiteError(f"[tool.course-site] repository in pyproject.toml must be an http(s) URL, got {url!r}")
    return Settings(repository=url, branch=str(conf.get("branch", "main")))


# --------------------------------------------------------------------------------------------- discovery


@dataclass
class Sources:
    lectures: list[str]  # lectures/NN_*.ipynb, in file-name order
    lecture_pages: list[str]  # Markdown under lectures/ (the reading path, quizzes ...)
    assignments: list[str]  # assignments/README.md, then assignments/*/README.md
    documents: list[str]  # docs/**/*.md
    pages: set[str] = field(default_factory=set)

    def __post_init__(self):
        self.pages = set(self.lectures + self.lecture_pages + self.assignments + self.documents)


def _rel(p: Path, repo: Path) -> str:
    return p.relative_to(repo).as_posix()


def discover(repo: Path = REPO) -> Sources:
    def keep(paths):
        return sorted(_rel(p, repo) for p in paths if p.is_file() and not PRIVATE.search(_rel(p, repo)))

    lectures = keep(repo.glob("lectures/*.ipynb"))
    lecture_pages = [p for p in keep(repo.glob("lectures/**/*.md")) if not p.startswith("lectures/src/")]
    assignments = keep([repo / "assignments/README.md"]) + keep(repo.glob("assignments/*/README.md"))
    documents = [p for p in keep(repo.glob("docs/**/*.md")) if p != "docs/site/index.md"]
    if not lectures:
        raise SiteError(f"no lecture notebooks under {repo / 'lectures'}")
    return Sources(lectures, lecture_pages, assignments, documents)


def title_of(text: str, fallback: str) -> str:
    m = re.search(r"^#\s+(.+?)\s*#*\s*$", text, re.MULTILINE)
    return m[1].strip() if m else fallback


def notebook_markdown(nb: dict) -> list[str]:
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"] if c["cell_type"] == "markdown"]


# "## Learning objectives", "**Objectives.** After this lecture you can:", "Learning objectives:" ...
OBJECTIVES = re.compile(r"^[#*_\s]*(?:learning\s+)?objectives\b.*$", re.IGNORECASE | re.MULTILINE)


def objectives_of(nb: dict) -> list[str]:
    """The list under a "Learning objectives" (or "Objectives") heading or bold line, if the lecture has one."""
    for text in notebook_markdown(nb):
        m = OBJECTIVES.search(text)
        if not m:
            continue
        items = []
        for line in text[m.end():].lstrip("\n").splitlines():
            b = re.match(r"\s*(?:[-*+]|\d+[.)])\s+(.*)", line)
            if b:
                items.append(b[1].strip())
            elif not line.strip():
                continue
            elif items and line.startswith((" ", "\t")):
                items[-1] += " " + line.strip()
            elif items or line.startswith("#"):
                break
        return items
    return []


# --------------------------------------------------------------------------------------------- links

LINK = re.compile(r"(?P<bang>!?)\[(?P<text>(?:[^\[\]]|\[[^\]]*\])*)\]"  # [text], one level of [] inside
                  r"\((?P<target><[^>]+>|[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
HTML_ATTR = re.compile(r"(?P<attr>\b(?:href|src))=(?P<q>[\"'])(?P<target>[^\"']+)(?P=q)")
CODE = re.compile(r"(^(?P<fence>```|~~~).*?^(?P=fence)[^\n]*$|`[^`\n]+`)", re.MULTILINE | re.DOTALL)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


class Linker:
    """Rewrites the relative links of one staged page so that each lands inside the site or in the repository."""

    def __init__(self, repo: Path, stage: Path, sources: Sources, settings: Settings):
        self.repo, self.stage, self.sources, self.settings = repo, stage, sources, settings
        self.errors: list[str] = []

    def copy_in(self, path: str) -> None:
        dst = self.stage / path
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.repo / path, dst)

    def resolve(self, page: str, target: str, text: str, image: bool) -> str | None:
        """The Markdown that replaces `[text](target)` on `page` (a repository path); None keeps it as is."""
        raw = target[1:-1] if target.startswith("<") else target
        if SCHEME.match(raw) or raw.startswith(("#", "//")):
            return None
        path, _, frag = raw.partition("#")
        path = unquote(path)
        full = posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
        if full.startswith("../") or full == "..":
            self.errors.append(f"{page}: link {raw!r} points outside the repository")
            return None
        abs_path = self.repo / full
        if not abs_path.exists():
            self.errors.append(f"{page}: link {raw!r} points to {full}, which does not exist")
            return None
        if abs_path.is_dir() and f"{full}/README.md" in self.sources.pages:
            full = f"{full}/README.md"
        anchor = f"#{frag}" if frag else ""
        rel = posixpath.relpath(full, posixpath.dirname(page) or ".")
        if full in self.sources.pages:
            return f"[{text}]({rel}{anchor})"
        if PRIVATE.search(full):
            return f"{text} (not part of the site)" if not image else f"`{full}`"
        if abs_path.suffix.lower() in IMAGE_SUFFIXES:
            self.copy_in(full)
            return f"{'!' if image else ''}[{text}]({rel})"
        if abs_path.is_file() and abs_path.suffix == ".ipynb":  # a student notebook: offered for download
            self.copy_in(full)
            plain = text.replace("`", "") or posixpath.basename(full)
            return f"{{download}}`{plain} <{rel}>`"
        return f"[{text}]({self.settings.blob(full, abs_path.is_dir())}{anchor})"

    def rewrite(self, page: str, text: str) -> str:
        code: list[str] = []  # code is set aside (links inside it are left alone), links around it are not

        def hide(m: re.Match) -> str:
            code.append(m[0])
            return f"\x00{len(code) - 1}\x00"

        def show(s: str) -> str:
            return re.sub(r"\x00(\d+)\x00", lambda m: code[int(m[1])], s)

        def link(m: re.Match) -> str:
            new = self.resolve(page, m["target"], show(m["text"]), bool(m["bang"]))
            return m[0] if new is None else new

        def attr(m: re.Match) -> str:
            t = m["target"]
            if SCHEME.match(t) or t.startswith(("#", "//")):
                return m[0]
            new = self.resolve(page, t, "", m["attr"] == "src")
            if new is None:
                return m[0]
            url = re.search(r"\(([^)]*)\)$", new)
            url = url[1] if url else t
            page_url = re.match(r"([^#]*)\.(?:md|ipynb)(#.*)?$", url)
            if page_url and not SCHEME.match(url):  # raw HTML is not resolved by Sphinx: point at the built page
                url = f"{page_url[1]}.html{page_url[2] or ''}"
            return f'{m["attr"]}={m["q"]}{url}{m["q"]}'

        return show(HTML_ATTR.sub(attr, LINK.sub(link, CODE.sub(hide, text))))


# --------------------------------------------------------------------------------------------- staging


def quiz_of(path: str, sources: Sources) -> str | None:
    """The quiz page of a lecture: a page with "quiz" in its path and the lecture's file name (01_softmax.md)."""
    stem = Path(path).stem
    hits = [p for p in sorted(sources.pages) if "quiz" in p.lower() and Path(p).stem == stem]
    return hits[0] if hits else None


def lecture_header(path: str, settings: Settings, quiz: str | None = None) -> str:
    """The line under a lecture's title: its notebook to download, Colab (for GitHub), its quiz if it has one."""
    here = posixpath.dirname(path)
    parts = [f"{{download}}`Download the notebook <{posixpath.relpath(f'{NOTEBOOK_DIR}/{path}', here)}>`"]
    colab = settings.colab(path)
    if colab:
        parts.append(f"[Open in Colab]({colab})")
    if quiz:
        parts.append(f"[Quiz]({posixpath.relpath(quiz, here)})")
    return "\n\n```{container} course-links\n" + " · ".join(parts) + "\n```"


def stage_lecture(path: str, linker: Linker, settings: Settings, regions: list) -> dict:
    """The lecture as the student release ships it (an output that shows graded code replaced by a note),
    offered for download as it is and staged as a page with its links rewritten and the links line added."""
    try:
        shipped = strip_leaks((linker.repo / path).read_text(), regions)
    except ValueError as e:
        raise SiteError(f"{path}: {e}") from None
    (linker.stage / NOTEBOOK_DIR / path).parent.mkdir(parents=True, exist_ok=True)
    (linker.stage / NOTEBOOK_DIR / path).write_text(shipped)
    nb = json.loads(shipped)
    header_done = False
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        src = linker.rewrite(path, src)
        if not header_done:
            m = re.search(r"^#\s+.*$", src, re.MULTILINE)
            if m:
                src = src[:m.end()] + lecture_header(path, settings, quiz_of(path, linker.sources)) + src[m.end():]
                header_done = True
        cell["source"] = src
    if not header_done:
        raise SiteError(f"{path}: no '# title' line in a markdown cell")
    out = linker.stage / path
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(nb, indent=1, ensure_ascii=False))
    return nb


def results_plots(repo: Path) -> str:
    """A section of every committed plot in benchmarks/results/, appended to docs/results.md's page."""
    plots = sorted(repo.glob("benchmarks/results/*.png"))
    if not plots:
        return ""
    out = ["\n\n## Plots\n\nEvery plot in `benchmarks/results/`, as committed, under its file name.\n"]
    for p in plots:
        rel = _rel(p, repo)
        out.append(f"\n```{{figure}} ../{rel}\n:alt: {p.stem}\n:width: 100%\n\n`{rel}`\n```\n")
    return "".join(out)


def md_list(items: list[tuple[str, str]], ordered: bool = False) -> str:
    return "\n".join(f"{f'{i + 1}.' if ordered else '-'} [{t}]({p})" for i, (t, p) in enumerate(items))


# Titles in the navigation for the folders' READMEs, whose own titles repeat the section's caption.
NAV_TITLES = {"lectures/README.md": "Reading path", "assignments/README.md": "How the assignments work"}


def toctree(caption: str, docs: list[str]) -> str:
    if not docs:
        return ""
    entries = "\n".join(f"{NAV_TITLES[d]} <{Path(d).with_suffix('')}>" if d in NAV_TITLES
                        else str(Path(d).with_suffix("")) for d in docs)
    return f"\n```{{toctree}}\n:hidden:\n:caption: {caption}\n\n{entries}\n```\n"


def render_landing(repo: Path, sources: Sources, titles: dict[str, str], settings: Settings) -> str:
    """docs/site/index.md with its {{ ... }} lists filled from what was discovered, plus the navigation."""
    template = (CONF_DIR / "index.md").read_text()
    quizzes = [p for p in sources.lecture_pages + sources.documents if "quiz" in p.lower()]
    lecture_pages = [p for p in sources.lecture_pages if p not in quizzes]
    documents = [p for p in sources.documents if p not in quizzes]
    syllabus = [p for p in documents if Path(p).stem.lower() == "syllabus"]
    first = sources.lectures[0]
    replacements = {
        "{{ first_lecture }}": f"[the first one]({first})",
        "{{ lectures }}": md_list([(titles[p], p) for p in sources.lectures], ordered=True),
        "{{ assignments }}": md_list([(titles[p], p) for p in sources.assignments]),
        "{{ documents }}": md_list([(titles[p], p) for p in syllabus + [d for d in documents if d not in syllabus]])
                           + ("\n- Quizzes, one per lecture: " + " · ".join(
                               f"[{Path(q).stem.split('_')[0]}]({q})" for q in quizzes) if quizzes else ""),
        "{{ repository }}": settings.repository,
        "{{ instructor_start }}": " ".join(
            ([f"The [syllabus]({syllabus[0]}): the week plan."] if syllabus else [])
            + ([f"A [quiz]({quizzes[0]}) per lecture, linked under its title."] if quizzes else [])),
    }
    for k, v in replacements.items():
        template = template.replace(k, v)
    left = re.findall(r"\{\{[^}]*\}\}", template)
    if left:
        raise SiteError(f"docs/site/index.md: unknown placeholders {left}")
    trees = (toctree("Lectures", lecture_pages + sources.lectures)
             + toctree("Assignments", sources.assignments)
             + toctree("Quizzes", quizzes)
             + toctree("Course documents", documents))
    return template + "\n" + trees


def stage(stage_dir: Path, repo: Path = REPO, settings: Settings | None = None) -> Sources:
    settings = settings or load_settings(repo)
    sources = discover(repo)
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)
    linker = Linker(repo, stage_dir, sources, settings)
    regions = solution_regions()
    titles = {}
    for path in sources.lectures:
        nb = stage_lecture(path, linker, settings, regions)
        titles[path] = title_of("\n".join(notebook_markdown(nb)), Path(path).stem)
    for path in sources.lecture_pages + sources.assignments + sources.documents:
        text = (repo / path).read_text()
        leaks = find_leaks(text, regions)
        if leaks:
            raise SiteError(f"{path} shows graded code ({', '.join(leaks)}): the site would publish a solution")
        titles[path] = title_of(text, Path(path).stem)
        text = linker.rewrite(path, text)
        if path == "docs/results.md":
            text += results_plots(repo)
            for p in repo.glob("benchmarks/results/*.png"):
                linker.copy_in(_rel(p, repo))
        (stage_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (stage_dir / path).write_text(text)
    landing = linker.rewrite("index.md", render_landing(repo, sources, titles, settings))
    (stage_dir / "index.md").write_text(landing)
    if linker.errors:
        raise SiteError("broken links:\n  " + "\n  ".join(linker.errors))
    return sources


# --------------------------------------------------------------------------------------------- HTML checks

LOADING = {  # tag -> attributes whose URL the browser fetches when the page is shown
    "script": ("src",), "img": ("src", "srcset"), "iframe": ("src",), "embed": ("src",), "source": ("src", "srcset"),
    "video": ("src", "poster"), "audio": ("src",), "object": ("data",), "input": ("src",),
}
CSS_URL = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])(?P<url>[^'")\s]+)""")


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.loads: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        for attr in LOADING.get(tag, ()):
            if a.get(attr):
                self.loads += [u.split()[0] for u in a[attr].split(",") if u.strip()] if attr == "srcset" else [a[attr]]
        if tag == "link" and a.get("href"):
            rel = (a.get("rel") or "").lower()
            if any(r in rel for r in ("stylesheet", "icon", "preload", "modulepreload", "manifest", "prefetch")):
                self.loads.append(a["href"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])


def _external(url: str) -> bool:
    return bool(SCHEME.match(url) and not url.startswith("data:")) or url.startswith("//")


def check_site(out: Path) -> list[str]:
    """Problems of a built site: anything loaded from outside it, internal links to a missing file or id."""
    problems: list[str] = []
    pages = {}
    for html in sorted(out.rglob("*.html")):
        if html.relative_to(out).parts[0] == "_static":  # the theme's template fragments, not pages
            continue
        p = _Page()
        p.feed(html.read_text(errors="replace"))
        pages[html.resolve()] = p
    for html, p in pages.items():
        rel = html.relative_to(out.resolve())
        for url in p.loads:
            if _external(url):
                problems.append(f"{rel}: loads {url} from outside the site")
            elif not url.startswith("data:") and not (html.parent / unquote(urlsplit(url).path)).exists():
                problems.append(f"{rel}: loads {url}, which is not in the site")
        for url in p.links:
            if _external(url) or url.startswith("javascript:"):
                continue
            parts = urlsplit(url)
            target = (html.parent / unquote(parts.path)).resolve() if parts.path else html
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{rel}: link {url} points to a missing file")
            elif parts.fragment and target.suffix == ".html" and parts.fragment not in pages[target].ids:
                problems.append(f"{rel}: link {url} points to a missing anchor")
    for css in sorted(out.rglob("*.css")):
        for m in CSS_URL.finditer(css.read_text(errors="replace")):
            if _external(m["url"]):
                problems.append(f"{css.relative_to(out)}: loads {m['url']} from outside the site")
    return problems


# --------------------------------------------------------------------------------------------- build


def build(out: Path, src: Path, jobs: str = "auto", quiet: bool = True) -> Sources:
    """Stage, run Sphinx (warnings are errors), check the HTML. Raises SiteError on any problem."""
    sources = stage(src)
    doctrees = src.parent / (src.name + "-doctrees")
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-E", "-W", "--keep-going", "-n", "-j", jobs,
           "-c", str(CONF_DIR), "-d", str(doctrees), str(src), str(out)]
    if quiet:
        cmd.append("-q")
    r = subprocess.run(cmd, cwd=REPO)
    if r.returncode != 0:
        raise SiteError(f"sphinx-build failed (exit {r.returncode}): the warnings above are errors")
    problems = check_site(out)
    if problems:
        raise SiteError("the built site has problems:\n  " + "\n  ".join(problems))
    return sources


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "build/site", help="where the HTML goes")
    ap.add_argument("--src", type=Path, default=REPO / "build/site-src", help="staging folder for the sources")
    ap.add_argument("-j", "--jobs", default="auto", help="Sphinx's parallel jobs")
    ap.add_argument("-v", "--verbose", action="store_true", help="Sphinx's progress output")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        sources = build(args.out, args.src, args.jobs, quiet=not args.verbose)
    except SiteError as e:
        print(f"make_site: {e}", file=sys.stderr)
        return 1
    n = sum(1 for p in args.out.rglob("*.html") if p.relative_to(args.out).parts[0] != "_static")
    print(f"site: {n} pages ({len(sources.lectures)} lectures) in {args.out} "
          f"({time.perf_counter() - t0:.0f} s); open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
