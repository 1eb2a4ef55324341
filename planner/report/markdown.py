"""report.md: the recommendation first, then every point, failures, and measured versus estimated."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from planner.report import environment
from planner.report.costs import cost_section
from planner.report.fleet import FleetPlan
from planner.report.suggestions import suggest
from planner.report.view import LOAD_AXIS_LABELS, PointView, ReportData
from replay.results import ServerLatency, StepResult
from replay.search import binding as binding_mod
from replay.search import pass_fit
from replay.search.verdicts import concurrency_history
from replay.slo import rules as slo_mod
from replay.slo.exceedance import exceedance_text

DASH = "-"


def num(x: float | int | None, digits: int = 1) -> str:
    if x is None:
        return DASH
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.{digits}f}"


def pct(fraction: float | None, digits: int = 1) -> str:
    return DASH if fraction is None else f"{fraction * 100:.{digits}f}%"


def _cell(text: str) -> str:
    # A pipe inside a cell would split the table row.
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


def _throughput_per_gpu(p: PointView) -> float | None:
    if p.output_tokens_per_s_per_gpu is not None:
        return p.output_tokens_per_s_per_gpu
    step = _step_at(p, p.safe)
    if step is None:
        return None
    return step.output_tokens_per_s / (p.gpus or 1)


def _step_at(p: PointView, concurrency: int | None) -> StepResult | None:
    if concurrency is None:
        return None
    return next((s for s in p.steps if s.load.mode == "concurrency" and s.load.value == concurrency), None)


def _answer_basis(p: PointView) -> str:
    """Which load the answer was read at, in words (replay.search.verdicts.recommended_load)."""
    if p.answer_basis == "start_majority" and p.start_knees:
        knees = ", ".join(f"start {k} {num(v)}" for k, v in p.start_knees.items())
        n = len(p.start_knees)
        return (
            f"{num(p.answer_load)}, the highest load that held on {pass_fit.majority_count(n)} of {n} server starts, each start's"
            f" knee fitted over its own steps ({knees})"
        )
    if p.answer_basis == "knee_fit":
        level = pass_fit.level_of(p.knee_fit_level)
        return (
            f"{num(p.knee_fit)}, the highest load whose pass probability fitted over every step is at least"
            f" {level:g} (the search's highest pass below its lowest failure: {num(p.max_passing)})"
        )
    return f"{num(p.max_passing)}, the highest pass below the lowest failure (written before the fit over every step)"


def _lowest_non_pass(p: PointView) -> str:
    """Where the search's bracket ends: "first violated" only where a step there failed
    conclusively; the bracket also ends at a step that was only inconclusive (it did not pass),
    which violated nothing shown."""
    if p.min_failing is None:
        return ""
    at = [probe for probe in concurrency_history(p.steps) if probe.concurrency == p.min_failing and probe.informative]
    verdicts = {probe.verdict for probe in at}
    if "fail" in verdicts or not verdicts:
        return f", first violated at concurrency {p.min_failing}"
    return f", lowest step that did not pass: concurrency {p.min_failing} (inconclusive, nothing violated conclusively)"


def _recommendation(data: ReportData) -> list[str]:
    out = ["## Recommendation", ""]
    best = data.best
    if best is None:
        out.append("**No configuration met the SLOs.** See the failures and the binding constraints below.")
        return out + [""]
    if data.kind == "sweep":
        out.append(f"- Configuration: `{best.config_text()}` (point `{best.id}`)")
        out.append(
            f"- Safe concurrency per GPU: **{num(best.safe_per_gpu, 2)}** "
            f"({num(best.safe)} concurrent requests per server on {best.gpus} GPU{'s' if best.gpus != 1 else ''})"
        )
        tput = _throughput_per_gpu(best)
        out.append(f"- Throughput per GPU at that concurrency: **{num(tput)} output tokens/s**")
    else:
        out.append(f"- Server: {data.url} serving `{data.model}`")
        out.append(f"- Safe concurrency: **{num(best.safe)}** concurrent requests (this server; GPUs not recorded)")
        step = _step_at(best, best.safe)
        if step is not None:
            out.append(
                f"- Throughput at that concurrency: **{num(step.output_tokens_per_s)} output tokens/s**, "
                f"{num(step.requests_per_s, 2)} requests/s"
            )
    fitted = best.fit
    if best.knee_interval is not None:
        lo, hi = best.knee_interval
        # A load that failed and also passed is not a clean fail: say so (replay.search.pass_fit).
        passed_too = next((p for p in fitted.points if p.concurrency == hi and p.passes), None)
        also = f", though it also passed {passed_too.passes} of {passed_too.steps}" if passed_too else ""
        out.append(
            f"- Knee: between {num(lo)} (highest conclusive pass) and {num(hi)} (lowest conclusive fail{also}); "
            + ("the highest pass was **confirmed** by a repeat on fresh prompts"
               if best.confirmed else "the highest pass was **not confirmed** by a repeat")
        )
    band = pass_fit.describe(fitted)
    if band is not None:
        out.append(f"- From every step: {band}")
    starts = pass_fit.describe_starts(best.steps, best.knee_fit_level)
    if starts is not None:
        out.append(f"- {starts[0].upper()}{starts[1:]}")
    for line in pass_fit.little_margin(best.steps, data.slo or {}):
        out.append(f"- {line}")
    for line in pass_fit.rare_event_margin(best.steps, data.slo or {}, best.answer_load, best.knee_fit_level):
        out.append(f"- {line}")
    inconclusive = [s for s in best.steps if s.slo_verdict == "inconclusive"]
    if inconclusive:
        loads = ", ".join(num(s.load.value) for s in inconclusive)
        out.append(f"- Inconclusive steps (counted as failures, never as passes): {loads}")
    unresolved = [s for s in best.steps if s.slo_verdict == "unresolved"]
    if unresolved:
        loads = ", ".join(num(s.load.value) for s in unresolved)
        out.append(
            f"- Unresolved steps (the window ran out of time before the SLOs' bounds were finite; neither"
            f" passes nor failures): {loads}"
        )
    out += [f"- {line[0].upper()}{line[1:]}" for line in environment.disturbed_lines(
        best.steps, best.disturbed_concurrency, best.interference_allowed)]
    if best.binding_constraint is None and best.min_failing is not None:
        binding = "no rule failed conclusively"
    else:
        binding = f"`{best.binding_constraint or 'none reached (the search hit its ceiling)'}`"
    fail_at = _lowest_non_pass(best)
    out.append(f"- Binding constraint: {binding}{fail_at}")
    if best.binding_undecided:
        out.append(
            "- Undecided at that step (its window closed before these were shown either way; they did not bind): "
            + "; ".join(best.binding_undecided)
        )
    out.append(f"- Answer read at: {_answer_basis(best)}")
    if data.kind == "sweep":
        out.append(
            f"- Headroom kept: {pct(best.headroom)} below that load "
            f"({num(best.answer_load)}; {num(best.safe)} recommended"
            + (f"; configured headroom {pct(data.headroom_setting, 0)}, rounded down to whole requests)" if data.headroom_setting is not None else ")")
        )
    else:
        out.append("- Headroom kept: none; this is the load the answer was read at (a sweep applies headroom)")
    if data.best_reason:
        out.append(f"- Why this point: {data.best_reason}")
    if data.fresh_server:
        out.append(f"- {data.fresh_server[0].upper()}{data.fresh_server[1:]}")
    if best.command:
        out.append(f"- Command: `{' '.join(best.command)}`")
    return out + [""]


def _slo_section(data: ReportData) -> list[str]:
    if not data.slo:
        return ["## SLOs", "", "No SLOs were recorded with these results.", ""]
    return ["## SLOs", ""] + table(
        ["SLO", "bound", "judged on"], [(k, f"{v:g}", slo_mod.view(k)) for k, v in data.slo.items()]
    )


def _fleet_section(plan: FleetPlan, data: ReportData) -> list[str]:
    targets = []
    if plan.target_rps is not None:
        targets.append(f"{num(plan.target_rps, 2)} requests/s")
    if plan.target_concurrency is not None:
        targets.append(f"{plan.target_concurrency} concurrent requests")
    out = ["## Fleet sizing", "", f"Target: {' and '.join(targets)}.", ""]
    if plan.target_rps is not None:
        out += [
            "Requests/s per replica is the rate measured at the safe concurrency, interpolated linearly "
            "between the two measured concurrency steps around it (below the lowest step, scaled through "
            "the origin). Replicas = ceil(target / per-replica capacity); GPUs = replicas x GPUs per replica.",
            "",
        ]
    rows = []
    for o in sorted(plan.options, key=lambda o: (o.gpus if o.gpus is not None else o.replicas, o.point_id)):
        rate = o.requests_per_s_per_replica
        rows.append((
            f"`{o.point_id}`" + (" (cheapest)" if o is plan.cheapest else ""),
            num(o.safe_concurrency),
            DASH if rate is None else f"{rate.requests_per_s:.2f} ({rate.method})",
            num(o.replicas),
            num(o.gpus_per_replica),
            num(o.gpus) if o.gpus is not None else "not recorded",
        ))
    if rows:
        out += table(["point", "safe concurrency", "requests/s per replica", "replicas", "GPUs per replica", "GPUs"], rows)
    else:
        out += ["No feasible point to size.", ""]
    if plan.cheapest is not None:
        c = plan.cheapest
        gpus = f"{c.gpus} GPUs" if c.gpus is not None else "GPUs not recorded"
        out += [f"Cheapest: `{c.point_id}`, {c.replicas} replica{'s' if c.replicas != 1 else ''} ({gpus}).", ""]
    for pid, why in plan.unsized.items():
        out.append(f"- `{pid}` not sized: {why}")
    return out + ([""] if plan.unsized else [])


def _points_section(data: ReportData) -> list[str]:
    axes = data.grid_axes
    extra = data.extra_axes
    header = ["point", *axes, *extra, "status", "KV tokens", "max passing", "safe", "safe per GPU",
              "output tok/s per GPU", "binding constraint"]
    rows = []
    for p in data.points:
        rows.append((
            f"`{p.id}`" + (" **best**" if p.id == data.best_id else ""),
            *(str(p.config.get(k, DASH)) for k in axes),
            *(str(p.config.get(k, DASH)) for k in extra),
            p.status + (f" ({p.failure.kind})" if p.failure else ""),
            num(p.capacity.kv_cache_tokens),
            num(p.max_passing),
            num(p.safe),
            num(p.safe_per_gpu, 2),
            num(_throughput_per_gpu(p)) if p.feasible else DASH,
            p.bound_by(DASH),
        ))
    return ["## Every point", ""] + table(header, rows)


def _gpu_models_section(data: ReportData) -> list[str]:
    """Per-GPU figures mean different things on different GPUs: when a cluster sweep ran points
    on several models, each model's points are compared among themselves."""
    by_model: dict[str, list] = {}
    for p in data.points:
        if p.gpu_model is not None:
            by_model.setdefault(p.gpu_model, []).append(p)
    if len(by_model) < 2:
        return []
    out = ["## By GPU model", ""]
    for model, points in sorted(by_model.items()):
        feasible = [p for p in points if p.feasible]
        best = max(feasible, key=lambda p: (p.safe_per_gpu or 0.0, _throughput_per_gpu(p) or 0.0), default=None)
        out += [f"### {model}", ""]
        if best is not None:
            out += [f"Best on {model}: `{best.id}`, {num(best.safe_per_gpu, 2)} safe concurrency per GPU.", ""]
        rows = [
            (
                f"`{p.id}`" + (" **best**" if p is best else ""),
                p.status + (f" ({p.failure.kind})" if p.failure else ""),
                num(p.safe_per_gpu, 2),
                num(_throughput_per_gpu(p)) if p.feasible else DASH,
            )
            for p in points
        ]
        out += table(["point", "status", "safe per GPU", "output tok/s per GPU"], rows)
    return out


