"""The report's account of [sweep] strategy = "adaptive" (planner.sweep.adaptive): the points
grouped by how they were answered, each speed class's law with its measured and fitted ratios,
every prediction with its interval, and the time spent against what the searches it skipped
cost where they were measured. A pure function of sweep.json."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from planner.sweep.results import SweepResults

SOURCES = ("searched", "verified", "predicted", "dominated")


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines + [""]


def _verify_all(sweep: SweepResults) -> bool:
    saved = (sweep.settings.model_extra or {}).get("sweep") or {}
    return isinstance(saved, dict) and saved.get("verify_predictions") == "all"


def answers_section(sweep: SweepResults | None) -> list[str]:
    if sweep is None or sweep.strategy != "adaptive":
        return []
    points = sweep.points
    out = ["## How the points were answered", ""]
    out += [
        "The adaptive strategy searched one point per speed class in full, predicted the class's other points from"
        " its law and verified those that could win; points that could not beat the best confirmed answer were not"
        " searched (docs/guides/adaptive-sweep.md)."
        + (" Every prediction was verified ([sweep] verify_predictions = \"all\")." if _verify_all(sweep) else ""),
        "",
    ]
    rows = []
    for source in SOURCES:
        ids = [p.id for p in points if p.answer_source == source]
        if ids:
            rows.append((source, len(ids), ", ".join(f"`{i}`" for i in ids)))
    out += _table(["answer", "points", "which"], rows)
    if sweep.adaptive is not None and sweep.adaptive.fallbacks:
        out += [f"{sweep.adaptive.fallbacks} verification(s) disagreed with the prediction and fell back to a full search.", ""]
    for info in sweep.speed_classes:
        law = info.law
        if law is None:
            continue
        top = "-" if law.min_failing is None else law.min_failing
        out += [
            f"### Class {info.id} ({info.label}): law from `{law.from_point}`",
            "",
            f"Passes up to {law.max_passing}, fails from {top}; fitted knee"
            f" {'-' if law.knee is None else f'{law.knee:g}'}."
            + (
                f" Its KV pool stopped it at {law.kv_knee_fraction[0]:.2f}-{law.kv_knee_fraction[1]:.2f} of its"
                + (
                    f" ceiling ({law.kv_knee_ceiling}): each point's KV knee keeps its chance of overflowing"
                    " (a smaller pool fills at a lower share), up to that share of its own ceiling."
                    if law.kv_knee_ceiling else " ceiling: each point's KV knee is that share of its own."
                )
                if law.kv_knee_fraction else ""
            ),
            "",
        ]
        for rule, fitted in law.fitted.items():
            measured: dict[float, list[float]] = {}
            for c, ratio in law.measured.get(rule, []):
                measured.setdefault(c, []).append(ratio)
            crossing = law.crossings.get(rule)
            out += [f"{rule} (measured / bound; crosses 1 at {'-' if crossing is None else f'{crossing:g}'}):", ""]
            out += _table(
                ["concurrency", "measured", "fitted"],
                [(f"{c:g}", ", ".join(f"{r:.3f}" for r in measured.get(c, [])), f"{f:.3f}") for c, f in fitted],
            )
    predicted = [p for p in points if p.knee_prediction is not None]
    if predicted:
        out += ["### Predictions", ""]
        out += _table(
            ["point", "class", "predicted", "interval", "limit", "KV pool read", "verified", "measured max passing"],
            [
                (
                    f"`{p.id}`", k.speed_class, k.concurrency, f"[{k.interval[0]}, {'-' if k.interval[1] is None else k.interval[1]}]",
                    k.limit, "yes" if k.kv_pool_read else "no",
                    {None: "-", True: "agreed", False: "disagreed: searched"}[k.verified],
                    "-" if p.max_passing_concurrency is None else p.max_passing_concurrency,
                )
                for p in predicted
                for k in [p.knee_prediction]
            ],
        )
    out += _time_lines(sweep)
    return out


def _time_lines(sweep: SweepResults) -> list[str]:
    """Time spent, and what the skipped searches would have cost at the mean of the searches
    measured in the same class (no figure where a class has none)."""
    spent = sum(p.duration_s or 0.0 for p in sweep.points)
    searched: dict[str, list[float]] = {}
    for p in sweep.points:
        if p.answer_source == "searched" and p.duration_s is not None and p.speed_class:
            searched.setdefault(p.speed_class, []).append(p.duration_s)
    skipped, unknown = 0.0, 0
    for p in sweep.points:
        if p.answer_source in ("predicted", "dominated", "verified"):
            durations = searched.get(p.speed_class or "")
            if not durations:
                unknown += 1
                continue
            # A settled or verified point still spent its own start-up and steps: count only the rest.
            skipped += max(0.0, sum(durations) / len(durations) - (p.duration_s or 0.0))
    line = f"Time spent on points: {spent:.0f} s."
    if skipped:
        line += (
            f" Searching the points it settled or verified would have cost about {skipped:.0f} s more, at the mean"
            " duration of the full searches measured in each one's class"
        )
        line += f" ({unknown} point(s) without a measured search in their class not counted)." if unknown else "."
    return [line, ""]
