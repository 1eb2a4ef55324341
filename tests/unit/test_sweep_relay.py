"""A remote point's events, recorded on its node and replayed on the driver's observers."""

from __future__ import annotations

import io
import pickle

from rich.console import Console

from planner.exporter import PlannerMetrics
from planner.progress import StepProgress
from planner.sweep.relay import ObserverCall, RelayObserver, ResultSnapshot, dispatch
from planner.sweep.results import PointResult
from replay.results import LoadSpec
from tests.fakes.results import finished_step, record, value


def events_of_one_point(point_id: str, requests: int) -> list:
    relay = RelayObserver()
    relay.point_started(point_id, {"tensor_parallel_size": 1}, "tiny")
    relay.point_placed(point_id, "node-a", "H100")
    relay.step_started(LoadSpec(mode="concurrency", value=4))
    for _ in range(requests):
        relay.request_sent()
        relay.request_finished(record(), measured=True)
    relay.step_finished(finished_step(True))
    # Events cross process boundaries as pickles.
    return pickle.loads(pickle.dumps(relay.take()))


def test_interleaved_points_keep_their_own_labels_on_the_driver() -> None:
    metrics = PlannerMetrics()
    progress = StepProgress(10, console=Console(file=io.StringIO()))
    a, b = events_of_one_point("a", 3), events_of_one_point("b", 2)
    with progress:
        # Batches of two points arrive in turns, as they do from two nodes.
        for point_id, events in (("a", a[:4]), ("b", b[:5]), ("a", a[4:]), ("b", b[5:])):
            dispatch(point_id, events, [metrics, progress], on_result=lambda _: None)
    assert value(metrics, "planner_requests_total", point="a", status="ok") == 3
    assert value(metrics, "planner_requests_total", point="b", status="ok") == 2
    assert value(metrics, "planner_inflight_requests", point="a") == 0
    assert value(metrics, "planner_inflight_requests", point="b") == 0
    assert value(metrics, "planner_point_node_info", point="a", node="node-a", gpu_model="H100") == 1
    lines = [t.description for t in progress._progress.tasks]
    assert lines == ["a  concurrency 4", "b  concurrency 4"]
    assert [t.completed for t in progress._progress.tasks] == [10, 10]


def test_only_the_newest_result_snapshot_travels() -> None:
    relay = RelayObserver()
    result = PointResult(id="p", config={}, command=[], status="running", fingerprint="f")
    relay.result(result)
    relay.request_sent()
    result.status = "ok"
    relay.result(result)
    got: list[PointResult] = []
    events = relay.take()
    dispatch("p", events, [], on_result=got.append)
    assert [type(e) for e in events] == [ObserverCall, ResultSnapshot]
    # A snapshot is a copy: the node's result changing later does not change what was relayed.
    result.status = "failed"
    assert [g.status for g in got] == ["ok"]
    assert relay.take() == []


def test_every_sweep_observer_takes_the_calls_a_point_makes():
    # A point calls its observers with every argument of the SweepObserver protocol, on the
    # driver and on a node alike: an observer short of one breaks every remote point.
    import inspect

    from planner.sweep.observer import SweepObserver, SweepObservers

    progress = StepProgress(10, console=Console(file=io.StringIO()))
    for observer in (RelayObserver(), PlannerMetrics(), progress, SweepObservers()):
        for name in ("point_started", "point_placed", "point_finished", "use_point"):
            wanted = list(inspect.signature(getattr(SweepObserver, name)).parameters)[1:]
            got = inspect.signature(getattr(observer, name)).parameters
            assert wanted == list(got), (type(observer).__name__, name, list(got))
    relay = RelayObserver()
    relay.point_finished("p", 1.5, (2.0, 2.5))
    assert relay.take() == []
