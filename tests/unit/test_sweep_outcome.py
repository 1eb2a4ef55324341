from planner.capacity import Failure
from planner.sweep.outcome import choose_best, conclude, metrics_lost, output_tokens_per_s_at, safe_concurrency
from planner.sweep.results import PointResult
from replay.prefix.bound import concurrency_upper_bound, mean_blocks, request_blocks
from replay.results import ClientSummary, LatencySummary, LoadSpec, ServerSummary, StepResult


def step(c: int, passed: bool, tps: float) -> StepResult:
    return StepResult(
        load=LoadSpec(mode="concurrency", value=c), started_at="t", warmup_requests=c, window_s=1.0,
        requests_ok=10, requests_failed=0, ttft_ms=LatencySummary(), itl_ms=LatencySummary(),
        tpot_ms=LatencySummary(), e2e_ms=LatencySummary(), requests_per_s=1.0, input_tokens_per_s=1.0,
        output_tokens_per_s=tps, tokens_source="usage", server=ServerSummary(), client=ClientSummary(),
        slo_pass=passed,
    )


def test_blocks_round_up_and_clamp_to_max_model_len():
    assert request_blocks(100, 28, block_size=128, max_model_len=None) == 1
    assert request_blocks(100, 29, block_size=128, max_model_len=None) == 2
    assert request_blocks(5000, 5000, block_size=16, max_model_len=4096) == 256
    assert mean_blocks([(100, 28), (200, 100)], block_size=128, max_model_len=None) == 2.0


def test_upper_bound_never_below_vllms_estimate():
    # 8192 tokens = 64 blocks of 128; 2 blocks per request -> 32
    assert concurrency_upper_bound(kv_cache_tokens=8192, block_size=128, mean_blocks_per_request=2.0,
                                   max_concurrency_reported=4.0) == 32
    assert concurrency_upper_bound(kv_cache_tokens=8192, block_size=128, mean_blocks_per_request=40.0,
                                   max_concurrency_reported=4.0) == 4


def test_safe_concurrency_and_interpolated_throughput():
    assert safe_concurrency(10, 0.1) == 9
    assert safe_concurrency(5, 0.2) == 4
    assert safe_concurrency(1, 0.1) == 0
    assert safe_concurrency(None, 0.1) is None
    steps = [step(4, True, 400.0), step(8, True, 600.0), step(16, False, 900.0)]
    assert output_tokens_per_s_at(steps, 8) == 600.0
    assert output_tokens_per_s_at(steps, 6) == 500.0
    assert output_tokens_per_s_at(steps, 2) == 200.0


def point(pid: str, per_gpu: float | None, tps: float | None, status="ok", gpus=1) -> PointResult:
    return PointResult(
        id=pid, config={}, command=[], status=status, fingerprint=pid, gpus=gpus,
        safe_concurrency=None if per_gpu is None else int(per_gpu * gpus),
        safe_concurrency_per_gpu=per_gpu, output_tokens_per_s_per_gpu=tps, binding_constraint="ttft_p99_ms",
        failure=None if status == "ok" else Failure(kind="kv_too_small", message="too small"),
    )


def test_best_is_highest_safe_per_gpu_then_throughput_and_others_say_why():
    points = [point("a", 8, 100), point("b", 8, 120), point("c", 6, 500, gpus=2), point("d", None, None, "infeasible")]
    best = choose_best(points)
    assert best.point_id == "b"
    assert best.others["a"].startswith("same safe concurrency per GPU, lower output tokens/s per GPU: 100.0 vs 120.0")
    assert best.others["c"].startswith("lower safe concurrency per GPU: 6 vs 8")
    assert best.others["d"] == "infeasible: kv_too_small (too small)"
    assert choose_best([point("d", None, None, "infeasible")]) is None


def test_a_tie_says_so():
    best = choose_best([point("a", 8, 100), point("b", 8, 100)])
    assert best.point_id == "a"
    assert best.others["b"].startswith("tied on safe concurrency")


