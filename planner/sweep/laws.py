"""A speed class's latency law, from one full search, and what it predicts for the class's other
points.

The law is read from the searched point's steps as the search itself reads them (replay.search.policy):
each SLO rule's measured / bound against requests running, fitted by isotonic regression, and
the crossing of 1. Its interval is what that search measured: the knee lies in
[max_passing, min_failing), so under the class's assumption (planner.sweep.classes) any point of
the class passes up to max_passing and fails from min_failing on, unless something of its own
caps it lower. A point's prediction is then

    min(latency knee, the point's KV knee, max_num_seqs + max_waiting, [replay] max_concurrency)

with the interval carried through the same min. max_num_seqs caps it only under a `max_waiting`
rule (`waiting_allowed`); without one, a point whose max_num_seqs is below where the law passes
queues requests the law never measured, and planner.sweep.adaptive searches it in full. Pure functions; planner.sweep.adaptive acts on them.

A point's KV ceiling C is the pool over the corpus's blocks: the load at which its requests would
fill every block. The KV rules (kv_cache_usage_max, max_preemptions) break below it, as requests'
lengths vary around the mean. Where the searched point's lowest failure was its pool's, the law
keeps where that happened as a share of its ceiling (`kv_knee_fraction`, with that ceiling C0 as
`kv_knee_ceiling`), and a point's KV knee comes from two readings of it:

- **the same share**: n = share x C. It holds if the headroom a pool needs grows in proportion to it;
- **the same overflow chance**: n requests in flight hold n x mean blocks, give or take
  sqrt(n) x their spread (independent lengths), so a pool fills to the rules where
  n + k x sqrt(n) = C, with k = (C0 - n0) / sqrt(n0) from the law's point (n0 = share x C0).
  A smaller pool then fills at a lower share of its ceiling, a larger one at a higher.

The prediction is the second (rounded down, from the law's max passing); its interval reaches up
to the first, or the second from the law's lowest failure - 1, whichever is higher. (A pool
larger than the law's is not predicted: the law measured nothing above its pass.) On vLLM's CPU build: the
32M pool (C0 59) stopped at 47 in one run and 51 in another; the 16M pool (29) at 23 both times,
the 8M pool (14) at 10 and 9. From 51, the second reading says 23 and 10 (the share 25 and 12);
from 47, 20 and 8 (the share 23 and 11).
"""

from __future__ import annotations

import math
import re

from planner.sweep.results import ClassLaw, KneePrediction, PointResult
from replay.search.policy import bracket, isotonic, rule_crossing
from replay.search.verdicts import concurrency_history


# The rules a step's speed sets (replay.slo.rules' latency keys, the client's and the server's own);
# server_queue_* is time spent waiting for a slot, which memory sets.
_LATENCY_RULE = re.compile(r"^(server_)?(ttft|itl|tpot|e2e)_(mean|p50|p90|p95|p99|max)_ms$")


MEMORY_RULES = ("kv_cache_usage_max", "max_preemptions")


def fit_law(
    result: PointResult, slo: dict[str, float], speed_class: str, *, max_num_seqs: int | None,
    max_concurrency: int | None = None,
) -> ClassLaw:
    """The law of `speed_class` from a searched point's steps. Its passes hold for the class; its
    lowest failure only when it is the class's: a latency rule broke, with every request running
    (at or below the point's `max_num_seqs`, when the SLOs see queueing). A failure on errors,
    preemptions, the KV pool's use or waiting requests is this point's memory speaking, and one
    above max_num_seqs may be queueing: the law then says nothing above its highest pass."""
    probes = [p for p in concurrency_history(result.steps, slo) if p.informative]
    b = bracket(probes)
    min_failing = b.min_failing
    kv_fraction = None
    if min_failing is not None:
        broke = _violations_at(result, min_failing)
        queued = max_num_seqs is not None and queueing_seen(slo) and min_failing > max_num_seqs
        ceiling = result.search_upper_bound
        pool_set_it = ceiling is not None and (max_concurrency is None or ceiling < max_concurrency)
        if not queued and pool_set_it and b.max_passing is not None and any(r in MEMORY_RULES for r in broke):
            kv_fraction = [round(b.max_passing / ceiling, 4), round((min_failing - 1) / ceiling, 4)]
        if queued or not broke or not all(_LATENCY_RULE.match(rule) for rule in broke):
            min_failing = None
    measured: dict[str, list[list[float]]] = {}
    fitted: dict[str, list[list[float]]] = {}
    crossings: dict[str, float | None] = {}
    # Only the rules a step's speed sets: the KV pool's use is the point's memory, not the class's.
    for rule in sorted({r for p in probes for r in p.ratios if _LATENCY_RULE.match(r)}):
        by_c: dict[int, list[float]] = {}
        for p in probes:
            ratio = p.ratios.get(rule)
            if ratio is not None and math.isfinite(ratio):
                by_c.setdefault(p.concurrency, []).append(ratio)
        xs = sorted(by_c)
        means = [sum(by_c[x]) / len(by_c[x]) for x in xs]
        fit = isotonic(means, [len(by_c[x]) for x in xs])
        measured[rule] = [[x, round(r, 4)] for x in xs for r in by_c[x]]
        fitted[rule] = [[x, round(f, 4)] for x, f in zip(xs, fit)]
        crossing = rule_crossing(probes, rule)
        crossings[rule] = None if crossing is None else round(crossing, 3)
    crossed = [x for x in crossings.values() if x is not None]
    knee = min(crossed) if crossed else None
    return ClassLaw(
        speed_class=speed_class,
        from_point=result.id,
        max_passing=b.max_passing,
        min_failing=min_failing,
        knee=knee,
        measured=measured,
        fitted=fitted,
        crossings=crossings,
        kv_knee_fraction=kv_fraction,
        kv_knee_ceiling=result.search_upper_bound if kv_fraction is not None else None,
    )