def _nodes_section(data: ReportData) -> list[str]:
    """Where each rank of a point across nodes ran: a slow or failing node shows up here."""
    across = [p for p in data.points if p.ranks]
    if not across:
        return []
    rows = [
        (
            f"`{p.id}`",
            str(r.rank) + (" (API)" if r.rank == 0 else ""),
            r.node_hostname or DASH,
            (r.node_id or "")[:8] or DASH,
            ", ".join(r.gpu_ids) or DASH,
            r.gpu_model or DASH,
            f"`{r.log_path}`" if r.log_path else DASH,
        )
        for p in across
        for r in p.ranks
    ]
    return ["## Points across nodes", ""] + table(["point", "rank", "node", "node id", "GPUs", "GPU model", "log"], rows)


def _failures_section(data: ReportData) -> list[str]:
    # Points the adaptive strategy settled unsearched did not fail: "answers" accounts for them.
    failed = [p for p in data.points if p.status not in ("ok", "dominated", "predicted") or p.failure is not None]
    if not failed:
        return []
    rows = []
    for p in failed:
        message = p.failure.message if p.failure else f"binding constraint {p.bound_by(DASH)}"
        if len(message) > 240:
            message = message[:237] + "..."
        rows.append((f"`{p.id}`", p.failure.kind if p.failure else p.status, message, suggest(p.failure, p.status)))
    out = ["## Failures", ""] + table(["point", "kind", "what happened", "suggestion"], rows)
    others = {pid: why for pid, why in data.others.items() if pid not in {p.id for p in failed}}
    if others:
        out += ["Why the other points lost:", ""] + [f"- `{pid}`: {why}" for pid, why in others.items()] + [""]
    return out


