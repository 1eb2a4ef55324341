"""`helm`: values for vLLM's production-stack chart (chart `vllm-stack`, version HELM_CHART_VERSION).

One modelSpec runs the measured point: the image of the vLLM version it ran, the model and its
revision, the point's flags as extraArgs (the chart itself adds the model, host and port), its
GPUs, a start-up probe from the measured start-up, and a KEDA section that scales on requests per
replica at the measured safe concurrency instead of the chart's default (waiting requests above
5). Field names follow the chart's values.yaml at that version (servingEngineSpec.modelSpec[],
servingEngineSpec.startupProbe, servingEngineSpec.vllmApiKey, modelSpec[].keda).
"""

from __future__ import annotations

from planner.export import yamltext
from planner.export.autoscaling import provenance_lines, trigger
from planner.export.kubernetes import STARTUP_PERIOD_S, secret_name, startup_failures
from planner.export.provenance import API_KEY_ENV, SERVE_PORT, MeasuredPoint, Options, commented, header_lines

HELM_CHART = "vllm-stack"
HELM_CHART_VERSION = "0.1.12"


def values(point: MeasuredPoint, options: Options) -> dict:
    image = str(point.image().value)
    repository, tag = image.rsplit(":", 1)
    spec: dict = {
        "name": point.app_name,
        "repository": repository,
        "tag": tag,
        "modelURL": point.model,
    }
    if point.revision:
        spec["modelRevision"] = point.revision
    spec |= {
        "replicaCount": options.min_replicas,
        "requestGPU": int(point.gpus.value),
        "vllmConfig": {"extraArgs": list(point.flags)},
    }
    env = [{"name": k, "value": v} for k, v in sorted(point.env.items())]
    env += [
        {"name": n, "valueFrom": {"secretKeyRef": {"name": secret_name(point), "key": n}}}
        for n in point.secret_env if n != API_KEY_ENV
    ]
    if env:
        spec["env"] = env
    spec["keda"] = {
        "enabled": True,
        "minReplicaCount": options.min_replicas,
        "maxReplicaCount": options.max_replicas,
        "triggers": [trigger(point, options)],
    }
    engine: dict = {"modelSpec": [spec], "containerPort": SERVE_PORT}
    failures = startup_failures(point, options)
    if failures is not None:
        engine["startupProbe"] = {
            "initialDelaySeconds": 0,
            "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": failures,
            "httpGet": {"path": "/health", "port": SERVE_PORT},
        }
    if API_KEY_ENV in point.secret_env:
        engine["vllmApiKey"] = {"secretName": secret_name(point), "secretKey": API_KEY_ENV}
    return {"servingEngineSpec": engine}


def render(point: MeasuredPoint, options: Options) -> str:
    lines = header_lines(point, f"values for the production-stack chart {HELM_CHART} {HELM_CHART_VERSION}")
    lines.append(f"image {point.image().value}: {point.image().source}")
    lines.append(f"requestGPU {point.gpus}: {point.gpus.source}")
    lines += [f"keda {line}" for line in provenance_lines(point, options)]
    failures = startup_failures(point, options)
    if failures is not None:
        lines.append(f"startupProbe {failures} x {STARTUP_PERIOD_S} s: {point.startup_text(options)}")
    lines.append(f"install: helm install RELEASE vllm/{HELM_CHART} --version {HELM_CHART_VERSION} -f THIS_FILE")
    return commented(lines) + yamltext.dump(values(point, options))
