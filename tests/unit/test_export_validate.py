"""The exported files checked by the tools their users run, not by our own reading of them.

- Kubernetes objects (Deployment, Service, HorizontalPodAutoscaler): kubernetes-validate, strict
  (an unknown field is an error), against the OpenAPI schemas it bundles for Kubernetes 1.35 and
  1.37; offline.
- Alert rules: `promtool check rules`, and `promtool test rules` with a synthetic series per alert
  that breaks it (the alert fires) and one that does not (it stays silent). promtool comes from
  `make prometheus` (scripts/setup-prometheus.sh); these tests fail when it is missing, since CI
  installs it.
- The compose file: parsed and validated by compose-spec (the compose_spec implementation of the
  Compose Specification), which rejects unknown keys and malformed durations and device counts.
- Custom resources, whose schemas no bundled validator carries, against field lists written here
  from each version's documentation (nothing is copied from those projects):
  KEDA 2.16's ScaledObject (docs: Concepts > Scaling Deployments > ScaledObject spec; Scalers >
  Prometheus), prometheus-operator's monitoring.coreos.com/v1 ServiceMonitor and PrometheusRule
  (API reference, v0.75), and the production-stack chart vllm-stack 0.1.12's values
  (helm/values.yaml, the servingEngineSpec section).
"""

from __future__ import annotations

import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml
from compose_spec import PyCompose

from planner.export import Options, alerts, autoscaling, compose, helm, kubernetes, load_point
from planner.export.helm import HELM_CHART_VERSION
from tests.fakes.export_points import full_sweep
from tests.fakes.results import FIXTURES

KUBERNETES_VERSIONS = ("1.35.0", "1.37.0")

# A shape: {key: shape} for an object, [shape] for a list of them, None for a leaf (any value).
_META = {"name": None, "namespace": None, "labels": None, "annotations": None}

# KEDA 2.16, ScaledObject spec and the prometheus scaler's trigger metadata.
KEDA_TRIGGER = {
    "type": None, "name": None, "metricType": None, "useCachedMetrics": None, "authenticationRef": None,
    "metadata": {
        "serverAddress": None, "query": None, "threshold": None, "activationThreshold": None, "namespace": None,
        "customHeaders": None, "ignoreNullValues": None, "queryParameters": None, "unsafeSsl": None, "timeout": None,
    },
}
KEDA_SCALED_OBJECT = {
    "apiVersion": None, "kind": None, "metadata": _META,
    "spec": {
        "scaleTargetRef": {"apiVersion": None, "kind": None, "name": None, "envSourceContainerName": None},
        "pollingInterval": None, "cooldownPeriod": None, "initialCooldownPeriod": None, "idleReplicaCount": None,
        "minReplicaCount": None, "maxReplicaCount": None, "fallback": None, "advanced": None,
        "triggers": [KEDA_TRIGGER],
    },
}
# prometheus-operator v0.75, monitoring.coreos.com/v1.
SERVICE_MONITOR = {
    "apiVersion": None, "kind": None, "metadata": _META,
    "spec": {
        "jobLabel": None, "targetLabels": None, "podTargetLabels": None, "namespaceSelector": None,
        "selector": {"matchLabels": None, "matchExpressions": None}, "sampleLimit": None,
        "endpoints": [{
            "port": None, "targetPort": None, "path": None, "scheme": None, "params": None, "interval": None,
            "scrapeTimeout": None, "honorLabels": None, "honorTimestamps": None, "relabelings": None,
            "metricRelabelings": None, "tlsConfig": None, "bearerTokenSecret": None, "authorization": None,
        }],
    },
}
PROMETHEUS_RULE = {
    "apiVersion": None, "kind": None, "metadata": _META,
    "spec": {"groups": [{
        "name": None, "interval": None, "limit": None, "partial_response_strategy": None,
        "rules": [{"alert": None, "record": None, "expr": None, "for": None, "keep_firing_for": None,
                   "labels": None, "annotations": None}],
    }]},
}
# The production-stack chart vllm-stack 0.1.12, helm/values.yaml: the keys this export sets.
HELM_VALUES = {
    "servingEngineSpec": {
        "enableEngine": None, "labels": None, "containerPort": None, "servicePort": None, "vllmApiKey":
            {"secretName": None, "secretKey": None},
        "startupProbe": {"initialDelaySeconds": None, "periodSeconds": None, "failureThreshold": None,
                         "httpGet": {"path": None, "port": None}},
        "modelSpec": [{
            "name": None, "repository": None, "tag": None, "modelURL": None, "modelRevision": None,
            "replicaCount": None, "requestCPU": None, "requestMemory": None, "requestGPU": None, "env": None,
            "shmSize": None, "hf_token": None,
            "vllmConfig": {"maxModelLen": None, "tensorParallelSize": None, "gpuMemoryUtilization": None,
                           "extraArgs": None},
            "keda": {"enabled": None, "minReplicaCount": None, "maxReplicaCount": None, "pollingInterval": None,
                     "cooldownPeriod": None, "triggers": [KEDA_TRIGGER]},
        }],
    },
}