def _measured_vs_estimated(data: ReportData) -> list[str]:
    rows = []
    for p in data.points:
        cap = p.capacity
        if cap.kv_cache_tokens is None and p.kv_cache_tokens_predicted is None:
            continue
        ratio = None
        if p.max_passing and cap.max_concurrency_reported:
            ratio = p.max_passing / cap.max_concurrency_reported
        error = p.kv_cache_tokens_relative_error
        if error is None and cap.kv_cache_tokens and p.kv_cache_tokens_predicted is not None:
            error = (p.kv_cache_tokens_predicted - cap.kv_cache_tokens) / cap.kv_cache_tokens
        rows.append((
            f"`{p.id}`",
            num(cap.kv_cache_tokens),
            num(p.kv_cache_tokens_predicted),
            DASH if error is None else f"{error * 100:+.1f}%",
            DASH if cap.max_concurrency_reported is None else f"{cap.max_concurrency_reported:.2f}x at {num(cap.max_model_len)} tokens",
            num(p.max_passing),
            num(p.safe),
            DASH if ratio is None else f"{ratio:.2f}",
        ))
    if not rows:
        return []
    header = ["point", "KV tokens (vLLM)", "KV tokens (predicted)", "prediction error",
              "vLLM max concurrency", "max passing (measured)", "safe", "measured / vLLM"]
    return [
        "## Measured versus vLLM's start-up estimate",
        "",
        "vLLM's maximum concurrency assumes every request fills max-model-len tokens; the measured figures "
        "come from the replayed corpus and the SLOs, so they differ by the corpus's real request length and "
        "by whichever SLO binds first.",
        "",
    ] + table(header, rows)


