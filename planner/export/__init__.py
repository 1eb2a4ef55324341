"""From a measured point to what production runs: the server command, a compose service,
Kubernetes objects, autoscalers, production-stack Helm values and alerting rules.

    load_point(RESULTS, point_id, server_command)   provenance: the point and where each number came from
    artifacts(point, formats, options)              one (file name, text) per output, every one with its header

One module per format; each renders from the MeasuredPoint alone, so an export is a pure
function of the saved results (and the options that say what the results cannot: namespace,
replica bounds, Prometheus' address).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from planner.export import alerts, autoscaling, compose, helm, kubernetes, serve
from planner.export.provenance import MeasuredPoint, Options, load_point

Format = Literal["serve", "compose", "kubernetes", "autoscaling", "helm", "alerts"]
FORMATS: tuple[str, ...] = get_args(Format)


def artifacts(point: MeasuredPoint, formats: Sequence[Format], options: Options) -> list[tuple[str, str]]:
    """(file name, text) for every output of the formats, in the order asked."""
    out: list[tuple[str, str]] = []
    for fmt in formats:
        match fmt:
            case "serve":
                out.append(("serve.sh", serve.render(point)))
            case "compose":
                out.append(("compose.yaml", compose.render(point, options)))
            case "kubernetes":
                out.append(("kubernetes.yaml", kubernetes.render(point, options)))
            case "autoscaling":
                out.append(("keda-scaledobject.yaml", autoscaling.render_keda(point, options)))
                out.append(("hpa.yaml", autoscaling.render_hpa(point, options)))
            case "helm":
                out.append(("production-stack-values.yaml", helm.render(point, options)))
            case "alerts":
                out.append(("alerts.rules.yaml", alerts.render_rules(point, options)))
                out.append(("prometheusrule.yaml", alerts.render_prometheus_rule(point, options)))
                out.append(("grafana-envelope-panel.json", alerts.render_panel(point)))
    return out


__all__ = ["FORMATS", "Format", "MeasuredPoint", "Options", "artifacts", "load_point"]
