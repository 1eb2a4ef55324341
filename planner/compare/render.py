"""A comparison as text: a one-screen summary (the terminal, `--baseline`) and compare.md."""

from __future__ import annotations

from planner.compare.core import THROUGHPUT, Comparison, PointComparison, StatisticComparison


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _ci(ci: list[float | None] | None) -> str:
    if not ci:
        return "[?, ?]"
    return "[" + ", ".join(_num(v) for v in ci) + "]"


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)


def _knee(knee: list[int | None] | None) -> str:
    if not knee:
        return "-"
    return "[" + ", ".join("?" if v is None else str(v) for v in knee) + "]"


def _unit(statistic: str) -> str:
    return "tokens/s/GPU" if statistic == THROUGHPUT else "ms"


def _load(row: StatisticComparison) -> str:
    return f"{row.value:g}" if row.load == "concurrency" else f"{row.load} {row.value:g}"


def _p(p: float | None) -> str:
    if p is None:
        return "-"
    return "<0.0001" if p < 1e-4 else f"{p:.4f}"


def _capacity_phrase(point: PointComparison) -> str | None:
    cap = point.capacity
    if cap is None:
        return None
    return (
        f"safe {_int(cap.base_safe_concurrency)} -> {_int(cap.new_safe_concurrency)},"
        f" max passing {_int(cap.base_max_passing_concurrency)} -> {_int(cap.new_max_passing_concurrency)},"
        f" knee {_knee(cap.base_knee_interval)} -> {_knee(cap.new_knee_interval)}"
        + (
            f", knee band from every step {_knee(cap.base_knee_range)} -> {_knee(cap.new_knee_range)}"
            if cap.base_knee_range is not None or cap.new_knee_range is not None
            else ""
        )
        + (
            f", bound by {cap.base_bound_by} -> {cap.new_bound_by}"
            if {cap.base_bound_by, cap.new_bound_by} - {None, "-"}
            else ""
        )
    )


def summary_lines(c: Comparison) -> list[str]:
    """The reason in one screen: the verdict, what changed, and each point's decisive figures."""
    lines = [f"compare {c.base} -> {c.new}: {c.verdict.upper()}"]
    lines.append("changed: " + ", ".join(c.identity_changes))
    if not (c.base_identity_recorded and c.new_identity_recorded):
        lines.append("note: a file predates recorded identities; only its version, model, corpus and SLOs are known")
    if c.only_in_base:
        lines.append("only in the baseline: " + "; ".join(c.only_in_base))
    if c.only_in_new:
        lines.append("only in the new run: " + "; ".join(c.only_in_new))
    for point in c.points:
        head = f"{point.label}: {point.verdict}"
        cap = _capacity_phrase(point)
        lines.append(head + (f" ({cap})" if cap else ""))
        for reason in point.reasons:
            lines.append(f"  {reason}")
        for row in point.statistics:
            if row.verdict in ("regressed", "improved"):
                lines.append(
                    f"  {row.statistic} at {_load(row)}: {_num(row.base)} {_ci(row.base_ci95)} -> {_num(row.new)}"
                    f" {_ci(row.new_ci95)} {_unit(row.statistic)}, p={_p(row.p_value)}"
                )
    figures = "1 figure" if c.tests == 1 else f"{c.tests} figures"
    lines.append(f"{figures} tested (MOVER on the stored 95% intervals; Holm-corrected: 5% chance of any false alarm)")
    return lines


def _measured_on(identity) -> str:
    model = identity.model
    parts = [f"vLLM {identity.vllm_version or '?'}", f"model {model.name or '?'}"]
    if model.revision:
        parts.append(f"revision {model.revision}")
    if model.sha256:
        parts.append(f"files {model.sha256[:12]}")
    for label, value in (("dtype", model.dtype), ("quantization", model.quantization), ("KV cache", model.kv_cache_dtype)):
        if value:
            parts.append(f"{label} {value}")
    hw = identity.hardware
    if hw is not None:
        if hw.kind == "gpu":
            parts.append(f"{hw.count} x {hw.model} (driver {hw.driver_version or '?'}, CUDA {hw.cuda_version or '?'})")
        else:
            parts.append(f"CPU {hw.cpu_model or '?'}")
    if identity.server_flags:
        parts.append("flags `" + " ".join(identity.server_flags) + "`")
    if identity.corpus_sha256:
        parts.append(f"corpus {identity.corpus_sha256[:12]}")
    return ", ".join(parts)


def markdown(c: Comparison, plots: list[str]) -> str:
    out = [f"# Comparison: {c.verdict}", ""]
    out.append(f"- baseline: `{c.base}`")
    out.append(f"- new: `{c.new}`")
    out.append(f"- what changed: {', '.join(c.identity_changes)}")
    out.append(f"- baseline measured on: {_measured_on(c.base_identity)}")
    out.append(f"- new run measured on: {_measured_on(c.new_identity)}")
    if c.only_in_base:
        out.append(f"- only in the baseline: {'; '.join(c.only_in_base)}")
    if c.only_in_new:
        out.append(f"- only in the new run: {'; '.join(c.only_in_new)}")
    out.append(f"- method: {c.method}; {c.tests} figures tested")
    if c.min_change:
        out.append(f"- significant changes under {c.min_change:.0%} of the baseline's figure count as unchanged (--min-change)")
    out.append("")
    out.append("## Capacity per point")
    out.append("")
    out.append("| point | verdict | safe before | safe after | max passing before | after | knee before | knee after"
               " | knee band before | knee band after | why |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in c.points:
        cap = p.capacity
        if cap is None:
            out.append(f"| {p.label} | {p.verdict} | - | - | - | - | - | - | - | - | not searched |")
            continue
        out.append(
            f"| {p.label} | {p.verdict} | {_int(cap.base_safe_concurrency)} | {_int(cap.new_safe_concurrency)}"
            f" | {_int(cap.base_max_passing_concurrency)} | {_int(cap.new_max_passing_concurrency)}"
            f" | {_knee(cap.base_knee_interval)}{'' if cap.base_confirmed else ' (unconfirmed)'}"
            f" | {_knee(cap.new_knee_interval)}{'' if cap.new_confirmed else ' (unconfirmed)'}"
            f" | {_knee(cap.base_knee_range) if cap.base_knee_range else '-'}"
            f" | {_knee(cap.new_knee_range) if cap.new_knee_range else '-'} | {cap.reason} |"
        )
    for p in c.points:
        out.append("")
        out.append(f"## {p.label}: {p.verdict}")
        out.append("")
        for reason in p.reasons:
            out.append(f"- {reason}")
        if p.reasons:
            out.append("")
        if not p.statistics:
            out.append("No load was measured in both runs.")
            continue
        out.append("| load | statistic | before | 95% interval | after | 95% interval | change | difference 95% | p | verdict |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in p.statistics:
            change = "-" if r.change_fraction is None else f"{r.change_fraction:+.1%}"
            out.append(
                f"| {_load(r)} | {r.statistic} | {_num(r.base)} | {_ci(r.base_ci95)} | {_num(r.new)} | {_ci(r.new_ci95)}"
                f" | {change} | {_ci(r.difference_ci95)} | {_p(r.p_value)} | {r.verdict} |"
            )
    if plots:
        out.append("")
        out.append("## Plots")
        out.append("")
        out.extend(f"![{name}]({name})" for name in plots)
    out.append("")
    return "\n".join(out)
