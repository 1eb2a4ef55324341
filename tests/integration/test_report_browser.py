"""report.html opened in a real browser: Debian's headless Chromium, driven over the DevTools protocol.

For the saved sweep and replay fixtures, `planner report` writes report.html; Chromium loads it
from the file, and the test asserts the page loaded with no console message of level error, no
exception, no request to anything but the file itself and its embedded data: images, every image
decoded, and the recommendation's figures in the page's text. It takes a screenshot of the first
screen (a 1440x900 laptop window) and of the full page, kept under the test's tmp folder, and
prints the page to PDF to show it is printable.

One browser for the module; each page is a fresh tab.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import websocket

from planner.report import html as report_html
from planner.report import markdown, write_report
from planner.report.fleet import plan_fleet
from planner.report.load import load_results
from planner.report.markdown import num
from planner.report.view import build
from tests.integration.stopping import terminate_and_wait

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "results"
WINDOW = (1440, 900)
A4_WIDTH_PX = 794
START_TIMEOUT_S = 30.0
LOAD_TIMEOUT_S = 20.0


@dataclass
class PageLoad:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


class Tab:
    """One DevTools session on a page: send a command, wait for its answer, keep the events."""

    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=LOAD_TIMEOUT_S, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg["result"]
            self.events.append(msg)

    def wait_for(self, event: str) -> dict:
        deadline = time.perf_counter() + LOAD_TIMEOUT_S
        seen = 0
        while time.perf_counter() < deadline:
            for msg in self.events[seen:]:
                if msg.get("method") == event:
                    return msg
            seen = len(self.events)
            self.events.append(json.loads(self.ws.recv()))
        raise AssertionError(f"no {event} within {LOAD_TIMEOUT_S} s")

    def close(self) -> None:
        self.ws.close()


@dataclass
class Browser:
    port: int

    def open(self, url: str) -> tuple[Tab, PageLoad]:
        """Load url in a new tab at the laptop window's size; returns the tab and what loading it did."""
        target = httpx.put(f"http://127.0.0.1:{self.port}/json/new?about:blank", timeout=10.0).json()
        tab = Tab(target["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            tab.call(f"{domain}.enable")
        tab.call("Emulation.setDeviceMetricsOverride", width=WINDOW[0], height=WINDOW[1], deviceScaleFactor=1, mobile=False)
        tab.call("Page.navigate", url=url)
        tab.wait_for("Page.loadEventFired")
        # Anything the page logs or fetches after load arrives with the answer to a round trip.
        tab.call("Runtime.evaluate", expression="new Promise(r => setTimeout(r, 200))", awaitPromise=True)
        load = PageLoad()
        for msg in tab.events:
            method, params = msg.get("method"), msg.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                load.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                load.console_errors.append(params["exceptionDetails"].get("text", "exception"))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                load.console_errors.append(params["entry"]["text"])
            elif method == "Network.requestWillBeSent":
                load.requests.append(params["request"]["url"])
        return tab, load


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    binary = shutil.which("chromium")
    assert binary, "chromium is not installed (Debian package chromium; make test installs it)"
    profile = tmp_path_factory.mktemp("chromium-profile")
    log = profile.parent / "chromium.log"
    with log.open("wb") as out:
        # --no-sandbox: the sandbox needs user namespaces, which CI containers running as root lack.
        proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}",
             "about:blank"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.perf_counter() + START_TIMEOUT_S
        while not (active.exists() and active.read_text().strip()):
            if proc.poll() is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"chromium did not start (exit {proc.poll()}):\n{log.read_text(errors='replace')}")
            time.sleep(0.1)
        yield Browser(int(active.read_text().splitlines()[0]))
    finally:
        terminate_and_wait(proc)


