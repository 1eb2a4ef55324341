"""Intervals across steps (replay.stats.across_steps): where a step's own interval loses coverage over
repeated steps at one load, and the floored tau with a between-step margin that holds it."""

from __future__ import annotations

import math

import numpy as np

from replay.stats import intervals
from replay.stats.across_steps import Spread, batch_tau, checks, log_scatter, quantile_check, step_tau


def _ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    x = np.empty(n)
    x[0] = rng.normal()
    shocks = rng.normal(size=n) * math.sqrt(1 - phi**2)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + shocks[i]
    return x


def _covers(bounds: tuple[float | None, float | None] | list[float | None], value: float) -> bool:
    lo, hi = bounds
    return (lo is None or lo <= value) and (hi is None or value <= hi)


def test_short_strongly_correlated_windows_lose_coverage_and_a_pooled_tau_holds_it() -> None:
    # 300 steps of 200 requests whose latencies follow an AR(1) with phi 0.95 (tau 39): each step
    # reads its own tau far too low. The median's interval, judged against the known median.
    rng = np.random.default_rng(7)
    truth = math.exp(0.0)
    today = held = 0
    taus: list[float] = []
    steps = 300
    for _ in range(steps):
        series = np.exp(0.3 * _ar1(rng, 200, 0.95))
        today += _covers(intervals.quantile_interval(series, 0.5), truth)
        floor = float(np.mean(taus[-8:])) if taus else 1.0  # the point's earlier steps, pooled
        held += _covers(quantile_check(series, 0.5, 1e9, tau_floor=floor).ci95, truth)
        taus.append(quantile_check(series, 0.5, 1e9).own_tau)
    assert today / steps < 0.90
    assert held / steps >= 0.90


def test_a_factor_shared_by_a_steps_requests_is_invisible_inside_it_and_the_margin_holds() -> None:
    # Each step's requests share one lognormal factor (sd 0.2 on the log scale) drawn anew per
    # step; within a step they are independent. Coverage of the pooled p90 over 300 steps.
    rng = np.random.default_rng(1)
    steps, n, q = 300, 100, 0.9
    factors = np.exp(rng.normal(0.0, 0.2, steps))
    series = [np.exp(rng.normal(0.0, 0.3, n)) * factors[i] for i in range(steps)]
    pooled = float(np.quantile(np.concatenate(series), q))
    today = held = 0
    earlier: list[tuple[float, float, float | None, int | None]] = []
    for s in series:
        lo, hi = intervals.quantile_interval(s, q)
        today += _covers((lo, hi), pooled)
        # The point's earlier steps at this load: their scatter is the between-step spread.
        sd = log_scatter(earlier[-5:]) if len(earlier) >= 2 else 0.0
        held += _covers(quantile_check(s, q, 1e9, log_sd=sd).ci95, pooled)
        within = None if lo is None or hi is None else ((math.log(hi) - math.log(lo)) / (2 * intervals.Z_975)) ** 2
        earlier.append((32.0, math.log(float(np.quantile(s, q))), within, n))
    assert today / steps < 0.6
    assert held / steps >= 0.90


def test_batch_tau_sees_correlation_and_is_one_on_independent_or_short_series() -> None:
    rng = np.random.default_rng(3)
    assert batch_tau(rng.normal(size=20)) == 1.0  # two per batch: too few
    assert batch_tau(_ar1(rng, 400, 0.9)) > 5
    independent = [batch_tau(rng.normal(size=400)) for _ in range(200)]
    assert 0.8 < float(np.mean(independent)) < 1.4
    # Independent windows are rarely made dearer: batch means count only beyond chance.
    windows = [rng.normal(size=400) > 0 for _ in range(200)]
    geyer = float(np.mean([intervals.autocorrelation_time(w.astype(float)) for w in windows]))
    assert float(np.mean([step_tau(w) for w in windows])) < geyer + 0.05
    # The judged tau is never below the floor the point's steps give.
    assert step_tau(rng.normal(size=100), floor=6.0) >= 6.0