def unknown_fields(doc, shape, where: str = "") -> list[str]:
    if shape is None:
        return []
    if isinstance(shape, list):
        assert isinstance(doc, list), f"{where}: expected a list"
        return [f for i, item in enumerate(doc) for f in unknown_fields(item, shape[0], f"{where}[{i}]")]
    assert isinstance(doc, dict), f"{where}: expected a mapping"
    out = [f"{where}.{k}" for k in doc if k not in shape]
    return out + [f for k, v in doc.items() if k in shape for f in unknown_fields(v, shape[k], f"{where}.{k}")]


@pytest.fixture(scope="module")
def point(tmp_path_factory):
    return load_point(full_sweep(tmp_path_factory.mktemp("sweep")))


@pytest.fixture(params=["full", "fixture"], scope="module")
def any_point(request, point):
    return point if request.param == "full" else load_point(FIXTURES / "sweep")


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is not installed: run `make prometheus` (scripts/setup-prometheus.sh); CI installs it"
    return path


# -- Kubernetes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_objects_pass_strict_schema_validation(any_point, version):
    docs = _docs(kubernetes.render(any_point, Options())) + _docs(autoscaling.render_hpa(any_point, Options()))
    builtin = [d for d in docs if d["kind"] in ("Deployment", "Service", "HorizontalPodAutoscaler")]
    assert [d["kind"] for d in builtin] == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    for doc in builtin:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_kubernetes_validator_is_strict():
    """The check above can fail: a misspelled field is rejected."""
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}, "spec": {"port": [{"port": 80}]}}
    with pytest.raises(kubernetes_validate.ValidationError, match="port"):
        kubernetes_validate.validate(bad, KUBERNETES_VERSIONS[0], strict=True)


def test_custom_resources_use_only_documented_fields(any_point):
    objects = {d["kind"]: d for d in _docs(kubernetes.render(any_point, Options()))}
    objects |= {d["kind"]: d for d in _docs(autoscaling.render_keda(any_point, Options()))}
    objects |= {d["kind"]: d for d in _docs(alerts.render_prometheus_rule(any_point, Options()))}
    assert objects["ScaledObject"]["apiVersion"] == "keda.sh/v1alpha1"
    assert objects["ServiceMonitor"]["apiVersion"] == objects["PrometheusRule"]["apiVersion"] == "monitoring.coreos.com/v1"
    assert unknown_fields(objects["ScaledObject"], KEDA_SCALED_OBJECT) == []
    assert unknown_fields(objects["ServiceMonitor"], SERVICE_MONITOR) == []
    assert unknown_fields(objects["PrometheusRule"], PROMETHEUS_RULE) == []
    assert unknown_fields({"spec": {"triggers": [{"type": "prometheus", "metdata": {}}]}},
                          {"spec": {"triggers": [KEDA_TRIGGER]}}) == [".spec.triggers[0].metdata"]


def test_helm_values_use_the_charts_fields(any_point):
    text = helm.render(any_point, Options())
    assert f"vllm-stack {HELM_CHART_VERSION}" in text
    assert unknown_fields(yaml.safe_load(text), HELM_VALUES) == []


# -- compose --------------------------------------------------------------------------------------


def test_compose_file_parses_as_a_compose_document(any_point):
    parsed = PyCompose.from_yaml(compose.render(any_point, Options()))
    parsed.validate()
    assert parsed.service_names() == [any_point.app_name]


def test_the_compose_parser_rejects_what_compose_would():
    with pytest.raises(ValueError, match="count"):
        PyCompose.from_yaml(
            "services:\n  a:\n    image: x\n    deploy:\n      resources:\n        reservations:\n"
            "          devices:\n            - driver: nvidia\n              count: two\n"
        )


# -- Prometheus rules -----------------------------------------------------------------------------