def _screenshot(tab: Tab, path: Path, *, full_page: bool) -> Path:
    params: dict = {"format": "png"}
    if full_page:
        size = tab.call("Page.getLayoutMetrics")["cssContentSize"]
        params |= {"captureBeyondViewport": True,
                   "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}}
    path.write_bytes(base64.b64decode(tab.call("Page.captureScreenshot", **params)["data"]))
    return path


def _expected_figures(results: Path) -> list[str]:
    """The recommendation's figures as the report prints them, from the same view model."""
    data = build(*load_results(results))
    best = data.best
    assert best is not None
    figures = [f"Safe concurrency{' per GPU' if data.kind == 'sweep' else ''}: "
               + (num(best.safe_per_gpu, 2) if data.kind == "sweep" else num(best.safe)),
               f"Binding constraint: {best.binding_constraint}"]
    if data.kind == "sweep":
        figures.append(f"({num(best.safe)} concurrent requests per server on {best.gpus} GPUs)")
        figures.append(best.id)
    return figures


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["sweep", "replay"])
def test_report_html_loads_clean_and_shows_the_recommendation(browser: Browser, tmp_path: Path, kind: str) -> None:
    results = tmp_path / kind
    shutil.copytree(FIXTURES / kind, results)
    written = write_report(results, target_rps=20.0 if kind == "sweep" else None)
    page = results / report_html.HTML_FILE
    assert page in written

    tab, load = browser.open(page.as_uri())
    try:
        assert load.console_errors == []
        leaving = [u for u in load.requests if not (u == page.as_uri() or u.startswith("data:image/png;base64,"))]
        assert leaving == [], f"requests leaving the file: {leaving}"
        ev = lambda js: tab.call("Runtime.evaluate", expression=js, returnByValue=True)["result"]["value"]  # noqa: E731
        images = ev("Array.from(document.images).map(i => [i.alt, i.complete && i.naturalWidth > 0])")
        assert images and all(ok for _, ok in images), images
        assert len(images) == len([p for p in written if p.suffix == ".png"])
        text = ev("document.body.innerText")
        # The recommendation is the first section and its figures are in it.
        recommendation = ev("document.querySelector('section').innerText")
        assert ev("document.querySelector('section').id") == "recommendation"
        for figure in _expected_figures(results):
            assert figure in recommendation, f"{figure!r} not in the recommendation:\n{recommendation}"
        # Every section of report.md, in its order, and the sweep's fleet sizing and failures.
        data = build(*load_results(results))
        plan = plan_fleet(data.points, target_rps=20.0, target_concurrency=None) if kind == "sweep" else None
        ids = ev("Array.from(document.querySelectorAll('section')).map(s => s.id)")
        assert [i for i in ids if i != "plots"] == [key for key, _ in markdown.sections(data, plan)]
        assert {"recommendation", "slo", "steps"} <= set(ids)
        if kind == "sweep":
            assert {"fleet", "points", "failures"} <= set(ids)
            assert "Cheapest:" in text
        # The first screen shows the recommendation whole: it ends above the window's bottom edge.
        assert ev("document.querySelector('#recommendation').getBoundingClientRect().bottom") < WINDOW[1]
        # No table or figure spills out of the window sideways (wide tables scroll in their own box).
        assert ev("document.documentElement.scrollWidth") <= WINDOW[0]
        first = _screenshot(tab, tmp_path / f"{kind}-first-screen.png", full_page=False)
        full = _screenshot(tab, tmp_path / f"{kind}-full-page.png", full_page=True)
        assert first.stat().st_size > 10_000 and full.stat().st_size > first.stat().st_size
        pdf = base64.b64decode(tab.call("Page.printToPDF", printBackground=True)["data"])
        assert pdf.startswith(b"%PDF")
        # Printed, the page fits an A4 sheet's width (794 CSS px): wide tables shrink, none is cut off.
        tab.call("Emulation.setEmulatedMedia", media="print")
        tab.call("Emulation.setDeviceMetricsOverride", width=A4_WIDTH_PX, height=1123, deviceScaleFactor=1, mobile=False)
        assert ev("document.documentElement.scrollWidth") <= A4_WIDTH_PX
    finally:
        tab.close()


@pytest.mark.timeout(60)
def test_the_checks_see_a_console_error_and_a_request_leaving_the_page(browser: Browser, tmp_path: Path) -> None:
    # The assertions above are only as good as what the browser reports: a page that logs an
    # error and fetches from elsewhere must show both.
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><img src="http://127.0.0.1:9/x.png">'
                    '<script>console.error("broken")</script></body></html>')
    tab, load = browser.open(page.as_uri())
    tab.close()
    assert "broken" in load.console_errors
    assert "http://127.0.0.1:9/x.png" in load.requests
