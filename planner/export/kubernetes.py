"""`kubernetes`: a Deployment, a Service and a ServiceMonitor for the measured point.

The Deployment asks for the point's GPUs, mounts a memory-backed /dev/shm (tensor-parallel
workers share memory through it), probes /health (start-up from the measured start-up, then
readiness and liveness), and, when the sweep recorded the GPUs' peak memory, keeps to nodes whose
GPUs have at least that much (the NVIDIA GPU feature discovery label `nvidia.com/gpu.memory`, in
MiB). Host CPU and memory were not measured, so none is requested: set them for your nodes.

The ServiceMonitor (prometheus-operator's monitoring.coreos.com/v1) scrapes vLLM's /metrics.
"""

from __future__ import annotations

import math

from planner.export import yamltext
from planner.export.provenance import SERVE_PORT, MeasuredPoint, Options, commented, header_lines

CONTAINER = "vllm"
PORT_NAME = "http"
STARTUP_PERIOD_S = 10
SCRAPE_INTERVAL = "15s"


def labels(point: MeasuredPoint) -> dict[str, str]:
    return {"app.kubernetes.io/name": point.app_name, "app.kubernetes.io/component": "vllm"}


def manifest(api_version: str, kind: str, point: MeasuredPoint, options: Options, spec: dict, **metadata: object) -> dict:
    """A Kubernetes object of the point's app: named after it, in the namespace, with its labels
    (and any further `metadata`, such as annotations), then `spec`."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": point.app_name, "namespace": options.namespace, "labels": labels(point), **metadata},
        "spec": spec,
    }


def deployment_ref(point: MeasuredPoint) -> dict:
    """The point's Deployment, as an autoscaler's scaleTargetRef names it."""
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": point.app_name}


def annotations(point: MeasuredPoint) -> dict[str, str]:
    return {
        "planner/results": str(point.results_path),
        "planner/point": point.point_id,
        "planner/measured-at": point.measured_at or "unrecorded",
    }


def secret_name(point: MeasuredPoint) -> str:
    return f"{point.app_name}-secrets"


def env(point: MeasuredPoint) -> list[dict]:
    out: list[dict] = [{"name": k, "value": v} for k, v in sorted(point.env.items())]
    for name in point.secret_env:
        out.append({"name": name, "valueFrom": {"secretKeyRef": {"name": secret_name(point), "key": name}}})
    return out


def _probe(period_s: int, failures: int) -> dict:
    return {"httpGet": {"path": "/health", "port": PORT_NAME}, "periodSeconds": period_s, "failureThreshold": failures}


def startup_failures(point: MeasuredPoint, options: Options) -> int | None:
    allowance = point.startup_allowance_s(options)
    return None if allowance is None else max(1, math.ceil(allowance / STARTUP_PERIOD_S))


def _affinity(point: MeasuredPoint) -> dict | None:
    if point.gpu_memory_peak_mib is None:
        return None
    need = math.ceil(float(point.gpu_memory_peak_mib.value))
    term = {"matchExpressions": [{"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": [str(need - 1)]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def deployment(point: MeasuredPoint, options: Options) -> dict:
    gpus = str(int(point.gpus.value))
    container: dict = {
        "name": CONTAINER,
        "image": point.image().value,
        "args": point.server_args(),
        "ports": [{"name": PORT_NAME, "containerPort": SERVE_PORT}],
        "resources": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "readinessProbe": _probe(5, 3),
        "livenessProbe": _probe(10, 3),
    }
    failures = startup_failures(point, options)
    if failures is not None:
        container["startupProbe"] = _probe(STARTUP_PERIOD_S, failures)
    if env(point):
        container["env"] = env(point)
    pod: dict = {"containers": [container], "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}
    affinity = _affinity(point)
    if affinity is not None:
        pod["affinity"] = affinity
    spec = {
        "replicas": options.min_replicas,
        "selector": {"matchLabels": labels(point)},
        "template": {"metadata": {"labels": labels(point), "annotations": annotations(point)}, "spec": pod},
    }
    return manifest("apps/v1", "Deployment", point, options, spec, annotations=annotations(point))


def service(point: MeasuredPoint, options: Options) -> dict:
    ports = [{"name": PORT_NAME, "port": SERVE_PORT, "targetPort": PORT_NAME}]
    return manifest("v1", "Service", point, options, {"selector": labels(point), "ports": ports})


def service_monitor(point: MeasuredPoint, options: Options) -> dict:
    spec = {
        "selector": {"matchLabels": labels(point)},
        "endpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": SCRAPE_INTERVAL}],
    }
    return manifest("monitoring.coreos.com/v1", "ServiceMonitor", point, options, spec)


def documents(point: MeasuredPoint, options: Options) -> list[dict]:
    return [deployment(point, options), service(point, options), service_monitor(point, options)]


def render(point: MeasuredPoint, options: Options) -> str:
    lines = header_lines(point, "Kubernetes Deployment, Service and ServiceMonitor")
    lines.append(f"image {point.image().value}: {point.image().source}")
    lines.append(f"nvidia.com/gpu {point.gpus}: {point.gpus.source}")
    failures = startup_failures(point, options)
    if failures is not None:
        lines.append(f"startupProbe {failures} x {STARTUP_PERIOD_S} s: {point.startup_text(options)}")
    else:
        lines.append("no startupProbe: the start-up was not measured; add one sized to your model's load time")
    if point.gpu_memory_peak_mib is not None:
        lines.append(
            f"nodes with nvidia.com/gpu.memory > {math.ceil(float(point.gpu_memory_peak_mib.value)) - 1} MiB:"
            f" peak {point.gpu_memory_peak_mib} MiB, {point.gpu_memory_peak_mib.source}"
        )
    lines.append(f"replicas {options.min_replicas}: --min-replicas (export default 1; the autoscaler sets it from then on)")
    lines.append("host CPU and memory were not measured: no requests are set for them")
    if point.secret_env:
        lines.append(f"secrets read from Secret {secret_name(point)} (create it): {', '.join(point.secret_env)}")
    return commented(lines) + "---\n" + yamltext.dump(*documents(point, options))
