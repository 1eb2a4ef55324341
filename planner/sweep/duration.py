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


def expected_text(
    point: Point,
    *,
    earlier: dict[str, float],
    request_duration_s: float | None,
    prediction: object,
    mean_request_tokens: float | None,
    min_requests: int,
    confirm: bool,
) -> str:
    measured = earlier.get(duration_key(point.config))
    if measured is not None:
        return f"expected {duration_text(measured)} (this point's duration in the previous run in the output folder)"
    if request_duration_s is None:
        return "expected duration unknown (give --request-duration-s, or run once into this output folder)"
    if not isinstance(prediction, Estimate) or not prediction.kv_cache_tokens or not mean_request_tokens:
        return "expected duration unknown (the estimate predicts no KV pool for this point)"
    if prediction.verdict.status == "does_not_fit":
        return "expected to end at start-up: the estimate predicts it does not fit"
    concurrency = max(1, int(prediction.kv_cache_tokens / mean_request_tokens))
    if prediction.settings.max_num_seqs:
        concurrency = min(concurrency, prediction.settings.max_num_seqs)
    steps = UNBRACKETED_STEPS + (1 if confirm else 0)
    seconds = steps * step_wall_s(concurrency, request_duration_s, min_requests)
    return (
        f"expected ~{duration_text(seconds)} of search ({steps} steps of {min_requests} requests at about"
        f" {concurrency} in flight, {request_duration_s:g} s a request; start-up not included)"
    )