def with_ci(x: float | None, ci: Sequence[float | None] | None, digits: int = 1) -> str:
    """`412 [380, 455]`; an open side shows as `?` (the sample was too small for a finite bound)."""
    if x is None or ci is None:
        return num(x, digits)
    lo, hi = ci
    return f"{num(x, digits)} [{'?' if lo is None else num(lo, digits)}, {'?' if hi is None else num(hi, digits)}]"


def _verdict_cell(s: StepResult) -> str:
    if s.slo_pass:
        verdict = "pass"
    elif s.slo_verdict == "inconclusive":
        # Not shown to hold with 95% confidence: counted as a failure.
        verdict = "inconclusive (counts as fail): " + ", ".join(s.slo_violations)
    elif s.slo_verdict == "unresolved":
        # Out of time before the bounds were finite: no information, never a failure.
        verdict = "unresolved (ran out of time; not a failure): " + ", ".join(s.slo_violations)
    elif s.slo_verdicts and binding_mod.undecided_rules(s):
        # A window closed on a conclusive failure: the rules still undecided did not fail.
        verdict = "fail: " + ", ".join(binding_mod.failed_rules(s)) + "; " + "; ".join(binding_mod.undecided_notes(s))
    else:
        failed = [k for k, v in s.slo_verdicts.items() if v == "fail"] if s.slo_verdicts else s.slo_violations
        verdict = "fail: " + ", ".join(failed)
    if s.slo_unverified:
        verdict += f" (unverified: {', '.join(s.slo_unverified)})"
    if s.disturbed:
        # Something else ran during the window: measured again, never used.
        verdict = f"disturbed (not used; {'; '.join(s.disturbed)}): {verdict}"
    return verdict


