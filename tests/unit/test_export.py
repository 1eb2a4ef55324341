"""`planner export`: each format from a fixture sweep, its numbers and where they came from."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from planner.cli import main
from planner.errors import ReportError
from planner.export import FORMATS, Options, alerts, artifacts, autoscaling, compose, helm, kubernetes, load_point, serve
from tests.fakes.export_points import full_sweep
from tests.fakes.results import FIXTURES

SWEEP = FIXTURES / "sweep"


@pytest.fixture
def point(tmp_path):
    return load_point(full_sweep(tmp_path))


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def test_every_output_starts_with_the_header(point):
    for name, text in artifacts(point, list(FORMATS), Options()):
        head = text if name.endswith(".json") else text[:1200]
        assert "sweep.json" in head, name
        assert "mml8192-gmu0.85-tp2" in head, name
        assert "2026-07-14T10:00:00Z" in head, name


def test_the_recommended_point_is_the_default_and_another_can_be_named():
    assert load_point(SWEEP).point_id == "mml8192-gmu0.85-tp2"
    assert load_point(SWEEP, point_id="mml8192-gmu0.95-tp1").safe_concurrency.value == 20


def test_an_unmeasured_point_is_refused_with_the_measured_ones_listed():
    with pytest.raises(ReportError, match="infeasible.*measured points: mml8192-gmu0.85-tp1"):
        load_point(SWEEP, point_id="mml32768-gmu0.85-tp1")
    with pytest.raises(ReportError, match="no point 'nope'"):
        load_point(SWEEP, point_id="nope")


def test_serve_is_the_exact_command_with_secrets_as_references(point):
    text = serve.render(point)
    command = text.split("exec ", 1)[1].replace("\\\n", " ")
    argv = shlex.split(command)
    assert argv[:3] == ["VLLM_ATTENTION_BACKEND=FLASH_ATTN", "VLLM_LOGGING_LEVEL=INFO", "vllm"]
    assert argv[3:] == [
        "serve", "--model", "org/model", "--revision", "abc123", "--max-model-len", "8192",
        "--gpu-memory-utilization", "0.85", "--tensor-parallel-size", "2", "--host", "0.0.0.0", "--port", "8000",
    ]
    assert "***" not in text
    assert ': "${VLLM_API_KEY:?' in text and ': "${HF_TOKEN:?' in text


def test_compose_reserves_the_gpus_and_checks_health(point):
    service = yaml.safe_load(compose.render(point, Options()))["services"]["vllm-model"]
    assert service["image"] == "vllm/vllm-openai:v0.32.0"
    assert service["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 2, "capabilities": ["gpu"]}
    ]
    assert "/health" in " ".join(service["healthcheck"]["test"])
    assert service["healthcheck"]["start_period"] == "191s"  # 2 x the measured 95.4 s
    assert "VLLM_API_KEY" in service["environment"] and "HF_TOKEN" in service["environment"]
    assert "VLLM_LOGGING_LEVEL=INFO" in service["environment"]


def test_kubernetes_deployment_from_the_measured_figures(point):
    deployment, svc, monitor = _docs(kubernetes.render(point, Options(namespace="llm")))
    pod = deployment["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 2 * 95.4
    expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert expr["matchExpressions"][0] == {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["69321"]}
    secret_env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e}
    assert secret_env == {n: {"name": "vllm-model-secrets", "key": n} for n in ("HF_TOKEN", "VLLM_API_KEY")}
    assert svc["kind"] == "Service" and monitor["kind"] == "ServiceMonitor"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert {d["metadata"]["namespace"] for d in (deployment, svc, monitor)} == {"llm"}


def test_a_start_up_that_was_not_measured_is_named_as_the_ceiling():
    point = load_point(SWEEP)
    assert not point.startup_measured
    text = kubernetes.render(point, Options())
    assert "the sweep's start-up ceiling 900.0 s" in text
    c = _docs(text)[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["startupProbe"]["failureThreshold"] == 90


def test_autoscalers_scale_on_requests_per_replica_at_the_safe_concurrency(point):
    keda = _docs(autoscaling.render_keda(point, Options(max_replicas=7)))[0]
    trig = keda["spec"]["triggers"][0]
    assert trig["metricType"] == "AverageValue"
    assert trig["metadata"]["threshold"] == "43"
    assert "vllm:num_requests_(running|waiting)" in trig["metadata"]["query"]
    assert keda["spec"]["maxReplicaCount"] == 7
    hpa = _docs(autoscaling.render_hpa(point, Options()))[0]
    assert hpa["spec"]["metrics"][0]["pods"]["target"] == {"type": "AverageValue", "averageValue": "43"}
    text = autoscaling.render_keda(point, Options())
    assert "floor(max passing 48 x (1 - headroom 0.1))" in text and "headroom kept 0.1" in text


def test_helm_values_carry_the_point_and_its_keda_section(point):
    values = yaml.safe_load(helm.render(point, Options()))["servingEngineSpec"]
    spec = values["modelSpec"][0]
    assert (spec["modelURL"], spec["modelRevision"], spec["requestGPU"]) == ("org/model", "abc123", 2)
    assert spec["vllmConfig"]["extraArgs"] == [
        "--max-model-len", "8192", "--gpu-memory-utilization", "0.85", "--tensor-parallel-size", "2"]
    assert spec["keda"]["triggers"][0]["metadata"]["threshold"] == "43"
    assert values["vllmApiKey"] == {"secretName": "vllm-model-secrets", "secretKey": "VLLM_API_KEY"}
    assert "vllm-stack 0.1.12" in helm.render(point, Options())


def test_alerts_cover_the_slos_the_safe_concurrency_kv_and_preemptions(point):
    rules = {r["alert"]: r for r in yaml.safe_load(alerts.render_rules(point, Options()))["groups"][0]["rules"]}
    assert rules["VllmRunningAboveSafeConcurrency"]["expr"] == 'vllm:num_requests_running{model_name="org/model"} > 43'
    assert rules["VllmSloTtftP99"]["expr"].endswith("> 0.8")
    assert "vllm:time_to_first_token_seconds_bucket" in rules["VllmSloTtftP99"]["expr"]
    assert "vllm:request_time_per_output_token_seconds_bucket" in rules["VllmSloTpotP90"]["expr"]
    assert rules["VllmKvCacheUsageAboveMeasured"]["expr"].endswith("> 0.95")
    assert rules["VllmPreemptions"]["expr"].startswith("increase(vllm:num_preemptions_total")
    assert not any("Max" in name for name in rules)
    assert "no alert for ttft_max_ms" in alerts.render_rules(point, Options())
    prom_rule = _docs(alerts.render_prometheus_rule(point, Options()))[0]
    assert prom_rule["spec"]["groups"][0]["rules"] == list(rules.values())


def test_grafana_panel_draws_the_envelope(point):
    panel = json.loads(alerts.render_panel(point))
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 43, 48]
    assert "mml8192-gmu0.85-tp2" in panel["description"]


def test_cli_writes_one_file_per_output(tmp_path, capsys):
    sweep = full_sweep(tmp_path / "run")
    out = tmp_path / "deploy"
    assert main(["export", str(sweep.parent), "--format", ",".join(FORMATS), "--output", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([
        "serve.sh", "compose.yaml", "kubernetes.yaml", "keda-scaledobject.yaml", "hpa.yaml",
        "production-stack-values.yaml", "alerts.rules.yaml", "prometheusrule.yaml", "grafana-envelope-panel.json",
    ])
    assert main(["export", str(sweep), "--format", "serve"]) == 0
    assert "exec " in capsys.readouterr().out


def test_a_replay_needs_the_server_command(tmp_path, capsys):
    replay = FIXTURES / "replay"
    assert main(["export", str(replay), "--format", "serve"]) == 2
    assert "--server-command" in capsys.readouterr().err
    assert main(["export", str(replay), "--format", "serve", "--server-command", "vllm serve org/m@rev1 -tp 2"]) == 0
    out = capsys.readouterr().out
    assert "--model org/m" in out and "--revision rev1" in out and "a replay keeps no headroom" in out


@pytest.mark.parametrize(
    ("command", "program", "model", "revision", "flags", "key"),
    [
        ("vllm serve org/m@r1 --max-num-seqs 64 --api-key=s3cret", ["vllm", "serve"], "org/m", "r1", ["--max-num-seqs", "64"], True),
        ("python -m vllm.entrypoints.openai.api_server --model /m --host 0.0.0.0 --port 9 -tp 2",
         ["python", "-m", "vllm.entrypoints.openai.api_server"], "/m", None, ["-tp", "2"], False),
    ],
)
def test_a_replays_server_command_is_split_into_program_model_and_flags(
    tmp_path, command, program, model, revision, flags, key
):
    point = load_point(FIXTURES / "replay", server_command=command)
    assert (list(point.program), point.model, point.revision, list(point.flags)) == (program, model, revision, flags)
    assert ("VLLM_API_KEY" in point.secret_env) is key
    assert "s3cret" not in serve.render(point)


def test_the_grafana_panel_uses_the_dashboards_datasource(point):
    dashboard = json.loads((FIXTURES.parents[2] / "docker" / "grafana" / "dashboards" / "planner.json").read_text())
    uids = {p.get("datasource", {}).get("uid") for p in dashboard["panels"] if p.get("datasource")}
    assert json.loads(alerts.render_panel(point))["datasource"]["uid"] in uids


def test_a_point_across_nodes_is_refused_rather_than_exported_as_one_pod(tmp_path):
    sweep = full_sweep(tmp_path)
    text = sweep.read_text().replace('"ranks": []', '"ranks": [{"rank": 0}, {"rank": 1}]', 1)
    sweep.write_text(text)
    with pytest.raises(ReportError, match="ran across 2 nodes"):
        load_point(sweep, point_id="mml8192-gmu0.85-tp1")
