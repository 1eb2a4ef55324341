"""Every panel of the Grafana dashboard returns data from a live load test.

One replay runs against the fake vLLM (its gauges, counters and histograms carry vLLM's names)
with the planner's exporter on, reporting as a sweep's point does, while a real Prometheus scrapes
both with docker/prometheus.yml's settings (only the targets are rewritten to this test's ports).
Then every expression of every panel of docker/grafana/dashboards/planner.json runs through
Prometheus's range-query API over the replay's time, with the dashboard's variables substituted
the way Grafana does: each must parse and return at least one series, each series must carry the
labels its legend names, and its values must fit the panel's unit.

tests/unit/test_dashboard.py checks the same files by reading them; this is where a query that
returns nothing (a wrong label, a counter that does not exist yet, a rate over too few scrapes)
is found before someone opens the dashboard during a load test.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from planner.exporter import PlannerMetrics
from replay.corpus.jsonl import load_corpus
from replay.run.entry import run_replay
from replay.run.settings import ReplaySettings
from tests.fakes.openai_server import Behavior, FakeServer
from tests.integration.prometheus import free_port, query, running_prometheus, wait_for_value

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "planner.json"
DATASOURCE = DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROMETHEUS_CONFIG = DOCKER / "prometheus.yml"
CORPUS = ROOT / "tests" / "fixtures" / "corpus" / "good.jsonl"

# A sweep point's id as the grid names it: its dot must be regex-escaped when Grafana puts one
# selected value into `point=~"$point"`.
POINT = "mml4096-gmu0.9-tp1"
MODEL = "live-model"
CONFIG = {"max_model_len": 4096, "gpu_memory_utilization": 0.9, "tensor_parallel_size": 1}
# Grafana draws a panel with one point per pixel at most; a panel is about this wide.
MAX_DATA_POINTS = 1000
# Panels whose data a fake cannot produce, with the reason. Empty: the fake produces all of it.
NO_DATA_EXPECTED: dict[str, str] = {}


@dataclass(frozen=True)
class Live:
    prometheus: str
    start_s: float
    end_s: float
    scrape_interval_s: float
    time_interval_s: float


def _duration_s(text: str, key: str, where: Path) -> float:
    """The first `key: 5s` of a YAML file, in seconds (the two files read here are flat there)."""
    match = re.search(rf"^\s*{key}:\s*(\d+(?:\.\d+)?)(ms|s|m)\s*$", text, re.MULTILINE)
    assert match, f"{where}: no {key}"
    return float(match[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match[2]]


def _docker_config(planner_port: int, vllm_port: int) -> tuple[str, float]:
    """docker/prometheus.yml with its two targets pointed at this test's exporter and fake vLLM."""
    text = PROMETHEUS_CONFIG.read_text()
    targets = {"planner:9400": f"127.0.0.1:{planner_port}", "planner:8000": f"127.0.0.1:{vllm_port}"}
    for docker_target, local in targets.items():
        assert text.count(docker_target) == 1, f"{PROMETHEUS_CONFIG}: expected one target {docker_target}"
        text = text.replace(docker_target, local)
    return text, _duration_s(text, "scrape_interval", PROMETHEUS_CONFIG)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One Prometheus and one replay for the whole module: the replay's time is what is queried."""
    workdir = tmp_path_factory.mktemp("dashboard-live")
    exporter = PlannerMetrics()
    exporter.start(host="127.0.0.1", port=0)
    vllm_port = free_port()
    config, scrape_s = _docker_config(exporter.port, vllm_port)
    time_interval_s = _duration_s(DATASOURCE.read_text(), "timeInterval", DATASOURCE)
    # Two closed-loop steps and an open-loop one, each spanning a few scrapes. The fake admits
    # four requests at a time (--max-num-seqs), so at concurrency 6 some wait, and its KV pool is
    # sized like a small GPU's, so its cache usage moves.
    settings = ReplaySettings(concurrency=[2, 6], rate=[10.0], min_requests=30, warmup_requests=2,
                              min_window_s=2 * scrape_s, max_window_s=60)
    behavior = Behavior(ttft_s=0.02, itl_s=0.004, itl_growth_per_running=0.1, kv_cache_tokens=2048,
                        max_num_seqs=4, models=[MODEL])
    try:
        with running_prometheus(config, workdir / "prometheus") as url:

            async def main() -> tuple[float, float]:
                async with FakeServer(behavior, port=vllm_port) as srv:
                    # Prometheus hands new targets to its scrapers within a few seconds; the
                    # replay starts once both answered a scrape.
                    deadline = time.monotonic() + 30
                    while not all(query(url, f'up{{job="{job}"}} == 1') for job in ("planner", "vllm")):
                        assert time.monotonic() < deadline, "Prometheus never scraped both targets"
                        await asyncio.sleep(0.5)
                    start = time.time()
                    # What a sweep tells its observers around a point (planner/sweep/run.py).
                    exporter.point_started(POINT, CONFIG, MODEL)
                    results = await run_replay(url=srv.url, corpus=load_corpus(CORPUS), settings=settings,
                                               slo={"ttft_p50_ms": 5000.0}, observer=exporter)
                    passed = [int(s.load.value) for s in results.steps if s.load.mode == "concurrency" and s.slo_pass]
                    assert passed, results.steps
                    exporter.point_finished(POINT, float(max(passed)))
                    safe_s.append(float(max(passed)))
                    # The last values must be scraped before the fake goes away.
                    await asyncio.sleep(2 * scrape_s)
                    return start, time.time()

            safe_s: list[float] = []
            start_s, end_s = asyncio.run(main())
            wait_for_value(url, f'planner_safe_concurrency_per_gpu{{point="{POINT}"}}', safe_s[0])
            yield Live(url, start_s, end_s, scrape_s, time_interval_s)
    finally:
        exporter.stop()


