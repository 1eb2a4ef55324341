"""The client's view checked against the server's, per step.

vLLM's histograms say what the engine did; the client's records say what a user saw. When the
client's time to first token is well above the engine's, the difference was added on the client's
side (its machine, its event loop, the network), and a capacity figure judged on it would blame
the engine for it. Chunks that reach the client in one read carry one timestamp: their gaps say
nothing about the engine's inter-token latency, so they are counted as bursts and left out of
the client's ITL rather than pulling its percentiles towards zero.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from replay.records import RequestRecord
from replay.results import ClientSummary, StepResult

# The client's mean TTFT may exceed the server's by this much before the step is flagged: the
# larger of an absolute margin (a loopback round trip and the client's parsing) and a fraction.
TTFT_EXCESS_MS = 10.0
TTFT_EXCESS_FRACTION = 0.10
CLOCK_RESOLUTION_S = time.get_clock_info("perf_counter").resolution


def itl_gaps_ms(records: Iterable[RequestRecord], resolution_s: float = CLOCK_RESOLUTION_S) -> tuple[np.ndarray, int, int]:
    """(chunk gaps in ms without the bursts, bursts, gaps left out).

    A burst is a run of chunks whose gaps are below the clock's resolution (they came in one
    read); each such gap is left out.
    """
    kept: list[np.ndarray] = []
    bursts = burst_gaps = 0
    for r in records:
        if not r.ok or len(r.token_times_s) < 2:
            continue
        gaps = np.diff(np.asarray(r.token_times_s))
        tiny = gaps < resolution_s
        burst_gaps += int(tiny.sum())
        # A burst starts at each tiny gap that does not follow another tiny gap.
        bursts += int(np.count_nonzero(tiny & ~np.concatenate(([False], tiny[:-1]))))
        kept.append(gaps[~tiny])
    if not kept:
        return np.empty(0), bursts, burst_gaps
    return np.concatenate(kept) * 1e3, bursts, burst_gaps


def cross_check(
    step: StepResult,
    client_requests_finished: int,
    *,
    excess_ms: float = TTFT_EXCESS_MS,
    excess_fraction: float = TTFT_EXCESS_FRACTION,
) -> ClientSummary:
    """The step's ClientSummary with the client-minus-server differences and the flag."""
    server = step.server
    update: dict[str, object] = {"requests_finished": client_requests_finished}
    if server.requests_finished is not None:
        update["requests_minus_server"] = client_requests_finished - server.requests_finished
    client_ttft, server_ttft = step.ttft_ms.mean, server.ttft_ms.mean if server.ttft_ms else None
    if client_ttft is not None and server_ttft is not None:
        diff = client_ttft - server_ttft
        update["ttft_mean_minus_server_ms"] = diff
        limit = max(excess_ms, excess_fraction * server_ttft)
        if diff > limit:
            update["client_or_network_latency"] = True
            update["latency_note"] = (
                f"the client's mean TTFT ({client_ttft:.1f} ms) is {diff:.1f} ms above the server's "
                f"({server_ttft:.1f} ms), more than {limit:.1f} ms: the client side (its machine, its "
                "event loop, the network, vLLM's HTTP front end), not the engine, added that latency"
            )
    client_tpot, server_tpot = step.tpot_ms.mean, server.tpot_ms.mean if server.tpot_ms else None
    if client_tpot is not None and server_tpot is not None:
        update["tpot_mean_minus_server_ms"] = client_tpot - server_tpot
    return step.client.model_copy(update=update)