def test_the_margin_turns_a_narrow_pass_into_inconclusive_but_keeps_a_clear_one() -> None:
    rng = np.random.default_rng(5)
    sample = np.exp(rng.normal(0.0, 0.2, 400))
    p90 = float(np.quantile(sample, 0.9))
    # 8% above the estimate: a pass on the step alone; with a between-step sd of 0.1 (a 22%
    # margin at 95%) it is not shown.
    assert quantile_check(sample, 0.9, p90 * 1.08).sign == 1
    assert quantile_check(sample, 0.9, p90 * 1.08, log_sd=0.1).sign == 0
    assert quantile_check(sample, 0.9, p90 * 2.0, log_sd=0.1).sign == 1
    assert quantile_check(sample, 0.9, p90 / 2.0, log_sd=0.1).sign == -1
    wide = quantile_check(sample, 0.9, 1e9, log_sd=0.1).ci95
    narrow = quantile_check(sample, 0.9, 1e9).ci95
    assert wide[0] < narrow[0] and wide[1] > narrow[1]


def test_log_scatter_reads_spread_only_from_repeated_or_out_of_order_steps() -> None:
    # Every load once, rising: nothing scatters.
    assert log_scatter([(10, 0.0, None, None), (20, 0.1, None, None), (30, 0.3, None, None)]) == 0.0
    # A load measured twice, 0.4 apart on the log scale.
    assert log_scatter([(10, 0.0, None, None), (20, 0.1, None, None), (20, 0.5, None, None)]) > 0.2
    # The steps' own variance is taken off what scatters.
    assert log_scatter([(20, 0.1, 0.1, 100), (20, 0.5, 0.1, 100)]) == 0.0
    # A higher load that read lower: out of order, so it scatters too.
    assert log_scatter([(10, 0.5, None, None), (20, 0.1, None, None)]) > 0.2


def test_a_short_step_with_an_open_interval_weighs_what_its_requests_say() -> None:
    # The repeatability benchmark's search that answered 24: 400-request steps agree within their
    # own intervals (within variance 0.0006 on the log scale), and a 10-request step at 30 whose
    # p90 interval was open read low among 400-request steps reading 58-63 ms. It is given the
    # variance its ten requests imply (0.024: 40 times a 400-request step's).
    long = [(24, math.log(54.3), 0.0006, 400), (28, math.log(58.2), 0.0006, 400), (29, math.log(62.7), 0.0006, 400)]
    # 55 ms on ten requests is within their own noise: no spread. From 400 requests it is one.
    assert log_scatter([*long, (30, math.log(55.0), None, 10)]) == 0.0
    assert log_scatter([*long, (30, math.log(55.0), 0.0006, 400)]) > 0.05
    # 51.3 ms, 1.3 of its own sd below the fit, shows some spread, less than the same reading from a
    # 400-request step, and less than the steps weighed alike read.
    short = log_scatter([*long, (30, math.log(51.3), None, 10)])
    assert 0.0 < short < log_scatter([*long, (30, math.log(51.3), 0.0006, 400)])
    assert short < log_scatter([(x, y, None, None) for x, y, _, _ in [*long, (30, math.log(51.3), None, 10)]])
    # The same low reading from a 400-request step, beside another that read 64 ms, is a spread.
    assert log_scatter([*long, (30, math.log(51.3), 0.0006, 400), (30, math.log(64.0), 0.0006, 400)]) > 0.05
    # Steps of unequal length that agree within their own intervals: no spread.
    assert log_scatter([(20, 0.10, 0.004, 100), (20, 0.12, 0.001, 400)]) == 0.0


def test_a_near_exact_step_beside_a_noisy_one_still_shows_their_scatter() -> None:
    # The knee-fit fake with no per-request noise: a slow step read TPOT p90 300.25 ms to a few
    # microseconds (within variance 1e-8) beside a fast step at 21 ms (5e-4) at one load. With the
    # denominator dof x mean weight the pair read a spread of 0.02; DerSimonian and Laird's, summed
    # over the fit's levels, reads the log ratio they show (2.66, an sd of 1.9).
    assert log_scatter([(10, math.log(21.0), 5e-4, 100), (10, math.log(300.25), 1e-8, 100)]) > 1.5
    # A step exact to the last bit (within variance 1e-30): S1 - S2 / S1 taken as a subtraction
    # cancels to 0 there; the pairs' sum does not.
    assert log_scatter([(10, math.log(21.0), 5e-4, 100), (10, math.log(300.25), 1e-30, 100)]) > 1.5
    # Two steps of equal precision: both denominators agree, and so does the unweighted estimator.
    pair = [(10, 0.0, 0.01, 100), (10, 0.5, 0.01, 100)]
    assert math.isclose(log_scatter(pair) ** 2, 0.5**2 / 2 - 0.01, rel_tol=1e-9)


