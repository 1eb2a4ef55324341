"""No hang, no orphan: one sweep of the fake vLLM whose points each meet one fault mid-search (the
fake's FAKE_VLLM_FAULT), each ended within its bound and classified, the sweep going on to the
next point, and nothing of any server left in the process table."""

from __future__ import annotations

import pytest

import planner.sweep.liveness as liveness
import planner.sweep.oom as oom
from planner.cli import main
from planner.ports import port_is_free
from planner.sweep.results import SweepResults
from tests.fakes.fault_sweeps import fake_vllm_processes, wait_until_gone, write_fault_config

FAULTS = ["stop", "hang", "stall", "oom", "metrics_gone", "metrics_garbage", ""]


@pytest.mark.timeout(300)
def test_each_fault_ends_its_point_classified_within_its_bound_and_the_sweep_goes_on(tmp_path, monkeypatch):
    # Shorter than the defaults, so the test is quick; the bounds scale with them (liveness' docstring).
    monkeypatch.setattr(liveness, "PROBE_INTERVAL_S", 0.5)
    monkeypatch.setattr(liveness, "HEALTH_TIMEOUT_S", 1.0)
    monkeypatch.setattr(liveness, "HEALTH_FAILURES", 2)
    # The cgroup's OOM counter, as the fake's "oom" fault bumps it before it SIGKILLs itself.
    events = tmp_path / "memory.events"
    events.write_text("oom 0\noom_kill 0\n")
    monkeypatch.setattr(oom, "events_files", lambda: [events])
    request_timeout_s = 4
    cfg = write_fault_config(
        tmp_path,
        kv_bytes=["4M"],
        # The first step (concurrency 4: 4 warm-up requests and about 20 measured) ends before the
        # fault begins, in the second.
        env={"FAKE_VLLM_FAULT_AFTER_REQUESTS": "45", "FAKE_VLLM_OOM_EVENTS": str(events)},
        grid_env=f"[grid.env]\nFAKE_VLLM_FAULT = {FAULTS!r}".replace("'", '"'),
        request_timeout_s=request_timeout_s,
        slo="tpot_p50_ms = 37\nerror_rate = 0\nmax_preemptions = 0",
    )
    out = tmp_path / "out"
    assert main(["sweep", "--config", str(cfg), "--output", str(out)]) == 0
    results = SweepResults.model_validate_json((out / "sweep.json").read_text())
    by_fault = {p.config["env"]["FAKE_VLLM_FAULT"]: p for p in results.points}
    assert list(by_fault) == FAULTS

    expected = {
        "stop": "server_hung",
        "hang": "server_hung",
        "stall": "stream_stalled",
        "oom": "server_oom_killed",
        # max_preemptions needs the server's metrics: the verdict from then on went unchecked.
        "metrics_gone": "metrics_lost",
        "metrics_garbage": "metrics_lost",
    }
    for fault, kind in expected.items():
        p = by_fault[fault]
        assert (p.status, p.failure.kind) == ("failed", kind), f"{fault}: {p.status} {p.failure}"
        assert p.steps, f"{fault}: the step measured before the fault is kept"
        assert p.steps[0].slo_pass and p.max_passing_concurrency >= 4, fault
    # The bounds (liveness' docstring): one probe for a stopped process; HEALTH_FAILURES probes
    # for a silent /health; request_timeout_s (and a probe) for stalled streams; at once for a
    # death. Each point's whole life (start, the first step, the fault, the stop) stays well
    # inside its bound plus the time a healthy point takes.
    healthy = by_fault[""]
    assert healthy.status == "ok" and healthy.max_passing_concurrency == 5 and not healthy.notes
    slack = healthy.duration_s + 10
    assert by_fault["stop"].duration_s < slack
    assert by_fault["hang"].duration_s < slack + 2 * (0.5 + 1.0) + 3  # + stop_grace_s: it ignores SIGTERM
    assert by_fault["stall"].duration_s < slack + request_timeout_s * 3
    assert by_fault["oom"].duration_s < slack

    assert "has stopped processes: pid " in by_fault["stop"].failure.message
    assert "(state T)" in by_fault["stop"].failure.message
    assert by_fault["hang"].failure.message.startswith("/health failed 2 times in a row (no answer within 1 s;")
    assert "while /health answered: the engine is stuck" in by_fault["stall"].failure.message
    assert by_fault["oom"].failure.exit_code == -9
    assert "oom_kill count rose from 0 to 1" in by_fault["oom"].failure.message
    for fault in ("metrics_gone", "metrics_garbage"):
        p = by_fault[fault]
        assert p.notes and p.notes[0].startswith("metrics_lost: /metrics gave no vLLM metrics at ")
        assert p.failure.message.endswith("the SLOs max_preemptions need them and went unchecked")
        lost_from = next(i for i, s in enumerate(p.steps) if not s.server.metrics_available)
        assert lost_from >= 1 and all(not s.server.metrics_available for s in p.steps[lost_from:])

    # No orphan: every server's process group is gone, and its port is free again.
    assert wait_until_gone(lambda: fake_vllm_processes(cfg), 10) == []
    for p in results.points:
        port = int(p.command[p.command.index("--port") + 1])
        assert port_is_free("127.0.0.1", port), f"{p.id}: port {port} still taken"
