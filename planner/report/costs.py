"""The report's Cost section: what each measured point costs per replica-hour and per million
output tokens at its safe concurrency, and what the sized fleet costs (planner.cost). Only
points that were measured and met the SLOs are priced."""

from __future__ import annotations

from planner.cost import fleet_cost, money, point_cost
from planner.report.fleet import FleetPlan
from planner.report.view import PointView, ReportData


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    # markdown.table's layout; markdown imports this module, so it cannot be imported from there.
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows] + [""]


def _gpu(p: PointView) -> str:
    return p.gpu_model or "unrecorded"


def cost_section(data: ReportData, plan: FleetPlan | None) -> list[str]:
    if not data.prices:
        return []
    priced = [(p, data.prices.for_gpu(p.gpu_model)) for p in data.points if p.feasible and p.gpus]
    rows, unpriced = [], []
    for p, price in priced:
        if price is None:
            unpriced.append(f"- `{p.id}` ({_gpu(p)}): no price for this GPU type; give --gpu-hour-price or [cost] gpu_hour")
            continue
        c = point_cost(price, p.gpus or 0, p.output_tokens_per_s_per_gpu)
        rows.append([f"`{p.id}`", _gpu(p), str(p.gpus), f"{money(price.per_gpu_hour)} ({price.source})",
                     money(c.per_replica_hour), money(c.per_million_output_tokens)])
    out = [
        "## Cost", "",
        "Prices are the ones given (`--gpu-hour-price`, `[cost] gpu_hour`); the planner has none of its own. $ per"
        " million output tokens uses the output tokens/s per GPU measured at the safe concurrency.", "",
    ]
    out += _table(["point", "GPU", "GPUs/replica", "$/GPU-hour (from)", "$/hour per replica",
                   "$ per 1M output tokens"], rows)
    out += unpriced + ([""] if unpriced else [])
    if plan is not None:
        out += _fleet_costs(data, plan)
    return out


def _fleet_costs(data: ReportData, plan: FleetPlan) -> list[str]:
    by_id = {p.id: p for p in data.points}
    rows = []
    for o in plan.options:
        price = data.prices.for_gpu(by_id[o.point_id].gpu_model)
        if price is None or o.gpus_per_replica is None:
            continue
        f = fleet_cost(price, o.replicas, o.gpus_per_replica)
        rows.append((f.per_hour, [f"`{o.point_id}`", str(f.replicas), str(f.gpus), money(f.per_hour), money(f.per_month)]))
    if not rows:
        return []
    rows.sort(key=lambda r: r[0])
    lines = ["Fleet for the target, cheapest first ($/month = $/hour x 730):", ""]
    return lines + _table(["point", "replicas", "GPUs", "$/hour", "$/month"], [r for _, r in rows])
