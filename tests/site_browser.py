"""Headless Chromium (Debian's `chromium` + `chromium-driver`) driven by Selenium, for the course website.

The site is served from 127.0.0.1 by a throw-away HTTP server; the browser resolves every other host name to
nothing, so a page that needed the network would show it as a failed request and a console error.

`python -m tests.site_browser --screenshots docs/site` takes the screenshots committed under docs/site/ from the
site that `make site` built.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import shutil
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTALL_HINT = "apt-get install chromium chromium-driver (Debian), and `make setup` for selenium"


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when Chromium, its driver and Selenium are all present."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return f"selenium is not installed ({INSTALL_HINT})"
    if not _chromium():
        return f"no Chromium on PATH or in $CHROMIUM ({INSTALL_HINT})"
    if not _chromedriver():
        return f"no chromedriver on PATH or in $CHROMEDRIVER ({INSTALL_HINT})"
    return None


def _chromium() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _chromedriver() -> str | None:
    return os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(root: Path):
    """Serve `root` on 127.0.0.1 (a free port); yields the base URL ending in '/'."""
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def chromium(width: int = 1280, height: int = 900):
    """A headless Chromium WebDriver that logs the console and the network, with no route to any other host."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not try to download a driver
    opts = webdriver.ChromeOptions()
    opts.binary_location = _chromium()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=_chromedriver()))


def requested_urls(driver) -> list[str]:
    """URLs the pages asked for since the last call (drains the performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def console_errors(driver) -> list[str]:
    """SEVERE console entries since the last call (drains the browser log)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_loaded(driver, timeout: float = 20.0) -> None:
    """Until the document and its images are loaded and MathJax (when the page loaded it) has typeset."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)"))
    driver.set_script_timeout(timeout)
    driver.execute_async_script(  # MathJax's script is async: the load event waits for it, its typesetting not
        "const done = arguments[arguments.length - 1];"
        "const p = window.MathJax && MathJax.startup && MathJax.startup.promise;"
        "if (p) p.then(() => done(true), () => done(false)); else done(null);")


def screenshots(site: Path, out: Path, lecture: str = "lectures/03_flashattention_numpy.html") -> list[Path]:
    """The landing page and one lecture page, as a reader first sees them (1280 x 900)."""
    out.mkdir(parents=True, exist_ok=True)
    shots = [("landing.png", "index.html"), ("lecture.png", lecture)]
    driver = chromium()
    try:
        with serve(site) as base:
            for name, page in shots:
                driver.get(base + page)
                wait_loaded(driver)
                driver.save_screenshot(str(out / name))
    finally:
        driver.quit()
    return [out / n for n, _ in shots]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="screenshots of the built course website")
    ap.add_argument("--screenshots", type=Path, required=True, help="folder for landing.png and lecture.png")
    ap.add_argument("--site", type=Path, default=REPO / "build/site", help="the built site (make site)")
    args = ap.parse_args()
    missing = browser_missing()
    if missing:
        raise SystemExit(missing)
    for p in screenshots(args.site, args.screenshots):
        print(p)