def _bounded_figures(s: StepResult, slo: dict[str, float]) -> str:
    """Each SLO-bound latency figure with its 95% interval: `tpot p99 31.2 [29.0, 33.1]`."""
    cells = []
    for key in slo:
        parts = key.split("_")
        if len(parts) != 3 or parts[2] != "ms":
            continue
        summary = getattr(s, f"{parts[0]}_ms", None)
        if summary is None:
            continue
        ci = (summary.ci95 or {}).get(parts[1])
        cell = f"{parts[0]} {parts[1]} {with_ci(getattr(summary, parts[1]), ci)}"
        test = s.slo_exceedance.get(key)
        if test is not None and ci is not None and ci[1] is None:
            # "pass" beside an interval open above: the exceedance count is what passed it.
            cell += f" (passed: {exceedance_text(test)})"
        pooled = s.slo_pooled.get(key)
        if pooled is not None:
            # Undecided alone, decided on the point's steps around this load.
            loads = ", ".join(num(x, 2) for x in pooled.loads)
            cell += f" ({pooled.verdict} on the steps at {loads}: {with_ci(pooled.figure, pooled.ci95)})"
        cells.append(cell)
    if s.slo_attainment is not None:
        cells.append(f"attainment {with_ci(s.slo_attainment * 100, [None if v is None else v * 100 for v in s.slo_attainment_ci95 or [None, None]])}%")
    return "; ".join(cells) or DASH


def step_rows(steps: Sequence[StepResult], slo: dict[str, float] | None = None) -> list[tuple[str, ...]]:
    rows = []
    for s in steps:
        rows.append((
            num(s.load.value, 2),
            num(s.requests_ok),
            num(s.requests_failed),
            with_ci(s.requests_per_s, s.requests_per_s_ci95, 2),
            with_ci(s.output_tokens_per_s, s.output_tokens_per_s_ci95),
            num(s.ttft_ms.p50),
            num(s.ttft_ms.p99),
            num(s.itl_ms.p50),
            num(s.itl_ms.p99),
            num(s.e2e_ms.p99),
            "unseen" if s.server.samples_saw_no_work else pct(s.server.kv_cache_usage_peak),
            pct(s.server.prefix_cache_hit_rate),
            num(s.server.preemptions),
            _bounded_figures(s, slo or {}),
            num(s.goodput_requests_per_s, 2),
            num(s.steady_state_dropped) if s.slo_verdict is not None else DASH,
            _verdict_cell(s),
        ))
    return rows


