"""`planner report A/ B/ C/ --target-rps R`: the cheapest measured configuration for a target
load, across sweeps run on different machines (an H100 box, an L40S box, ...).

Every point that was measured and met the SLOs in any of the sweeps is sized for the target
(planner.report.fleet: replicas from the rate measured at its safe concurrency) and priced
(planner.cost: each sweep's [cost] gpu_hour, or --gpu-hour-price). The ranking is by fleet
$/hour; each row says what bound the point (the SLO or limit that stopped its search) and which
target set its replica count. Points that were not measured (predicted infeasible, failed, never
passing) are listed apart and never priced; points without a price for their GPU are listed
apart too rather than guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.cost import FleetCost, Price, Prices, fleet_cost, money
from planner.report.fleet import FleetOption, plan_fleet
from planner.report.view import ReportData


@dataclass(frozen=True)
class Ranked:
    source: Path
    point_id: str
    gpu_model: str | None
    option: FleetOption
    price: Price
    cost: FleetCost
    binding_constraint: str | None
    sized_by: str


@dataclass(frozen=True)
class Ranking:
    target_rps: float | None
    target_concurrency: int | None
    # Cheapest first.
    ranked: tuple[Ranked, ...]
    # (results file, point id, why it is not in the ranking).
    left_out: tuple[tuple[Path, str, str], ...]

    @property
    def cheapest(self) -> Ranked | None:
        return self.ranked[0] if self.ranked else None


def _sized_by(option: FleetOption, target_rps: float | None, target_concurrency: int | None) -> str:
    by_conc = -(-target_concurrency // option.safe_concurrency) if target_concurrency is not None else 0
    if target_rps is None or (target_concurrency is not None and by_conc >= option.replicas):
        return f"{target_concurrency} concurrent at {option.safe_concurrency} each"
    rate = option.requests_per_s_per_replica
    return f"{target_rps:g} req/s at {rate.requests_per_s:.2f} each ({rate.method})" if rate else f"{target_rps:g} req/s"


def rank(
    sweeps: Sequence[tuple[ReportData, Prices]],
    *,
    target_rps: float | None = None,
    target_concurrency: int | None = None,
) -> Ranking:
    ranked: list[Ranked] = []
    left_out: list[tuple[Path, str, str]] = []
    for data, prices in sweeps:
        plan = plan_fleet(data.points, target_rps=target_rps, target_concurrency=target_concurrency)
        by_id = {p.id: p for p in data.points}
        for p in data.points:
            if not p.feasible:
                left_out.append((data.source, p.id, f"not measured to pass the SLOs (status {p.status})"))
        for pid, why in plan.unsized.items():
            left_out.append((data.source, pid, why))
        for o in plan.options:
            p = by_id[o.point_id]
            price = prices.for_gpu(p.gpu_model)
            if o.gpus_per_replica is None:
                left_out.append((data.source, o.point_id, "its GPU count is not recorded (a replay)"))
            elif price is None:
                left_out.append((data.source, o.point_id,
                                 f"no price for its GPU ({p.gpu_model or 'model not recorded'}); give --gpu-hour-price"))
            else:
                ranked.append(Ranked(
                    data.source, o.point_id, p.gpu_model, o, price, fleet_cost(price, o.replicas, o.gpus_per_replica),
                    p.binding_constraint, _sized_by(o, target_rps, target_concurrency),
                ))
    # At one price, the point with more safe concurrency per replica leaves more room.
    ranked.sort(key=lambda r: (r.cost.per_hour, r.cost.gpus, -r.option.safe_concurrency, str(r.source), r.point_id))
    return Ranking(target_rps, target_concurrency, tuple(ranked), tuple(left_out))


def render(ranking: Ranking) -> str:
    targets = [f"{ranking.target_rps:g} requests/s"] if ranking.target_rps is not None else []
    targets += [f"{ranking.target_concurrency} concurrent requests"] if ranking.target_concurrency is not None else []
    lines = [f"# Cheapest measured configuration for {' and '.join(targets)}", ""]
    best = ranking.cheapest
    if best is None:
        lines += ["No measured point could be sized and priced; see below.", ""]
    else:
        lines += [
            f"Cheapest: `{best.point_id}` from {best.source} on {best.gpu_model or 'an unrecorded GPU'}: "
            f"{best.cost.replicas} replicas, {best.cost.gpus} GPUs, {money(best.cost.per_hour)}/hour, "
            f"{money(best.cost.per_month)}/month ({best.price.source} {money(best.price.per_gpu_hour)}/GPU-hour).", "",
        ]
    header = ["rank", "results", "point", "GPU", "safe conc.", "binding constraint", "replicas set by", "replicas",
              "GPUs", "$/hour", "$/month"]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for i, r in enumerate(ranking.ranked, 1):
        cells = [str(i), str(r.source), f"`{r.point_id}`", r.gpu_model or "unrecorded", str(r.option.safe_concurrency),
                 r.binding_constraint or "-", r.sized_by, str(r.cost.replicas), str(r.cost.gpus),
                 money(r.cost.per_hour), money(r.cost.per_month)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if ranking.left_out:
        lines += ["", "Not ranked (never priced as if measured):", ""]
        lines += [f"- {source}: `{pid}`: {why}" for source, pid, why in ranking.left_out]
    return "\n".join(lines) + "\n"
