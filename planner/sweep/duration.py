"""How long each point of a sweep will take, as `planner sweep --dry-run` can know it.

Two sources, said with every figure: the same point's measured duration in a previous run in
the output folder (exact for the same machine and settings), or, given the request duration a
user expects (`--request-duration-s`: a request of the corpus at full load on the target GPU),
the search's steps (replay.search.eta: about UNBRACKETED_STEPS steps plus the confirmation, each a
warm-up, a window of min_requests, a drain) at the concurrency the estimate's KV pool holds of
the corpus's mean request, its tokens counted roughly as 4 characters each (the server's
tokenizer is not at hand before it starts). The knee is at or below that concurrency and steps
below it take longer, so the figure is a lower end. Without either source the duration is
unknown and said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.estimate import Estimate
from planner.progress import duration_text
from planner.sweep.grid import Point
from planner.sweep.results import SweepResults
from replay.search.eta import UNBRACKETED_STEPS, step_wall_s

# A rough tokenizer: English text runs about 4 characters a token.
CHARS_PER_TOKEN = 4


def earlier_durations(output_dir: Path) -> dict[str, float]:
    """Measured seconds of the points an earlier run in `output_dir` finished, by configuration."""
    path = Path(output_dir) / "sweep.json"
    if not path.is_file():
        return {}
    try:
        earlier = SweepResults.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError:
        return {}
    return {
        duration_key(p.config): p.duration_s
        for p in earlier.points
        if p.status == "ok" and p.duration_s is not None
    }


def mean_request_tokens(requests, default_max_tokens: int) -> float | None:
    """A corpus request's mean length in tokens, counted roughly (4 characters a token)."""
    lengths = []
    for r in requests:
        text = r.prompt if r.prompt is not None else "".join(str(m.get("content", "")) for m in r.messages or [])
        lengths.append(len(text) / CHARS_PER_TOKEN + (r.max_tokens or default_max_tokens))
    return sum(lengths) / len(lengths) if lengths else None


def duration_key(config: dict) -> str:
    return repr(sorted((k, repr(v)) for k, v in config.items()))


@dataclass(frozen=True)
class Expected:
    """A point's expected duration: the line the dry run prints, and the seconds behind it
    (None when unknown), with the search's step count, so that a plan of fewer steps (the
    adaptive strategy's two-step verification) can be costed from it."""

    text: str
    seconds: float | None = None
    steps: int | None = None


def expected_text(point: Point, **kwargs) -> str:
    return expected(point, **kwargs).text


def expected(
    point: Point,
    *,
    earlier: dict[str, float],
    request_duration_s: float | None,
    prediction: object,
    mean_request_tokens: float | None,
    min_requests: int,
    confirm: bool,
) -> Expected:
    steps = UNBRACKETED_STEPS + (1 if confirm else 0)
    measured = earlier.get(duration_key(point.config))
    if measured is not None:
        return Expected(
            f"expected {duration_text(measured)} (this point's duration in the previous run in the output folder)",
            measured,
            steps,
        )
    if request_duration_s is None:
        return Expected("expected duration unknown (give --request-duration-s, or run once into this output folder)")
    if not isinstance(prediction, Estimate) or not prediction.kv_cache_tokens or not mean_request_tokens:
        return Expected("expected duration unknown (the estimate predicts no KV pool for this point)")
    if prediction.verdict.status == "does_not_fit":
        return Expected("expected to end at start-up: the estimate predicts it does not fit", 0.0, 0)
    concurrency = max(1, int(prediction.kv_cache_tokens / mean_request_tokens))
    if prediction.settings.max_num_seqs:
        concurrency = min(concurrency, prediction.settings.max_num_seqs)
    seconds = steps * step_wall_s(concurrency, request_duration_s, min_requests)
    return Expected(
        f"expected ~{duration_text(seconds)} of search ({steps} steps of {min_requests} requests at about"
        f" {concurrency} in flight, {request_duration_s:g} s a request; start-up not included)",
        seconds,
        steps,
    )


# An adaptive sweep's point that is predicted and could win is verified in this many steps.
VERIFY_STEPS = 2


def total_lines(
    expected_by_point: dict[str, Expected], class_of_point: dict[str, str], first_by_class: dict[str, str], strategy: str
) -> list[str]:
    """The sweep's expected total. Exhaustive: every point's search. Adaptive: between one full
    search per speed class with every other point verified in VERIFY_STEPS steps (none skipped),
    and the exhaustive total (every verification falling back to a full search); points it skips
    (dominated, predicted) cost less still, so its lower end is not a floor."""
    unknown = sorted(pid for pid, e in expected_by_point.items() if e.seconds is None)
    known = {pid: e for pid, e in expected_by_point.items() if e.seconds is not None}
    if not known:
        return ["expected total: unknown (no point's duration is known; give --request-duration-s)"]
    missing = f"; {len(unknown)} point{'s' if len(unknown) != 1 else ''} of unknown duration left out" if unknown else ""
    exhaustive = sum(e.seconds for e in known.values())
    if strategy != "adaptive":
        return [f"expected total: ~{duration_text(exhaustive)} of search, every point searched in full{missing}"]
    low = 0.0
    for pid, e in known.items():
        if first_by_class.get(class_of_point[pid]) == pid or not e.steps:
            low += e.seconds
        else:
            low += e.seconds * VERIFY_STEPS / e.steps
    return [
        f"expected total: adaptive ~{duration_text(low)} of search when each class's law holds (one full search per"
        f" class, every other point verified in {VERIFY_STEPS} steps; fewer where points are skipped), up to"
        f" ~{duration_text(exhaustive)} if every verification falls back to a full search (exhaustive:"
        f" ~{duration_text(exhaustive)}){missing}"
    ]