STEP_HEADER = ["load", "ok", "failed", "requests/s", "output tok/s", "TTFT p50 ms", "TTFT p99 ms",
               "ITL p50 ms", "ITL p99 ms", "E2E p99 ms", "KV peak", "prefix hits", "preemptions",
               "SLO-bound figures [95% CI]", "goodput req/s", "dropped (steady state)", "SLOs"]


def _steps_section(data: ReportData) -> list[str]:
    out = ["## Steps", ""]
    for p in data.points:
        if not p.steps:
            continue
        if data.kind == "sweep":
            out += [f"### `{p.id}`", ""]
        out += [f"Load: {LOAD_AXIS_LABELS[p.load_mode].lower()}.", ""] + table(STEP_HEADER, step_rows(p.steps, data.slo))
    return out if len(out) > 2 else []


def _sessions_section(data: ReportData) -> list[str]:
    """Session corpora: users against requests in flight, and TTFT by turn number."""
    shown = [p for p in data.points if any(s.sessions is not None for s in p.steps)]
    if not shown:
        return []
    out = [
        "## Sessions",
        "",
        "The corpus holds conversations: each load counts sessions (users), each turn resends the history "
        "after the user's think time. In flight: time-weighted over the window. TTFT p50 by turn number "
        "(count) shows what a growing context costs.",
        "",
    ]
    for p in shown:
        if data.kind == "sweep":
            out += [f"### `{p.id}`", ""]
        rows = []
        for s in p.steps:
            x = s.sessions
            if x is None:
                continue
            by_turn = "; ".join(f"{k}: {num(t.ttft_ms.p50)} ({t.count})" for k, t in x.by_turn.items())
            rows.append((
                num(s.load.value, 2),
                f"{num(x.sessions_in_flight_mean)} / {num(x.sessions_in_flight_peak, 0)}",
                f"{num(x.requests_in_flight_mean)} / {num(x.requests_in_flight_peak, 0)}",
                num(x.turns_completed, 0),
                num(x.sessions_completed, 0),
                num(x.resent_tokens, 0),
                by_turn or DASH,
            ))
        out += table(["load", "sessions in flight mean / peak", "requests in flight mean / peak", "turns done",
                      "sessions done", "tokens resent", "TTFT p50 ms by turn (count)"], rows)
    return out


def _bucketed(lat: ServerLatency | None, stat: str) -> str:
    """A histogram quantile with the bucket it fell in: its resolution."""
    value = getattr(lat, stat) if lat is not None else None
    if value is None:
        return DASH
    bucket = getattr(lat, f"{stat}_bucket_ms")
    if bucket is None:
        return num(value)
    lo, hi = bucket
    return f"{num(value)} ({lo:g}-{hi:g})" if hi is not None else f"{num(value)} (>{lo:g})"


def _mean(lat: ServerLatency | None) -> str:
    return num(lat.mean) if lat is not None else DASH


def server_rows(steps: Sequence[StepResult]) -> list[tuple[str, ...]]:
    rows = []
    for s in steps:
        v, c = s.server, s.client
        finished = DASH if v.requests_finished is None else f"{num(v.requests_finished)} / {num(c.requests_finished)}"
        diff = c.ttft_mean_minus_server_ms
        rows.append((
            num(s.load.value, 2),
            _mean(v.ttft_ms),
            _bucketed(v.ttft_ms, "p99"),
            DASH if diff is None else f"{diff:+.1f}" + (" (client side)" if c.client_or_network_latency else ""),
            _bucketed(v.itl_ms, "p50"),
            _mean(v.tpot_ms),
            _bucketed(v.queue_ms, "p99"),
            _mean(v.queue_ms),
            _mean(v.prefill_ms),
            _mean(v.decode_ms),
            finished,
            num(c.itl_bursts),
        ))
    return rows


