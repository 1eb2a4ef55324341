"""`planner export`: the measured point as a serving command, compose service, Kubernetes
objects, autoscalers, production-stack Helm values and alerting rules."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from planner.cliargs import env_default, flag_values, whole_number

_DURATION = re.compile(r"^[1-9][0-9]*(ms|s|m|h|d|w|y)$")


def _formats(text: str) -> list[str]:
    from planner.export import FORMATS

    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in FORMATS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: formats are {', '.join(FORMATS)} (comma-separated)")
    return list(dict.fromkeys(names))


def _duration(text: str) -> str:
    if not _DURATION.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Prometheus duration such as 30s, 5m or 1h")
    return text


_replicas = whole_number(0, "replicas", "0 replicas")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="turn a measured point into a serving command, deployment, autoscaler and alerts",
        description=(
            "Write what production runs from sweep.json (the recommended point unless --point names another) or a "
            "replay's replay.json plus --server-command. Every output starts with a header naming the results file, the "
            "point and when it was measured, and says where each number came from. Secrets stay references."
        ),
    )
    p.add_argument("results", type=Path, metavar="RESULTS", help="sweep.json or replay.json, or the folder holding it")
    p.add_argument("--format", dest="formats", type=_formats, required=True, metavar="FORMATS",
                   help="comma-separated: serve, compose, kubernetes, autoscaling, helm, alerts")
    p.add_argument("--point", metavar="ID", help="a sweep's point id (default: the recommended point)")
    p.add_argument("--server-command", metavar="CMD",
                   help="for a replay.json: the command the measured server ran, e.g. 'vllm serve MODEL --max-model-len 8192'")
    p.add_argument("--output", type=Path, metavar="DIR", help="write one file per output into DIR (default: stdout)")
    p.add_argument("--namespace", default=env_default("PLANNER_EXPORT_NAMESPACE") or "default",
                   help="Kubernetes namespace of the objects (env PLANNER_EXPORT_NAMESPACE; default: default)")
    p.add_argument("--prometheus-url", default=env_default("PLANNER_EXPORT_PROMETHEUS_URL"),
                   help="the Prometheus KEDA queries (env PLANNER_EXPORT_PROMETHEUS_URL; default: the production-stack"
                        " chart's http://prometheus-operated.monitoring.svc:9090)")
    p.add_argument("--min-replicas", type=_replicas, default=1, help="the autoscaler's floor (default 1)")
    p.add_argument("--max-replicas", type=_replicas, default=10, help="the autoscaler's ceiling (default 10)")
    p.add_argument("--alert-window", type=_duration, default="5m", help="range of the SLO and preemption alerts (default 5m)")
    p.add_argument("--alert-for", type=_duration, default="5m", help="how long a breach lasts before it fires (default 5m)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from planner.errors import ConfigError
    from planner.export import Options, artifacts, load_point
    from planner.export.provenance import write_artifacts

    if args.max_replicas < max(1, args.min_replicas):
        raise ConfigError(f"--max-replicas {args.max_replicas} must be >= 1 and >= --min-replicas {args.min_replicas}")
    options = Options(
        **flag_values(args, "namespace", "min_replicas", "max_replicas", "alert_window", "alert_for"),
        **({"prometheus_url": args.prometheus_url} if args.prometheus_url else {}),
    )
    point = load_point(args.results, point_id=args.point, server_command=args.server_command)
    outputs = artifacts(point, args.formats, options)
    if args.output is None:
        for i, (name, text) in enumerate(outputs):
            sys.stdout.write(("\n" if i else "") + f"# ==> {name} <==\n" + text)
        return 0
    for path in write_artifacts(args.output, outputs):
        print(path)
    return 0
