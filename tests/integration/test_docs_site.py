"""The documentation site, built as `make docs` builds it and opened in a headless Chromium.

Served on 127.0.0.1 (as `make docs-serve` does), every page it opens must load without a console
error and without a request to anywhere else: no web font, no CDN script, nothing that a machine
without internet would miss. Navigation lists every section, search answers from the site's own
index, and code blocks get their copy button. Screenshots of the home page and of a reference page
go to the test's folder (and to PLANNER_DOCS_SCREENSHOTS, when set, to look at them).
"""

from __future__ import annotations

import base64
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_report_browser import Browser, Tab, browser  # noqa: F401 (browser: the fixture)

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("Get started", "Guides", "Concepts", "Reference", "Measured figures")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built into a temporary folder and served on 127.0.0.1; yields its base URL."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=100, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stdout}{built.stderr}"
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _evaluate(tab: Tab, expression: str):
    return tab.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)["result"].get("value")


def _screenshot(tab: Tab, path: Path) -> Path:
    path.write_bytes(base64.b64decode(tab.call("Page.captureScreenshot", format="png")["data"]))
    keep = os.environ.get("PLANNER_DOCS_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    return path


def _requests_elsewhere(tab: Tab, base: str) -> list[str]:
    urls = [m["params"]["request"]["url"] for m in tab.events if m.get("method") == "Network.requestWillBeSent"]
    return [u for u in urls if not u.startswith((base, "data:", "blob:"))]


def test_home_page_navigation_and_search_work_offline(browser: Browser, site: str, tmp_path: Path):  # noqa: F811
    tab, load = browser.open(f"{site}/index.html")
    try:
        assert load.console_errors == []
        nav = _evaluate(tab, "[...document.querySelectorAll('.md-nav--primary > .md-nav__list > .md-nav__item')].map(e => e.innerText.trim().split('\\n')[0])")
        for section in SECTIONS:
            assert section in nav, f"{section!r} not in the navigation: {nav}"
        assert "Find your page" in _evaluate(tab, "document.body.innerText")
        shot = _screenshot(tab, tmp_path / "docs-home.png")
        assert shot.stat().st_size > 20_000
        # Search: the theme's worker loads the site's own index, then answers what the reader types.
        _evaluate(tab, "document.querySelector('label.md-search__icon, label[for=__search]').click()")
        _evaluate(tab, "document.querySelector('input.md-search__input').focus()")
        tab.call("Input.insertText", text="window_closed_by")
        deadline = time.perf_counter() + 20
        titles: list[str] = []
        while time.perf_counter() < deadline and not titles:
            time.sleep(0.25)
            titles = _evaluate(tab, "[...document.querySelectorAll('.md-search-result__item')].map(e => e.innerText)") or []
        assert titles, "search gave no result for window_closed_by"
        assert any("Result fields" in t or "window_closed_by" in t for t in titles)
        _screenshot(tab, tmp_path / "docs-search.png")
        assert _requests_elsewhere(tab, site) == []
    finally:
        tab.close()


def test_reference_page_renders_its_tables_and_code_offline(browser: Browser, site: str, tmp_path: Path):  # noqa: F811
    tab, load = browser.open(f"{site}/reference/cli.html")
    try:
        assert load.console_errors == []
        text = _evaluate(tab, "document.body.innerText")
        assert "planner sweep" in text and "--find-max" in text
        assert _evaluate(tab, "document.querySelectorAll('table').length") >= 10
        assert _evaluate(tab, "document.querySelectorAll('pre > code').length") >= 5
        # Material gives every code block a copy button (content.code.copy).
        copy = "document.querySelectorAll('pre button[title=\"Copy to clipboard\"]').length"
        assert _evaluate(tab, copy) == _evaluate(tab, "document.querySelectorAll('pre > code').length")
        shot = _screenshot(tab, tmp_path / "docs-reference-cli.png")
        assert shot.stat().st_size > 20_000
        assert _requests_elsewhere(tab, site) == []
    finally:
        tab.close()
