"""`autoscaling`: scale on requests per replica at the measured safe concurrency.

Both objects hold (vllm:num_requests_running + vllm:num_requests_waiting) per replica at or
below the point's safe concurrency, the highest concurrency that met every SLO less the headroom
the sweep kept. The production-stack chart's default trigger (vllm:num_requests_waiting above 5)
is a guess; this one is the measurement.

- A KEDA ScaledObject (keda.sh/v1alpha1, fields as documented for KEDA 2.16: ScaledObject spec
  and the prometheus scaler) with a Prometheus trigger. metricType AverageValue divides the
  query's total by the replicas, so the threshold is per replica.
- An autoscaling/v2 HorizontalPodAutoscaler for clusters with a custom-metrics adapter: a Pods
  metric that the adapter must serve per pod; the prometheus-adapter rule that does is printed
  beside it.
"""

from __future__ import annotations

from planner.export import yamltext
from planner.export.kubernetes import deployment_ref, manifest
from planner.export.provenance import MeasuredPoint, Options, commented, header_lines

KEDA_VERSION = "2.16"
# The per-pod metric the HPA reads through a custom-metrics adapter.
POD_METRIC = "vllm_requests_in_flight"


def selector(point: MeasuredPoint) -> str:
    return f'model_name="{point.served_model_name}"'


def in_flight_query(point: MeasuredPoint) -> str:
    """Requests running plus waiting, summed over the fleet (the trigger divides by replicas)."""
    return f'sum({{__name__=~"vllm:num_requests_(running|waiting)", {selector(point)}}})'


def scaled_object(point: MeasuredPoint, options: Options) -> dict:
    spec = {
        "scaleTargetRef": deployment_ref(point),
        "minReplicaCount": options.min_replicas,
        "maxReplicaCount": options.max_replicas,
        "triggers": [trigger(point, options)],
    }
    return manifest("keda.sh/v1alpha1", "ScaledObject", point, options, spec)


def trigger(point: MeasuredPoint, options: Options) -> dict:
    return {
        "type": "prometheus",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": options.prometheus_url,
            "query": in_flight_query(point),
            "threshold": str(point.safe_concurrency.value),
            # A target Prometheus no longer answers for is an error, not zero load.
            "ignoreNullValues": "false",
        },
    }


def hpa(point: MeasuredPoint, options: Options) -> dict:
    target = {"type": "AverageValue", "averageValue": str(point.safe_concurrency.value)}
    spec = {
        "scaleTargetRef": deployment_ref(point),
        "minReplicas": options.min_replicas,
        "maxReplicas": options.max_replicas,
        "metrics": [{"type": "Pods", "pods": {"metric": {"name": POD_METRIC}, "target": target}}],
    }
    return manifest("autoscaling/v2", "HorizontalPodAutoscaler", point, options, spec)


def adapter_rule(point: MeasuredPoint) -> list[str]:
    """The prometheus-adapter rule that serves POD_METRIC per pod (its `rules.custom` entry)."""
    return [
        f'- seriesQuery: \'vllm:num_requests_running{{{selector(point)},namespace!="",pod!=""}}\'',
        "  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}",
        f'  name: {{matches: "vllm:num_requests_running", as: "{POD_METRIC}"}}',
        "  metricsQuery: 'sum by (<<.GroupBy>>) ({__name__=~\"vllm:num_requests_(running|waiting)\",<<.LabelMatchers>>})'",
    ]


def provenance_lines(point: MeasuredPoint, options: Options) -> list[str]:
    return [
        f"threshold {point.safe_concurrency} requests (running + waiting) per replica: {point.safe_concurrency.source}",
        f"highest passing concurrency {point.max_passing}: {point.max_passing.source}",
        f"headroom kept {point.headroom}: {point.headroom.source}",
        f"replicas {options.min_replicas} to {options.max_replicas}: --min-replicas/--max-replicas (export defaults 1 and 10)",
    ]


def render_keda(point: MeasuredPoint, options: Options) -> str:
    lines = header_lines(point, f"KEDA ScaledObject (KEDA {KEDA_VERSION})") + provenance_lines(point, options)
    lines.append(f"Prometheus at {options.prometheus_url}: --prometheus-url")
    return commented(lines) + "---\n" + yamltext.dump(scaled_object(point, options))


def render_hpa(point: MeasuredPoint, options: Options) -> str:
    lines = header_lines(point, "autoscaling/v2 HorizontalPodAutoscaler") + provenance_lines(point, options)
    lines += [f"needs a custom-metrics adapter serving {POD_METRIC} per pod; for prometheus-adapter, under rules.custom:"]
    lines += ["  " + line for line in adapter_rule(point)]
    return commented(lines) + "---\n" + yamltext.dump(hpa(point, options))