def _violations_at(result: PointResult, concurrency: int) -> list[str]:
    """The rules the failing steps at `concurrency` broke."""
    broke: list[str] = []
    for step in result.steps:
        if step.load.mode == "concurrency" and int(step.load.value) == concurrency and not step.slo_pass:
            broke += [v for v in step.slo_violations if v not in broke]
    return broke


def predict(
    law: ClassLaw,
    *,
    kv_ceiling: int | None,
    max_num_seqs: int | None,
    max_concurrency: int | None,
) -> KneePrediction | None:
    """The point's max passing concurrency under the law, or None when the law cannot say: it
    measured no pass, or it measured no failure and the point's caps leave room above its pass
    (the law is unknown there)."""
    if law.max_passing is None:
        return None
    lo = law.max_passing
    hi = None if law.min_failing is None else law.min_failing - 1
    kv_name, kv_lo, kv_hi = "kv_pool", kv_ceiling, kv_ceiling
    if kv_ceiling is not None and law.kv_knee_fraction is not None:
        kv_name = "kv_knee"
        kv_lo, kv_hi = kv_knee(law.kv_knee_fraction, law.kv_knee_ceiling, kv_ceiling)
    # Each cap as [its value, the highest it can be].
    caps = {
        name: (low, high)
        for name, low, high in (
            (kv_name, kv_lo, kv_hi), ("max_num_seqs", max_num_seqs, max_num_seqs),
            ("max_concurrency", max_concurrency, max_concurrency),
        )
        if low is not None
    }
    cap_name, (cap, _) = min(caps.items(), key=lambda kv: kv[1][0]) if caps else (None, (None, None))
    if hi is None and (cap is None or cap > lo):
        return None
    # The law says nothing above its pass when it measured no failure of its own.
    top = min([lo if hi is None else hi] + [high for _, high in caps.values()])
    if cap is not None and cap <= lo:
        # The point's own cap is below where the law still passes: the cap is its answer.
        return _prediction(law, cap, [cap, max(cap, top)], cap_name, kv_ceiling is not None)
    return _prediction(law, lo, [lo, top], "latency", kv_ceiling is not None)


def kv_knee(fraction: list[float], law_ceiling: int | None, ceiling: int) -> tuple[int, int]:
    """(predicted KV knee, the highest it can be) of a pool whose KV ceiling is `ceiling`, from the
    law's `kv_knee_fraction` [low, high] at its own ceiling `law_ceiling` (the module docstring):
    the prediction keeps the law point's chance of overflowing, and the interval reaches the same
    share of the ceiling. Without `law_ceiling` (older files) the share alone predicts."""
    f_lo, f_hi = fraction
    shares = [math.floor(f * ceiling) for f in (f_lo, f_hi)]
    if not law_ceiling:
        return shares[0], min(ceiling, shares[1])
    overflow = [_same_overflow(f, law_ceiling, ceiling) for f in (f_lo, f_hi)]
    return overflow[0], min(ceiling, max(shares + overflow))


def _same_overflow(share: float, law_ceiling: int, ceiling: int) -> int:
    """The largest n with n + k x sqrt(n) <= ceiling, k = (C0 - n0) / sqrt(n0), n0 = share x C0."""
    n0 = share * law_ceiling
    if n0 <= 0:
        return 0
    k = max(0.0, law_ceiling - n0) / math.sqrt(n0)
    root = (-k + math.sqrt(k * k + 4 * ceiling)) / 2
    return max(0, min(ceiling, math.floor(root * root + 1e-9)))


def _prediction(law: ClassLaw, concurrency: int, interval: list[int | None], limit: str | None, read: bool) -> KneePrediction:
    return KneePrediction(
        concurrency=concurrency,
        interval=interval,
        limit=limit or "latency",
        speed_class=law.speed_class,
        law_from=law.from_point,
        kv_pool_read=read,
    )


def waiting_allowed(slo: dict[str, float]) -> float | None:
    """How many requests may wait for a slot under the SLOs (`max_waiting`), None when they do not
    bound it. Only such a bound makes max_num_seqs a cap on what passes: max_num_seqs + that many
    in flight. A TTFT or end-to-end rule sees waiting but tolerates it up to its bound: on vLLM's
    CPU build, under the CPU demo's TTFT p90 of 8 s, the 32M pool at max_num_seqs 16 passed 44
    requests in flight, where the law from max_num_seqs 64 passed 47."""
    return slo.get("max_waiting")


def queueing_seen(slo: dict[str, float]) -> bool:
    """Whether the SLOs would see requests that wait for a slot (a TTFT or end-to-end rule): only
    then does max_num_seqs cap the concurrency that passes."""
    waits = ("ttft_", "e2e_", "server_ttft_", "server_e2e_", "server_queue_", "max_waiting")
    return any(key.startswith(waits) for key in slo)


def safe_per_gpu(concurrency: int | None, headroom: float, gpus: int) -> float | None:
    """The safe concurrency per GPU a max passing concurrency gives (planner.sweep.outcome's rule)."""
    if concurrency is None:
        return None
    return round(math.floor(concurrency * (1 - headroom)) / gpus, 3)