def _concluded(steps: list[StepResult], lo: int | None, hi: int | None, *, upper: int = 64, gpus: int = 2,
               totals: dict[str, float] | None = None) -> PointResult:
    r = PointResult(id="p", config={}, command=[], status="running", fingerprint="f", steps=steps)
    conclude(r, lo, hi, upper=upper, limit="kv_capacity_bound", gpus=gpus, headroom=0.25,
             gpu_totals_mib=totals if totals is not None else {"0": 81920.0, "1": 81920.0})
    return r


def test_conclude_takes_each_gpus_peak_over_the_steps_and_its_headroom_from_the_total():
    a, b, c = step(4, True, 400.0), step(8, True, 700.0), step(16, False, 900.0)
    a.gpu_memory_peak_mib = {"0": 70000.0, "1": 71000.0}
    b.gpu_memory_peak_mib = {"0": 75000.5, "1": 69000.0}
    # A step with no sample (the sampler had nothing to read) changes nothing.
    c.gpu_memory_peak_mib = None
    r = _concluded([a, b, c], 8, 16)
    assert r.gpu_memory_peak_mib == {"0": 75000.5, "1": 71000.0}
    assert r.gpu_memory_headroom_mib == {"0": 81920.0 - 75000.5, "1": 81920.0 - 71000.0}


def test_conclude_leaves_headroom_out_for_a_gpu_of_unknown_total_and_memory_out_when_unsampled():
    a = step(4, True, 400.0)
    a.gpu_memory_peak_mib = {"0": 1000.0, "7": 2000.0}
    r = _concluded([a], 4, None, totals={"0": 4096.0})
    assert r.gpu_memory_peak_mib == {"0": 1000.0, "7": 2000.0}
    assert r.gpu_memory_headroom_mib == {"0": 3096.0}
    unsampled = _concluded([step(4, True, 400.0)], 4, None)
    assert unsampled.gpu_memory_peak_mib is None and unsampled.gpu_memory_headroom_mib is None


def test_conclude_sets_safe_concurrency_per_gpu_and_tokens_per_gpu():
    r = _concluded([step(4, True, 400.0), step(8, True, 800.0), step(16, False, 900.0)], 8, 16)
    assert r.status == "ok" and (r.max_passing_concurrency, r.min_failing_concurrency) == (8, 16)
    assert r.safe_concurrency == 6  # floor(8 x 0.75)
    assert r.gpus == 2 and r.safe_concurrency_per_gpu == 3.0
    # 6 lies between the passing steps at 4 (400 tok/s) and 8 (800): 600 tok/s, 300 per GPU.
    assert r.output_tokens_per_s_per_gpu == 300.0


def _step(c: int, *, metrics: bool, unverified: tuple[str, ...] = ()) -> StepResult:
    return step(c, True, 100.0).model_copy(
        update={
            "server": ServerSummary(metrics_available=metrics, metrics_note=None if metrics else "HTTP 404"),
            "slo_unverified": list(unverified),
        }
    )


def test_metrics_lost_mid_point_is_noted_and_names_the_slos_left_unchecked():
    assert metrics_lost([_step(4, metrics=True), _step(8, metrics=True)]) is None
    # A server that never had metrics lost nothing (the step says so itself).
    assert metrics_lost([_step(4, metrics=False), _step(8, metrics=False)]) is None
    note, unchecked = metrics_lost([_step(4, metrics=True), _step(8, metrics=False), _step(6, metrics=False)])
    assert note == (
        "metrics_lost: /metrics gave no vLLM metrics at 2 of 3 steps, from the step at concurrency 8 on (HTTP 404);"
        " their server-side figures are unknown"
    )
    assert unchecked == [], "no SLO needed them: the point's verdict stands"
    _, unchecked = metrics_lost([_step(4, metrics=True), _step(8, metrics=False, unverified=("max_preemptions",))])
    assert unchecked == ["max_preemptions"]