def test_the_between_step_variance_is_read_without_bias_where_step_lengths_mix() -> None:
    # Three loads, each measured by one 10-request and two 100-request steps, with a true
    # between-step sd of 0.1 on the log scale and a figure rising with load.
    rng = np.random.default_rng(7)
    estimates = []
    for _ in range(400):
        points = []
        for load in (40, 44, 48):
            for n in (10, 100, 100):
                within = 0.5 / n
                value = 0.02 * load + rng.normal(0, 0.1) + rng.normal(0, math.sqrt(within))
                points.append((load, value, within, n))
        estimates.append(log_scatter(points) ** 2)
    assert 0.0085 < float(np.mean(estimates)) < 0.0115


def test_a_close_slowly_drifting_step_well_under_the_bound_is_not_held_by_its_neighbours_quantile_tau() -> None:
    # The fake vLLM near its knee: 80 requests' TPOT within 70.9-71.2 ms, drifting slowly, against
    # 75 ms. The median's indicator flips with the drift (a tau of 10-17, as the neighbours that
    # straddled the bound read); whether a request met 75 ms never varies.
    drift = 71.0 + 0.15 * np.sin(np.linspace(0, math.pi, 80))
    own = quantile_check(drift, 0.5, 75.0)
    assert own.sign == 1 and own.bound_tau == 1.0 and own.own_tau > 5
    # Floored with the neighbours' quantile tau on both tests (before slo_tau_bound): undecided.
    assert quantile_check(drift, 0.5, 75.0, tau_floor=17.0).sign == 0
    # The count test floored with what the neighbours' count tests read: decided, while the
    # figure's interval keeps the long tau.
    pooled = quantile_check(drift, 0.5, 75.0, tau_floor=17.0, bound_tau_floor=6.0)
    assert pooled.sign == 1 and pooled.ci95 == quantile_check(drift, 0.5, 75.0, tau_floor=17.0).ci95
    # A neighbour whose requests straddled the bound, slowly, still floors it: there the count's
    # own series is what correlates.
    assert quantile_check(drift, 0.5, 75.0, tau_floor=17.0, bound_tau_floor=17.0).sign == 0


def test_spread_of_pools_each_kind_of_tau_apart_and_old_files_fall_back() -> None:
    from replay.stats.across_steps import spread_of
    from replay.results import LatencySummary, LoadSpec
    from tests.fakes.results import make_step

    def step(c: int, tau: float, bound_tau: float | None):
        return make_step(
            load=LoadSpec(mode="concurrency", value=c), requests_ok=100, slo_verdict="pass",
            slo_tau={"tpot_p50_ms": tau}, slo_tau_bound={} if bound_tau is None else {"tpot_p50_ms": bound_tau},
            tpot_ms=LatencySummary(p50=70.0, ci95={"p50": [69.0, 71.0]}),
        )  # fmt: skip

    spread = spread_of([step(41, 10.0, 1.0), step(44, 16.0, 15.0)], {"tpot_p50_ms": 75.0})
    assert spread.tau == {"tpot_p50_ms": 13.0} and spread.bound_tau == {"tpot_p50_ms": 8.0}
    old = spread_of([step(41, 10.0, None), step(44, 16.0, None)], {"tpot_p50_ms": 75.0})
    assert old.bound_tau == old.tau == {"tpot_p50_ms": 13.0}


def test_checks_judge_client_percentile_rules_only() -> None:
    rng = np.random.default_rng(2)
    samples = {"tpot": np.exp(rng.normal(3.0, 0.1, 200))}
    out = checks({"tpot_p90_ms": 40.0, "tpot_mean_ms": 40.0, "ttft_p90_ms": 100.0}, samples, Spread())
    assert list(out) == ["tpot_p90_ms"] and out["tpot_p90_ms"].sign == 1


