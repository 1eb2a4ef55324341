"""The final tables printed on stdout."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from planner import cost
from planner.report.environment import disturbed_lines
from planner.sweep.fresh import summary as fresh_summary
from replay.results import ReplayResults, StepResult
from replay.search import binding as binding_mod
from replay.search import pass_fit


def stdout_console() -> Console:
    """Rich sizes output to the terminal, and to 80 columns when stdout is a file or a pipe,
    which would cut the tables' columns short there."""
    return Console() if sys.stdout.isatty() else Console(width=200, soft_wrap=True)


def fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def load_label(step: StepResult) -> str:
    v = step.load.value
    # A session corpus's rate counts session arrivals.
    rate = f"{v:g} sessions/s" if step.sessions is not None else f"{v:g} req/s"
    return {"concurrency": f"c={v:g}", "rate": rate, "trace": f"trace x{v:g}"}[step.load.mode]


def steps_table(steps: list[StepResult], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for name, justify in [
        ("load", "left"),
        ("ok", "right"),
        ("failed", "right"),
        ("req/s", "right"),
        ("out tok/s", "right"),
        ("TTFT p50", "right"),
        ("TTFT p99", "right"),
        ("ITL p99", "right"),
        ("E2E p99", "right"),
        ("KV peak", "right"),
        ("preempt", "right"),
        ("waiting", "right"),
        ("SLO", "left"),
    ]:
        table.add_column(name, justify=justify)
    for s in steps:
        kv = s.server.kv_cache_usage_peak
        table.add_row(
            load_label(s),
            str(s.requests_ok),
            str(s.requests_failed),
            fmt(s.requests_per_s, 2),
            fmt(s.output_tokens_per_s, 0),
            fmt(s.ttft_ms.p50) + " ms",
            fmt(s.ttft_ms.p99) + " ms",
            fmt(s.itl_ms.p99, 1) + " ms",
            fmt(s.e2e_ms.p99) + " ms",
            # A window whose samples caught no request running: its peaks are unknown, not 0.
            ("unseen" if s.server.samples_saw_no_work else "-") if kv is None else f"{kv:.0%}",
            fmt(s.server.preemptions),
            fmt(s.server.waiting_peak),
            ("DISTURBED (not used), " if s.disturbed else "")
            + ("pass" if s.slo_pass else f"{_VERDICT_WORDS.get(s.slo_verdict or 'fail', 'FAIL')}: " + binding_mod.violations_text(s)),
        )
    return table


_VERDICT_WORDS = {"fail": "FAIL", "inconclusive": "INCONCLUSIVE", "unresolved": "UNRESOLVED (out of time)"}


def unresolved_lines(unresolved: list[int], budget_exhausted: bool) -> list[str]:
    """What the search could not resolve in time, said plainly (never counted as failing)."""
    lines = []
    if unresolved:
        lines.append(
            "unresolved (the window ran out of time before the SLOs' bounds were finite; not failures): concurrency "
            + ", ".join(str(c) for c in unresolved)
            + " - give the search more time (--point-budget-s, --max-window-s) or SLOs a shorter window resolves"
        )
    if budget_exhausted:
        lines.append("the point's time budget (point_budget_s) ran out before the search was done")
    return lines


def replay_summary(results: ReplayResults) -> list[str]:
    lines = []
    if results.find_max:
        found = results.max_passing_concurrency
        if found is None and results.unresolved_concurrency:
            # Running out of time is not a failure: say so rather than "none".
            answer = "unresolved"
        else:
            answer = str(found) if found is not None else "none"
        lines.append(
            f"highest passing concurrency: {answer}"
            f"  (lowest failing: {results.min_failing_concurrency if results.min_failing_concurrency is not None else 'none'};"
            f" bound by: {binding_mod.describe(results.binding_constraint, results.binding_undecided)})"
        )
        if results.search_start is not None:
            lines.append(f"search started at {results.search_start} ({results.search_start_reason})")
        lines.extend(unresolved_lines(results.unresolved_concurrency, results.budget_exhausted))
        if results.knee_interval is not None:
            lo, hi = results.knee_interval
            lines.append(
                f"knee between {lo if lo is not None else 'none'} (conclusive pass) and {hi if hi is not None else 'none'}"
                f" (conclusive fail); {'confirmed' if results.confirmed else 'not confirmed'} on fresh prompts"
            )
        band = pass_fit.describe(pass_fit.fit(results.steps, results.knee_fit_level))
        if band is not None:
            lines.append(f"from every step: {band}")
        lines.extend(pass_fit.rare_event_margin(results.steps, results.slo, results.knee_fit, results.knee_fit_level))
    lines.extend(disturbed_lines(results.steps, results.disturbed_concurrency, results.interference_allowed))
    if results.concurrency_unit == "sessions":
        lines.append("concurrency counts sessions (users in flight), not requests")
        lines.extend(session_lines(results.steps))
    for s in results.steps:
        if s.client.client_limited:
            lines.append(f"warning: {load_label(s)}: {s.client.note}")
        if s.client.client_or_network_latency:
            lines.append(f"warning: {load_label(s)}: {s.client.latency_note}")
        if s.server.counter_reset:
            lines.append(f"warning: {load_label(s)}: {s.server.histograms_note}")
        if not s.server.metrics_available:
            lines.append(f"note: {load_label(s)}: no server metrics ({s.server.metrics_note})")
            break
    return lines


def sweep_table(results, gpu_hour_price: Sequence[str] = ()) -> Table:
    table = Table(title="sweep", title_justify="left")
    priced = cost.prices(gpu_hour_price, cost.saved_gpu_hour(results.settings.model_extra))
    for name in ["point", "status", "KV tokens", "reported conc.", "bound", "bound (cache)", "max passing", "safe", "safe/GPU",
                 "out tok/s/GPU", "binding constraint"] + (["$/h/replica", "$/1M out tok"] if priced else []):
        table.add_column(name, justify="left" if name in ("point", "status", "binding constraint") else "right")
    for p in results.points:
        price = priced.for_gpu(p.gpu_model) if priced and p.safe_concurrency else None
        c = cost.point_cost(price, p.gpus, p.output_tokens_per_s_per_gpu) if price else None
        money = [cost.money(c.per_replica_hour), cost.money(c.per_million_output_tokens)] if c else ["-", "-"]
        status = p.status if p.failure is None else f"{p.status} ({p.failure.kind})"
        table.add_row(
            p.id,
            status,
            fmt(p.capacity.kv_cache_tokens),
            fmt(p.capacity.max_concurrency_reported, 2),
            fmt(p.concurrency_upper_bound),
            fmt(p.concurrency_upper_bound_prefix_cache),
            fmt(p.max_passing_concurrency),
            fmt(p.safe_concurrency),
            fmt(p.safe_concurrency_per_gpu, 2),
            fmt(p.output_tokens_per_s_per_gpu, 0),
            binding_mod.describe(p.binding_constraint, p.binding_undecided),
            *(money if priced else []),
        )
    return table


def sweep_summary(results) -> list[str]:
    unresolved = [p for p in results.points if p.unresolved_concurrency or p.budget_exhausted]
    if results.best is None:
        lines = [
            "no configuration was shown to pass the SLOs in the time given"
            if unresolved
            else "no configuration passed the SLOs at any concurrency"
        ]
    else:
        b = results.best
        point = next(p for p in results.points if p.id == b.point_id)
        flags = " ".join(f"{k}={v}" for k, v in point.config.items())
        lines = [f"recommended: {b.point_id} ({flags}): {b.reason}"]
        lines += [f"  {pid}: {why}" for pid, why in b.others.items()]
    for p in unresolved:
        lines += [f"  {p.id}: {line}" for line in unresolved_lines(p.unresolved_concurrency, p.budget_exhausted)]
    for p in results.points:
        lines += [f"  {p.id}: {line}" for line in disturbed_lines(p.steps, p.disturbed_concurrency, p.interference_allowed)]
    for p in results.points:
        if (starts := pass_fit.describe_starts(p.steps, p.knee_fit_level)) is not None:
            lines.append(f"  {p.id}: {starts}")
    if results.fresh_server is not None:
        lines.append(fresh_summary(results.fresh_server))
    adaptive = getattr(results, "adaptive", None)
    if adaptive is not None:
        # [sweep] strategy = "adaptive" (planner.sweep.adaptive): how the points were answered.
        lines.append(
            f"adaptive: {adaptive.searched} searched, {adaptive.verified} verified, {adaptive.predicted} predicted,"
            f" {adaptive.dominated} dominated; {adaptive.fallbacks} verification(s) fell back to a full search"
        )
    if results.interrupted:
        lines.append("the sweep was interrupted; finished points are kept (rerun with --resume)")
    return lines


def session_lines(steps) -> list[str]:
    """A line per step of a session corpus: users against requests in flight, TTFT by turn."""
    lines = []
    for s in steps:
        x = s.sessions
        if x is None:
            continue
        by_turn = ", ".join(
            f"{k}: {t.ttft_ms.p50:.0f} ms (n={t.count})" for k, t in x.by_turn.items() if t.ttft_ms.p50 is not None
        )
        lines.append(
            f"{load_label(s)}: sessions in flight {_num(x.sessions_in_flight_mean)} (peak {x.sessions_in_flight_peak}),"
            f" requests in flight {_num(x.requests_in_flight_mean)} (peak {x.requests_in_flight_peak});"
            f" {x.turns_completed} turns, {x.sessions_completed} sessions completed; TTFT p50 by turn: {by_turn or '-'}"
        )
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