def _panels() -> list[dict]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = []
    for panel in dashboard["panels"]:
        panels += [panel, *panel.get("panels", [])]  # a collapsed row holds its panels
    return [p for p in panels if p.get("type") != "row"]


def _variables() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["templating"]["list"]


def _regex_escape(value: str) -> str:
    """Grafana's prometheusSpecialRegexEscape: a multi-value variable's value inside =~"..."."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m[0], value)


def _grafana_interval(live: Live) -> tuple[float, float]:
    """$__interval and $__rate_interval as Grafana computes them for this time range."""
    interval = max(live.time_interval_s, math.ceil((live.end_s - live.start_s) / MAX_DATA_POINTS))
    return interval, max(interval + live.time_interval_s, 4 * live.time_interval_s)


def _label_values(live: Live, definition: str) -> list[str]:
    """The values a `label_values(metric, label)` variable offers, from Prometheus's series API."""
    match = re.fullmatch(r"label_values\(([^,]+),\s*(\w+)\)", definition)
    assert match, f"variable query {definition!r}: only label_values(metric, label) is handled here"
    response = httpx.get(f"{live.prometheus}/api/v1/series", timeout=5.0, params={
        "match[]": match[1].strip(), "start": live.start_s, "end": live.end_s})
    body = response.json()
    assert body["status"] == "success", body
    return sorted({series[match[2]] for series in body["data"] if match[2] in series})


def _substitute(expr: str, values: dict[str, str], interval_s: float, rate_interval_s: float) -> str:
    expr = expr.replace("$__rate_interval", f"{rate_interval_s:g}s").replace("$__interval", f"{interval_s:g}s")
    for name, value in values.items():
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    left = re.findall(r"\$\{?\w+", expr)
    assert not left, f"{expr}: variables no test substitutes: {left}"
    return expr


def _range_query(live: Live, expr: str, step_s: float) -> list[dict]:
    response = httpx.get(f"{live.prometheus}/api/v1/query_range", timeout=10.0, params={
        "query": expr, "start": live.start_s, "end": live.end_s, "step": f"{step_s:g}s"})
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body.get('error')}"
    return body["data"]["result"]


def _selections(live: Live) -> list[dict[str, str]]:
    """What a viewer may select: every variable on All (Grafana's allValue), then each variable on
    one of the values its query offers (the others on All)."""
    variables = _variables()
    every = {v["name"]: v["allValue"] for v in variables}
    selections = [every]
    for v in variables:
        offered = _label_values(live, v["definition"])
        assert offered, f"variable ${v['name']}: {v['definition']} offers no value"
        selections.append({**every, v["name"]: _regex_escape(offered[0])})
    return selections


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"([a-zA-Z_:][\w:]*)\{", expr))


def test_every_panel_expression_returns_series_with_its_legend_labels(live: Live) -> None:
    interval, rate_interval = _grafana_interval(live)
    selections = _selections(live)
    assert any(POINT.replace(".", "\\\\.") in s.values() for s in selections)
    empty: list[tuple[str, str]] = []
    checked = 0
    for panel in _panels():
        title = panel["title"]
        for target in panel.get("targets", []):
            for values in selections:
                expr = _substitute(target["expr"], values, interval, rate_interval)
                series = _range_query(live, expr, interval)
                checked += 1
                if not series:
                    empty.append((title, expr))
                    continue
                for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
                    missing = [s["metric"] for s in series if label not in s["metric"]]
                    assert not missing, f"{title}: legend names {{{{{label}}}}}, which {missing} lack ({expr})"
    unexpected = [f"{title}: {expr}" for title, expr in empty if title not in NO_DATA_EXPECTED]
    assert unexpected == [], "expressions with no data:\n" + "\n".join(unexpected)
    # Every panel but a row has queries, and each ran under every selection.
    assert all(panel.get("targets") for panel in _panels()) and checked >= 3 * len(_panels())


def _values(series: list[dict]) -> list[float]:
    return [float(v) for s in series for _, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]


def test_panel_units_fit_their_values(live: Live) -> None:
    """A latency panel is in seconds and its metrics are; a fraction is in [0, 1]; a rate is per second."""
    interval, rate_interval = _grafana_interval(live)
    every = {v["name"]: v["allValue"] for v in _variables()}
    for panel in _panels():
        title = panel["title"]
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        assert unit, f"{title}: no unit"
        exprs = [t["expr"] for t in panel.get("targets", [])]
        names = set().union(*(_metric_names(e) for e in exprs))
        seconds = all(re.search(r"_seconds(_bucket|_sum|_count)?$", n) for n in names)
        assert (unit == "s") == seconds, f"{title}: unit {unit!r} for metrics {sorted(names)}"
        values = _values([s for e in exprs for s in _range_query(live, _substitute(e, every, interval, rate_interval), interval)])
        assert values, f"{title}: no finite value"
        if unit == "s":
            # The fake's latencies are tens of milliseconds to a second or two; a panel in the
            # wrong unit (milliseconds, or a sum not divided by its count) would be far outside.
            # The client-minus-server difference may be negative, by less than the others.
            assert all(-1.0 < v < 10.0 for v in values), f"{title}: {min(values)}..{max(values)} s"
            assert max(values) > 0.001, f"{title}: all below a millisecond"
        elif unit == "percentunit":
            assert all(0.0 <= v <= 1.0 for v in values) and max(values) > 0, f"{title}: {values[:5]}... not a fraction"
        elif unit in ("reqps", "short") or unit.startswith("suffix:"):
            assert all(v >= 0 for v in values), f"{title}: negative values"
        else:
            raise AssertionError(f"{title}: unit {unit!r} not checked by this test; add its rule here")
