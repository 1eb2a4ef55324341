"""`alerts`: Prometheus alerting rules that say the fleet has left the envelope the sweep measured.

- one alert per latency SLO the sweep held (TTFT, ITL, TPOT, e2e, queue time; a quantile or the
  mean), evaluated from vLLM's own histograms over --alert-window, at the sweep's bound. vLLM's
  histograms start when the request reaches the server, so they do not see the network: a
  client-side SLO is checked here on the server's share of it. `max` bounds have no histogram
  form and get no alert;
- requests running on a replica above the measured safe concurrency;
- KV-cache usage above the sweep's kv_cache_usage_max;
- preemptions above the sweep's max_preemptions (0: any preemption);
- waiting requests above max_waiting, when the sweep bounded it.

Written as a plain rules file (`prometheus --config.file` / `rule_files`) and as a PrometheusRule
(prometheus-operator's monitoring.coreos.com/v1), with the same groups. A Grafana panel for the
existing dashboard (docker/grafana/dashboards/planner.json) draws the envelope: requests running
per replica against the safe concurrency and the highest passing one.
"""

from __future__ import annotations

import json
import re

from planner.export import yamltext
from planner.export.autoscaling import selector
from planner.export.kubernetes import labels
from planner.export.provenance import Figure, MeasuredPoint, Options, commented, header_lines

# vLLM's histogram for each SLO metric (replay.slo's names).
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
}
_LATENCY = re.compile(r"^(?:server_)?(ttft|itl|tpot|e2e|queue)_(mean|p50|p90|p95|p99|max)_ms$")

RUNNING_ALERT = "VllmRunningAboveSafeConcurrency"


def _camel(text: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[_\W]+", text) if part)


def latency_bounds(point: MeasuredPoint) -> dict[tuple[str, str], Figure]:
    """(metric, stat) -> the tightest bound the sweep held on it, client or server view."""
    out: dict[tuple[str, str], Figure] = {}
    for key, bound in point.slo.items():
        m = _LATENCY.match(key)
        if m is None or m.group(2) == "max":
            continue
        k = (m.group(1), m.group(2))
        if k not in out or float(bound.value) < float(out[k].value):
            out[k] = bound
    return out


def _latency_expr(metric: str, stat: str, sel: str, window: str) -> str:
    h = HISTOGRAMS[metric]
    if stat == "mean":
        return f"sum(rate({h}_sum{{{sel}}}[{window}])) / sum(rate({h}_count{{{sel}}}[{window}]))"
    q = int(stat[1:]) / 100
    return f"histogram_quantile({q:g}, sum by (le) (rate({h}_bucket{{{sel}}}[{window}])))"


def _rule(name: str, expr: str, options: Options, summary: str, source: str, severity: str = "warning") -> dict:
    return {
        "alert": name,
        "expr": expr,
        "for": options.alert_for,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "measured": source},
    }


def rules(point: MeasuredPoint, options: Options) -> list[dict]:
    sel, window, out = selector(point), options.alert_window, []
    where = f"{point.results_path.name}, point {point.point_id}, measured {point.measured_at or 'unrecorded'}"
    for (metric, stat), bound in sorted(latency_bounds(point).items()):
        seconds = float(bound.value) / 1000
        out.append(_rule(
            f"VllmSlo{_camel(metric)}{stat.capitalize()}",
            f"{_latency_expr(metric, stat, sel, window)} > {seconds:g}",
            options,
            f"vLLM {metric.upper()} {stat} over {window} is above the SLO of {float(bound.value):g} ms",
            f"{bound.source} ({where})",
        ))
    safe = point.safe_concurrency
    out.append(_rule(
        RUNNING_ALERT,
        f"vllm:num_requests_running{{{sel}}} > {safe.value}",
        options,
        f"a replica runs more requests than the safe concurrency {safe.value} measured for it",
        f"{safe.source} ({where})",
    ))
    simple = (
        ("kv_cache_usage_max", "VllmKvCacheUsageAboveMeasured", "vllm:kv_cache_usage_perc{%s} > %s",
         "KV-cache usage is above the bound the sweep held (%s)"),
        ("max_preemptions", "VllmPreemptions", "increase(vllm:num_preemptions_total{%s}[" + window + "]) > %s",
         "vLLM preempted requests (more than %s over " + window + "), which the sweep did not allow"),
        ("max_waiting", "VllmWaitingAboveMeasured", "vllm:num_requests_waiting{%s} > %s",
         "more requests wait than the sweep allowed (%s)"),
    )
    for key, name, expr, summary in simple:
        if key in point.slo:
            bound = point.slo[key]
            out.append(_rule(name, expr % (sel, f"{float(bound.value):g}"), options, summary % f"{float(bound.value):g}",
                             f"{bound.source} ({where})"))
    return out


def group_name(point: MeasuredPoint) -> str:
    return f"{point.app_name}-measured-envelope"


def rules_file(point: MeasuredPoint, options: Options) -> dict:
    return {"groups": [{"name": group_name(point), "rules": rules(point, options)}]}


def prometheus_rule(point: MeasuredPoint, options: Options) -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": group_name(point), "namespace": options.namespace, "labels": labels(point)},
        "spec": rules_file(point, options),
    }


def grafana_panel(point: MeasuredPoint) -> dict:
    """A time series panel for the planner dashboard: running requests per replica, with the
    safe concurrency (orange) and the highest passing concurrency (red) as threshold lines."""
    safe, top = point.safe_concurrency, point.max_passing
    description = (
        f"Measured envelope from {point.results_path}, point {point.point_id}, measured {point.measured_at}. "
        f"Safe concurrency {safe.value}: {safe.source}. Highest passing {top.value}: {top.source}."
    )
    return {
        "type": "timeseries",
        "title": f"Requests running per replica against the measured envelope ({point.point_id})",
        "description": description,
        # The datasource the planner dashboard provisions (docker/grafana/provisioning).
        "datasource": {"type": "prometheus", "uid": "planner-prometheus"},
        "gridPos": {"h": 8, "w": 24, "x": 0, "y": 0},
        "targets": [{"refId": "A", "expr": f"vllm:num_requests_running{{{selector(point)}}}",
                     "legendFormat": "{{instance}} running"}],
        "fieldConfig": {
            "defaults": {
                "custom": {"thresholdsStyle": {"mode": "line+area"}},
                "thresholds": {"mode": "absolute", "steps": [
                    {"color": "green", "value": None},
                    {"color": "orange", "value": safe.value},
                    {"color": "red", "value": top.value},
                ]},
            },
            "overrides": [],
        },
    }


def _header(point: MeasuredPoint, options: Options, what: str) -> str:
    lines = header_lines(point, what)
    lines.append(f"window {options.alert_window} (--alert-window), for {options.alert_for} (--alert-for): export defaults")
    dropped = [k for k in point.slo if (m := _LATENCY.match(k)) and m.group(2) == "max"]
    if dropped:
        lines.append(f"no alert for {', '.join(dropped)}: vLLM's histograms keep no maximum")
    return commented(lines)


def render_rules(point: MeasuredPoint, options: Options) -> str:
    return _header(point, options, "Prometheus alerting rules") + yamltext.dump(rules_file(point, options))


def render_prometheus_rule(point: MeasuredPoint, options: Options) -> str:
    return _header(point, options, "PrometheusRule") + "---\n" + yamltext.dump(prometheus_rule(point, options))


def render_panel(point: MeasuredPoint) -> str:
    return json.dumps(grafana_panel(point), indent=2) + "\n"