def test_spread_of_pools_the_points_steps() -> None:
    from replay.stats.across_steps import spread_of
    from replay.results import LatencySummary, LoadSpec
    from tests.fakes.results import make_step

    def step(c: int, p90: float, tau: float, verdict: str = "pass"):
        return make_step(
            load=LoadSpec(mode="concurrency", value=c), requests_ok=100, slo_verdict=verdict, slo_tau={"tpot_p90_ms": tau},
            tpot_ms=LatencySummary(p90=p90, ci95={"p90": [p90 * 0.98, p90 * 1.02]}),
        )

    slo_ = {"tpot_p90_ms": 30.0, "error_rate": 0.0}
    # Every load once, rising: the taus pool, nothing scatters.
    first = spread_of([step(10, 10.0, 2.0), step(20, 20.0, 4.0)], slo_)
    assert first.tau == {"tpot_p90_ms": 3.0} and first.log_sd == {}
    # 48 read 19.5 and 30.0 ms on two steps (the run 2): a between-step spread appears.
    second = spread_of([step(40, 18.0, 2.0), step(48, 19.5, 2.0), step(48, 30.0, 2.0, "fail")], slo_)
    assert second.log_sd["tpot_p90_ms"] > 0.2
    # An unresolved step says nothing.
    assert spread_of([step(48, 19.5, 2.0), step(48, 30.0, 9.0, "unresolved")], slo_).tau == {"tpot_p90_ms": 2.0}


def test_the_margin_is_capped_so_one_wild_pair_does_not_stop_every_verdict() -> None:
    from replay.stats.across_steps import MAX_LOG_SD, spread_of
    from replay.results import LatencySummary, LoadSpec
    from tests.fakes.results import make_step

    steps = [
        make_step(load=LoadSpec(mode="concurrency", value=10), slo_verdict=v, tpot_ms=LatencySummary(p90=p90))
        for v, p90 in (("pass", 4.0), ("fail", 40.0))
    ]
    assert spread_of(steps, {"tpot_p90_ms": 20.0}).log_sd == {"tpot_p90_ms": MAX_LOG_SD}


def test_the_spread_and_the_pooled_tau_are_read_near_the_load_judged() -> None:
    from replay.stats.across_steps import spread_of
    from replay.results import LatencySummary, LoadSpec
    from tests.fakes.results import make_step

    def step(c: int, p90: float, tau: float):
        return make_step(
            load=LoadSpec(mode="concurrency", value=c), requests_ok=100, slo_verdict="pass", slo_tau={"tpot_p90_ms": tau},
            tpot_ms=LatencySummary(p90=p90, ci95={"p90": [p90 * 0.98, p90 * 1.02]}),
        )

    slo_ = {"tpot_p90_ms": 30.0}
    # The demo's 32M point: near saturation 56 read 26.7 and 29.1 ms, 53 read 32.8, their tau 10;
    # at 30 the steps agree and their requests correlate less.
    saturated = [step(56, 26.7, 10.0), step(56, 29.1, 10.0), step(53, 32.8, 10.0)]
    below = [step(30, 19.0, 2.0), step(33, 20.9, 2.0)]
    near_knee = spread_of(saturated + below, slo_, load=55)
    assert near_knee.log_sd["tpot_p90_ms"] > 0.05 and near_knee.tau == {"tpot_p90_ms": 10.0}
    judged_low = spread_of(saturated + below, slo_, load=31)
    assert judged_low.log_sd == {} and judged_low.tau == {"tpot_p90_ms": 2.0}
    # Without a load (a caller that judges no particular step): every step, as before.
    assert spread_of(saturated + below, slo_).tau == {"tpot_p90_ms": 6.8}


def _p90_step(c: float, p90: float, lo: float, hi: float, verdict: str = "inconclusive"):
    from replay.results import LatencySummary, LoadSpec
    from tests.fakes.results import make_step

    return make_step(
        load=LoadSpec(mode="concurrency", value=c), requests_ok=100, slo_verdict=verdict,
        slo_tau={"tpot_p90_ms": 9.0}, tpot_ms=LatencySummary(p90=p90, ci95={"p90": [lo, hi]}),
    )  # fmt: skip


