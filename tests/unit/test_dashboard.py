"""docker/: the Grafana dashboard uses only metrics that exist, and the files agree with each other.

No Docker engine runs in the tests; the files are checked by reading them. `promtool check config`
runs in tests/integration/test_prometheus_scrape.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric

from planner.exporter import PlannerMetrics
from planner.sweep.config import load_settings

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "planner.json"
DATASOURCE = DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml"

# vLLM's metric names as exposed at /metrics (vLLM 0.32.0; see tests/fixtures/vllm_metrics/), sample names
# included: counters end in _total, histograms expose _bucket, _sum and _count.
VLLM_GAUGES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:cache_config_info",
)
VLLM_COUNTERS = (
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
)
VLLM_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_num_preemptions",
)
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "inf", "nan",
}


def _sample_names(metric: Metric) -> set[str]:
    if metric.type == "counter":
        return {metric.name + "_total"}
    if metric.type == "histogram":
        return {metric.name + s for s in HISTOGRAM_SUFFIXES}
    return {metric.name}


def planner_names() -> set[str]:
    names: set[str] = set()
    for metric in PlannerMetrics().registry.collect():
        names |= _sample_names(metric)
    return names


def vllm_names() -> set[str]:
    names = set(VLLM_GAUGES) | {c + "_total" for c in VLLM_COUNTERS}
    return names | {h + s for h in VLLM_HISTOGRAMS for s in HISTOGRAM_SUFFIXES}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (label matchers, ranges, functions stripped)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        if text[match.end():].lstrip().startswith("("):
            continue  # a function call
        if word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def _panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_exprs(dash: dict) -> list[str]:
    exprs = [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"]]
    return exprs


def test_metric_name_extraction() -> None:
    expr = 'histogram_quantile(0.99, sum by (le, point) (rate(planner_ttft_seconds_bucket{point=~"$point"}[$__rate_interval])))'
    assert metric_names(expr) == {"planner_ttft_seconds_bucket"}
    assert metric_names('label_values(vllm:num_requests_running, model_name)') == {"vllm:num_requests_running", "model_name"}
    assert metric_names("rate(vllm:num_preemptions_total[5m]) > bool 0") == {"vllm:num_preemptions_total"}


def test_every_metric_in_the_dashboard_exists() -> None:
    known = planner_names() | vllm_names()
    dash = dashboard()
    used: set[str] = set()
    for expr in all_exprs(dash):
        names = metric_names(expr)
        if expr.startswith("label_values("):
            # label_values(metric, label): the second argument is a label name.
            names = {expr[len("label_values("):].split(",")[0].strip()}
        used |= names
    unknown = used - known
    assert not unknown, f"dashboard reads metrics that neither the planner nor vLLM exports: {sorted(unknown)}"
    # The dashboard shows both sides: the planner's view and vLLM's.
    assert any(n.startswith("planner_") for n in used) and any(n.startswith("vllm:") for n in used)


def test_dashboard_covers_the_requested_panels() -> None:
    used = set()
    for expr in all_exprs(dashboard()):
        used |= metric_names(expr)
    for name in (
        "vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket", "vllm:generation_tokens_total",
        "planner_requests_total", "planner_inflight_requests", "planner_target_concurrency", "planner_ttft_seconds_bucket",
        "planner_itl_seconds_bucket", "planner_e2e_seconds_bucket", "planner_step_slo_pass", "planner_point_info",
        "planner_safe_concurrency_per_gpu",
        # The client's histograms beside vLLM's, and where vLLM's time went.
        "planner_tpot_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
        "planner_ttft_seconds_sum", "vllm:time_to_first_token_seconds_sum", "vllm:request_queue_time_seconds_bucket",
        "vllm:request_queue_time_seconds_sum", "vllm:request_prefill_time_seconds_sum",
        "vllm:request_decode_time_seconds_sum", "planner_itl_burst_gaps_total",
    ):
        assert name in used, name


def test_panels_are_well_formed() -> None:
    dash = dashboard()
    panels = _panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    uid = re.search(r"^\s*uid:\s*(\S+)\s*$", DATASOURCE.read_text(), re.M).group(1)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        pos = p["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["title"] and p.get("description"), p
        assert p["datasource"]["uid"] == uid, p["title"]
        assert p["targets"] and all(t["datasource"]["uid"] == uid for t in p["targets"]), p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), f"panel {p['title']!r} has no unit"


def _prometheus_targets() -> dict[str, list[str]]:
    jobs: dict[str, list[str]] = {}
    job = None
    for line in (DOCKER / "prometheus.yml").read_text().splitlines():
        if m := re.match(r"\s*- job_name:\s*(\S+)", line):
            job = m.group(1)
        elif (m := re.match(r"\s*- targets:\s*\[(.*)\]", line)) and job:
            jobs[job] = [t.strip().strip('"') for t in m.group(1).split(",")]
    return jobs


def test_prometheus_scrapes_the_ports_the_container_uses() -> None:
    compose = (DOCKER / "compose.yaml").read_text()
    metrics_port = re.search(r"- --metrics-port\n\s*- \"(\d+)\"", compose).group(1)
    assert re.search(r"- --metrics-host\n\s*- 0\.0\.0\.0", compose), "Prometheus runs in another container"
    settings = load_settings(DOCKER / "sweep.toml")
    targets = _prometheus_targets()
    assert targets["planner"] == [f"planner:{metrics_port}"]
    assert targets["vllm"] == [f"planner:{settings.server.port}"]
    assert settings.server.host == "0.0.0.0"


def test_sweep_settings_of_the_container_are_valid() -> None:
    settings = load_settings(DOCKER / "sweep.toml")
    assert settings.server.command == ["vllm", "serve"]
    assert settings.slo.rules()["ttft_p99_ms"] == 800


def test_image_versions_agree() -> None:
    dockerfile = (DOCKER / "Dockerfile").read_text()
    compose = (DOCKER / "compose.yaml").read_text()
    image = re.search(r"^ARG VLLM_IMAGE=(\S+)$", dockerfile, re.M).group(1)
    assert image.startswith("vllm/vllm-openai:")
    assert f"${{VLLM_IMAGE:-{image}}}" in compose
    assert re.search(r'^ENTRYPOINT \["planner"\]$', dockerfile, re.M)


def test_the_ray_node_image_installs_the_extra_the_project_declares() -> None:
    import tomllib

    extras = tomllib.loads((DOCKER.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert "--build-arg PLANNER_EXTRAS=ray" in dockerfile and "ray" in extras
    # What the shell makes of the Dockerfile's own install argument, with and without the extra.
    (argument,) = re.findall(r'uv pip install .* (\S*/opt/planner-src\S*);', dockerfile)
    for value, wanted in (("", "/opt/planner-src"), ("ray", "/opt/planner-src[ray]")):
        out = subprocess.run(
            ["sh", "-c", f"echo {argument}"], env={"PLANNER_EXTRAS": value}, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert out == wanted


@pytest.mark.parametrize("path", ["prometheus.yml", "compose.yaml", "grafana/provisioning/dashboards/planner.yml"])
def test_no_tabs_in_yaml(path: str) -> None:
    # YAML forbids tabs for indentation; nothing here can parse YAML to catch it otherwise.
    assert "\t" not in (DOCKER / path).read_text()


def test_grafana_loads_the_mounted_dashboards() -> None:
    compose = (DOCKER / "compose.yaml").read_text()
    provider = (DOCKER / "grafana" / "provisioning" / "dashboards" / "planner.yml").read_text()
    path = re.search(r"^\s*path:\s*(\S+)\s*$", provider, re.M).group(1)
    assert f"- ./grafana/dashboards:{path}:ro" in compose
    assert "- ./grafana/provisioning:/etc/grafana/provisioning:ro" in compose
    assert "url: http://prometheus:9090" in DATASOURCE.read_text()