def test_promtool_checks_both_rule_files(point, tmp_path):
    rules = tmp_path / "alerts.rules.yaml"
    rules.write_text(alerts.render_rules(point, Options()))
    operator = tmp_path / "from-prometheusrule.yaml"
    operator.write_text(yaml.safe_dump(_docs(alerts.render_prometheus_rule(point, Options()))[0]["spec"]))
    result = subprocess.run([promtool(), "check", "rules", str(rules), str(operator)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _series(rule: dict, point, breaking: bool) -> list[dict]:
    """Input series that break `rule` (or keep inside it), 31 one-minute samples."""
    sel = f'model_name="{point.served_model_name}"'
    name = rule["alert"]
    if name == alerts.RUNNING_ALERT:
        value = int(point.safe_concurrency.value) + (1 if breaking else 0)
        return [{"series": f'vllm:num_requests_running{{{sel},instance="a"}}', "values": f"{value}x30"}]
    if name == "VllmKvCacheUsageAboveMeasured":
        bound = float(point.slo["kv_cache_usage_max"].value)
        value = (1 + bound) / 2 if breaking else bound / 2
        return [{"series": f'vllm:kv_cache_usage_perc{{{sel},instance="a"}}', "values": f"{value:g}x30"}]
    if name == "VllmPreemptions":
        step = int(point.slo["max_preemptions"].value) + 1 if breaking else 0
        return [{"series": f'vllm:num_preemptions_total{{{sel},instance="a"}}', "values": f"0+{step}x30"}]
    (metric, stat), bound_ms = next(
        ((k, b) for k, b in alerts.latency_bounds(point).items()
         if name == f"VllmSlo{alerts._camel(k[0])}{k[1].capitalize()}")
    )
    h, bound = alerts.HISTOGRAMS[metric], float(bound_ms.value) / 1000
    if stat == "mean":
        per_request = 2 * bound if breaking else bound / 2
        return [{"series": f"{h}_sum{{{sel}}}", "values": f"0+{10 * per_request:g}x30"},
                {"series": f"{h}_count{{{sel}}}", "values": "0+10x30"}]
    low, high = bound / 2, bound * 2
    counts = {low: 0 if breaking else 10, high: 0 if breaking else 10, "+Inf": 10}
    return [{"series": f'{h}_bucket{{{sel},le="{le if le == "+Inf" else f"{le:g}"}"}}', "values": f"0+{n}x30"}
            for le, n in counts.items()]


def _expected(rule: dict, series: list[dict]) -> list[dict]:
    labels = {"severity": rule["labels"]["severity"]}
    if rule["alert"] in (alerts.RUNNING_ALERT, "VllmKvCacheUsageAboveMeasured", "VllmPreemptions"):
        labels |= {"model_name": series[0]["series"].split('model_name="')[1].split('"')[0], "instance": "a"}
    return [{"exp_labels": labels, "exp_annotations": rule["annotations"]}]


def test_every_alert_fires_on_a_breaking_series_and_stays_silent_otherwise(point, tmp_path):
    rules_path = tmp_path / "alerts.rules.yaml"
    rules_path.write_text(alerts.render_rules(point, Options()))
    rules = yaml.safe_load(rules_path.read_text())["groups"][0]["rules"]
    assert len(rules) >= 6
    tests = []
    for rule in rules:
        for breaking in (True, False):
            series = _series(rule, point, breaking)
            tests.append({
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "20m", "alertname": rule["alert"],
                                     "exp_alerts": _expected(rule, series) if breaking else []}],
            })
    spec = tmp_path / "alerts.test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [rules_path.name], "evaluation_interval": "1m", "tests": tests}))
    result = subprocess.run([promtool(), "test", "rules", str(spec)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_can_fail(point, tmp_path):
    """The check above is not vacuous: expecting silence from a breaking series fails."""
    rules_path = tmp_path / "alerts.rules.yaml"
    rules_path.write_text(alerts.render_rules(point, Options()))
    rule = next(r for r in yaml.safe_load(rules_path.read_text())["groups"][0]["rules"] if r["alert"] == alerts.RUNNING_ALERT)
    test = {"interval": "1m", "input_series": _series(rule, point, True),
            "alert_rule_test": [{"eval_time": "20m", "alertname": rule["alert"], "exp_alerts": []}]}
    spec = tmp_path / "alerts.test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [rules_path.name], "evaluation_interval": "1m", "tests": [test]}))
    result = subprocess.run([promtool(), "test", "rules", str(spec)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0
    assert f"alertname: {alerts.RUNNING_ALERT}" in result.stdout + result.stderr, result.stdout + result.stderr
    assert "exp:[]" in (result.stdout + result.stderr).replace(" ", ""), result.stdout + result.stderr