def test_a_step_undecided_alone_passes_on_the_steps_from_its_load_up() -> None:
    from replay.stats.across_steps import pooled_check, spread_of

    # The real 48-cap search: p90 read 20-25 ms against 30 at 34-38, each step's own interval
    # reaching past 30 (tau 8-17 leaves 100 requests few independent ones).
    slo_ = {"tpot_p90_ms": 30.0}
    earlier = [_p90_step(38, 21.0, 15.0, 29.5), _p90_step(36, 22.5, 16.0, 31.5), _p90_step(40, 26.0, 19.0, 34.0)]
    current = _p90_step(34, 22.0, 16.0, 31.0)
    spread = spread_of(earlier, slo_, load=34)
    assert spread.pool_sd["tpot_p90_ms"] < 0.25  # 38 read below 36: the scatter is shown
    pooled = pooled_check(spread, "tpot_p90_ms", 30.0, current)
    assert pooled is not None and pooled.sign == 1
    assert pooled.loads == (34, 36, 38, 40) and pooled.ci95[1] <= 30.0
    # Nothing below 34 was measured: it cannot fail on the steps from below.
    assert pooled_check(spread, "tpot_p90_ms", 20.0, current) is None


def test_a_later_starts_undecided_step_is_not_passed_on_an_earlier_starts_steps() -> None:
    from replay.stats.across_steps import pooled_check, spread_of

    # The seventh CPU demo run: start 1 read TPOT p90 23-26 ms at 45-50 against 30; start 2, slower,
    # read 31.7 ms at 45, its own interval open above. Pooled with start 1's steps it passed.
    slo_ = {"tpot_p90_ms": 30.0}
    first = [_p90_step(c, p90, lo, hi) for c, p90, lo, hi in ((47, 25.8, 21.0, 31.0), (48, 23.0, 19.5, 27.0),
                                                              (50, 26.0, 22.0, 31.5), (45, 22.0, 18.0, 26.0))]  # fmt: skip
    for s in first:
        s.server_start = 1
    slower = _p90_step(45, 31.7, 23.6, 45.0)
    slower.server_start = 2
    mixed = pooled_check(spread_of(first, slo_, load=45), "tpot_p90_ms", 30.0, slower)
    assert mixed is not None and mixed.sign == 1  # start 1's speed would decide start 2's step
    # Judged on its own start's steps, of which it is the first, it stays undecided.
    assert spread_of(first, slo_, load=45, start=2).figures["tpot_p90_ms"] == ()
    assert pooled_check(spread_of(first, slo_, load=45, start=2), "tpot_p90_ms", 30.0, slower) is None
    # Its own start's steps still count: a second step of start 2 at 47 that read low is pooled.
    own = _p90_step(47, 24.0, 20.0, 29.0)
    own.server_start = 2
    spread = spread_of([*first, own], slo_, load=45, start=2)
    assert [f.load for f in spread.figures["tpot_p90_ms"]] == [47]
    # The scatter and the taus are read from every start's steps.
    assert spread.tau == spread_of([*first, own], slo_, load=45).tau


def test_without_shown_scatter_a_few_steps_do_not_decide() -> None:
    from replay.stats.across_steps import MAX_LOG_SD, pooled_check, spread_of

    # Every load once, in order: the scatter between steps is unknown and taken at its largest.
    slo_ = {"tpot_p90_ms": 30.0}
    spread = spread_of([_p90_step(36, 21.5, 15.5, 31.0)], slo_, load=34)
    assert spread.pool_sd["tpot_p90_ms"] == MAX_LOG_SD
    assert pooled_check(spread, "tpot_p90_ms", 30.0, _p90_step(34, 22.0, 16.0, 31.0)) is None


def test_a_step_above_the_bound_higher_up_keeps_a_pass_from_being_claimed() -> None:
    from replay.stats.across_steps import pooled_check, spread_of

    slo_ = {"tpot_p90_ms": 30.0}
    earlier = [_p90_step(38, 23.0, 16.5, 31.5), _p90_step(36, 21.5, 15.5, 31.0), _p90_step(40, 36.0, 29.0, 45.0)]
    spread = spread_of(earlier, slo_, load=34)
    assert pooled_check(spread, "tpot_p90_ms", 30.0, _p90_step(34, 22.0, 16.0, 31.0)) is None