SERVER_HEADER = ["load", "TTFT mean ms", "TTFT p99 ms (bucket)", "client - server TTFT ms", "ITL p50 ms (bucket)",
                 "TPOT mean ms", "queue p99 ms (bucket)", "queue mean ms", "prefill mean ms", "decode mean ms",
                 "finished server / client", "ITL bursts"]


def _server_section(data: ReportData) -> list[str]:
    """vLLM's own view of each step, beside the client's of the Steps section."""
    shown = [p for p in data.points if any(s.server.ttft_ms is not None for s in p.steps)]
    if not shown:
        return []
    out = [
        "## Server view (vLLM's histograms)",
        "",
        "What the engine measured for the requests of each step's window, from the difference of vLLM's "
        "histograms between the window's start and end. Quantiles are interpolated inside vLLM's buckets "
        "(PromQL's histogram_quantile); the bucket in brackets is their resolution. Means are exact. "
        "A request's time splits into queue + prefill + decode. ITL bursts: chunks that reached the client "
        "in one read, left out of the client's ITL.",
        "",
    ]
    for p in shown:
        if data.kind == "sweep":
            out += [f"### `{p.id}`", ""]
        out += table(SERVER_HEADER, server_rows(p.steps))
        for s in p.steps:
            where = f"{LOAD_AXIS_LABELS[p.load_mode].lower()} {num(s.load.value, 2)}"
            if s.client.client_or_network_latency:
                out.append(f"- At {where}: {s.client.latency_note}.")
            if s.server.counter_reset or (s.server.histograms_note and s.server.metrics_available):
                out.append(f"- At {where}: {s.server.histograms_note}.")
        if out[-1] != "":
            out.append("")
    return out


def _plots_section(plot_names: Sequence[str]) -> list[str]:
    if not plot_names:
        return []
    return ["## Plots", ""] + [f"![{name}]({name})" for name in plot_names] + [""]


def header(data: ReportData) -> list[str]:
    """The title, where the results came from, and whether the run was interrupted."""
    title = f"Capacity report: {data.model}" if data.model else "Capacity report"
    source = f"{data.kind} results `{data.source.name}`, started {data.started_at or DASH}"
    if data.kind == "sweep":
        ok = sum(p.status == "ok" for p in data.points)
        source += f"; {len(data.points)} points, {ok} measured"
    lines = [f"# {title}", "", source + ".", ""]
    if data.interrupted:
        lines += ["**Interrupted:** these results cover only what was measured before the run stopped.", ""]
    return lines


def sections(data: ReportData, plan: FleetPlan | None) -> list[tuple[str, list[str]]]:
    """The report's sections in order, each (key, markdown lines); report.html renders the same ones."""
    parts = [("recommendation", _recommendation(data)), ("slo", _slo_section(data))]
    if plan is not None:
        parts.append(("fleet", _fleet_section(plan, data)))
    parts.append(("cost", cost_section(data, plan)))
    if data.kind == "sweep":
        parts += [("points", _points_section(data)), ("gpu_models", _gpu_models_section(data)),
                  ("nodes", _nodes_section(data)), ("answers", list(data.answers)),
                  ("failures", _failures_section(data))]
    parts += [("measured_vs_estimated", _measured_vs_estimated(data)), ("steps", _steps_section(data)),
              ("sessions", _sessions_section(data)), ("server", _server_section(data)),
              ("environment", environment.section([(p.id, p.steps) for p in data.points], table))]
    return [(key, lines) for key, lines in parts if lines]


def render(data: ReportData, plan: FleetPlan | None, plot_names: Sequence[str]) -> str:
    lines = header(data)
    for _, section in sections(data, plan):
        lines += section
    lines += _plots_section(plot_names)
    return "\n".join(lines).rstrip() + "\n"