def test_the_knee_band_per_gpu_divides_each_edge_by_the_points_gpus():
    from planner.sweep.outcome import knee_band_per_gpu
    from planner.sweep.results import PointResult

    r = PointResult(id="p", config={}, command=[], fingerprint="f", status="ok", gpus=2, knee_band=[43, 52])
    assert knee_band_per_gpu(r) == (21.5, 26.0)
    r.knee_band = [None, 5]
    assert knee_band_per_gpu(r) == (None, 2.5)
    assert knee_band_per_gpu(PointResult(id="q", config={}, command=[], fingerprint="f", status="pending")) is None


def test_the_answer_is_read_at_the_knee_fit_not_at_one_lucky_step():
    # Run 2 of issue 35 in small: 48 passed once and failed once, 43 passed twice. The search's
    # own highest pass below its lowest failure is 48; every step together says 43.
    steps = [step(43, True, 1.0), step(48, True, 1.0), step(48, False, 1.0), step(50, False, 1.0), step(43, True, 1.0)]
    r = _concluded(steps, 48, 50, gpus=1)
    assert (r.max_passing_concurrency, r.knee_fit, r.answer_basis) == (48, 43, "knee_fit")
    assert r.safe_concurrency == 32  # floor(43 x 0.75), not floor(48 x 0.75) = 36
    assert r.contested_concurrency == [48]


def test_a_fit_that_finds_no_load_at_its_level_recommends_nothing():
    r = _concluded([step(8, True, 1.0), step(8, False, 1.0), step(16, False, 1.0)], 8, 16, gpus=1)
    assert r.max_passing_concurrency == 8 and r.knee_fit is None
    assert r.safe_concurrency is None and r.safe_concurrency_per_gpu is None
    assert choose_best([r]) is None


def test_a_point_without_closed_loop_steps_keeps_the_searchs_own_answer():
    from replay.search.verdicts import recommended_load

    assert recommended_load(12, None, fitted=False) == (12, "max_passing")
    assert recommended_load(12, 10, fitted=True) == (10, "knee_fit")
    assert recommended_load(12, None, fitted=True) == (None, "knee_fit")


def test_a_point_on_several_server_starts_answers_with_what_held_on_most_of_them():
    from replay.search.verdicts import recommended_load

    assert recommended_load(39, 39, fitted=True, start_knees={1: 51, 2: 39, 3: 50}) == (50, "start_majority")
    assert recommended_load(39, 39, fitted=True, start_knees={1: 51, 2: 39}) == (39, "start_majority")
    assert recommended_load(39, 39, fitted=True, start_knees=None) == (39, "knee_fit")

    def on(start, c, passed):
        s = step(c, passed, 100.0)
        s.slo_verdict, s.server_start = "pass" if passed else "fail", start
        return s

    r = PointResult(id="p", config={}, command=[], status="running", fingerprint="f")
    r.steps = [on(1, 12, False), on(1, 10, True), on(1, 11, False), on(1, 10, True),
               on(2, 10, False), on(2, 8, True), on(2, 9, False), on(2, 8, True), on(3, 10, True)]  # fmt: skip
    conclude(r, 8, 9, upper=16, limit=None, gpus=1, headroom=0.1, gpu_totals_mib={})
    assert r.start_knees == {1: 10, 2: 8, 3: 10}
    assert r.knee_fit == 8, "the pooled fit reads the slow start's failures at 9 and 10"
    assert r.answer_basis == "start_majority" and r.safe_concurrency == 9
    # One start: the pooled fit, as before.
    single = PointResult(id="p", config={}, command=[], status="running", fingerprint="f")
    single.steps = [s.model_copy(update={"server_start": None}) for s in r.steps[:4]]
    conclude(single, 10, 11, upper=16, limit=None, gpus=1, headroom=0.1, gpu_totals_mib={})
    assert single.start_knees is None and single.answer_basis == "knee_fit" and single.safe_concurrency == 9