def test_a_step_undecided_alone_fails_on_the_steps_from_below_up_to_its_load() -> None:
    from replay.stats.across_steps import pooled_check, spread_of

    slo_ = {"tpot_p90_ms": 30.0}
    earlier = [_p90_step(44, 36.0, 28.0, 46.0), _p90_step(46, 35.0, 27.0, 45.0), _p90_step(42, 37.0, 29.0, 47.0)]
    current = _p90_step(48, 38.0, 29.5, 49.0)
    pooled = pooled_check(spread_of(earlier, slo_, load=48), "tpot_p90_ms", 30.0, current)
    assert pooled is not None and pooled.sign == -1 and pooled.loads == (42, 44, 46, 48) and pooled.ci95[0] > 30.0


def _pooled_rate(rng: np.random.Generator, offset: float, trials: int = 400) -> tuple[float, float]:
    """Share of trials where the pooled check passed / failed a step at 31 whose true log p90 sits
    `offset` above the bound's at every load from 30 to 36 (flat, as near a full KV cache): each
    step reads the truth plus a factor shared by its requests (sd 0.1, invisible inside it) plus
    its own noise (sd 0.15, which its interval states)."""
    from replay.stats.across_steps import pooled_check, spread_of

    bound, own, shared = 30.0, 0.15, 0.1
    passes = fails = 0
    for _ in range(trials):
        steps = []
        for c in (30, 36, 32, 34, 31):
            y = math.log(bound) + offset + rng.normal(0, shared) + rng.normal(0, own)
            half = intervals.Z_975 * own
            steps.append(_p90_step(c, math.exp(y), math.exp(y - half), math.exp(y + half)))
        pooled = pooled_check(spread_of(steps[:-1], {"tpot_p90_ms": bound}, load=31), "tpot_p90_ms", bound, steps[-1])
        passes += pooled is not None and pooled.sign == 1
        fails += pooled is not None and pooled.sign == -1
    return passes / trials, fails / trials


def test_the_pooled_check_errs_no_more_often_than_one_steps_test_should() -> None:
    # The figure 5% above the bound: a pass is an error; it must stay near the 2.5% a one-sided
    # 95% test allows, though the steps share a factor their own intervals cannot see.
    passed, _ = _pooled_rate(np.random.default_rng(3), math.log(1.05))
    assert passed <= 0.05, passed
    # 5% below: a fail is the error.
    _, failed = _pooled_rate(np.random.default_rng(4), -math.log(1.05))
    assert failed <= 0.05, failed


def test_the_pooled_check_decides_what_one_step_cannot() -> None:
    # 25% below the bound: each step's own interval (half width 0.29 on the log scale) reaches past
    # it about one time in four; pooled, most steps are decided.
    passed, failed = _pooled_rate(np.random.default_rng(5), math.log(0.75))
    assert passed >= 0.6 and failed == 0, passed


def test_a_high_step_with_an_open_interval_is_pooled_not_left_out() -> None:
    from replay.results import LatencySummary, LoadSpec
    from replay.stats.across_steps import pooled_check, spread_of
    from tests.fakes.results import make_step

    # The demo's third run: 37 read 28.2 ms, 42 read 26.3 and 27.7, 47 read 27.8, and 44 read 37.7
    # on 124 requests, its interval open above. Left out, the others would pass 42; counted, they
    # do not.
    slo_ = {"tpot_p90_ms": 30.0}
    high = make_step(
        load=LoadSpec(mode="concurrency", value=44), requests_ok=124, slo_verdict="fail",
        tpot_ms=LatencySummary(p90=37.7, ci95={"p90": [35.3, None]}),
    )  # fmt: skip
    low = _p90_step(37, 28.2, 26.9, 30.2)
    earlier = [_p90_step(47, 27.8, 26.4, 38.7), low, _p90_step(42, 26.3, 25.7, 27.8), high]
    current = _p90_step(42, 27.7, 26.3, 35.9)
    assert pooled_check(spread_of(earlier, slo_, load=42), "tpot_p90_ms", 30.0, current) is None
    without = [_p90_step(47, 27.8, 26.4, 38.7), low, _p90_step(42, 26.3, 25.7, 27.8)]
    assert pooled_check(spread_of(without, slo_, load=42), "tpot_p90_ms", 30.0, current) is not None
