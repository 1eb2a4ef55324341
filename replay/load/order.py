"""The order a run sends the corpus's requests in: the file's, or one in which every run of
consecutive requests holds the corpus's mix of lengths.

Why a mixed order: every step of a run draws the requests after the last step's (the cursor wraps,
so a step does not repeat what the prefix cache still holds). In the file's order a step draws
whatever slice follows, and the slice moves with how many requests the earlier steps measured. A
closed loop opens with its whole load sent at once, so near the KV pool's knee the KV verdict was
set by the token demand of the 50-100 prompts a step happened to draw: on the CPU demo, two runs
whose early steps measured different request counts drew other slices from then on and answered
50 and 47 (docs/get-started/cpu-demo.md).

The mixed order ranks the requests by their estimated tokens (prompt and output) and sends them
in the bit-reversed order of their ranks, the van der Corput sequence: the first two requests are
the shortest and the median, the first four add the quartiles, and so on. Any run of consecutive
requests, wherever it starts, then samples the length distribution evenly, so each step's opening
burst carries nearly the same token demand at a given load. Over prompts/prod.jsonl's 600 requests
the mean estimated tokens of 50 consecutive ones ranges over 14% of the corpus's mean in this order
and 61% in the file's (every start, wrapping; tests/unit/test_request_order.py). Each request is
still sent once before any is sent again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from replay.corpus.jsonl import request_text
from replay.corpus.lengths import estimate_tokens

RequestOrder = Literal["mixed", "file"]


def bit_reversed(n: int) -> list[int]:
    """0..n-1 in the order of their bit-reversed binary digits (the van der Corput sequence over
    the next power of two, with the values of n and above left out)."""
    if n <= 1:
        return list(range(n))
    bits = (n - 1).bit_length()
    order = (int(format(i, f"0{bits}b")[::-1], 2) for i in range(1 << bits))
    return [i for i in order if i < n]


def mixed_order(weights: Sequence[float]) -> list[int]:
    """Indices into `weights` such that every run of consecutive ones holds the weights' spread.
    Equal weights keep their file order (ties by index), and all-equal weights the file's order."""
    if len(set(weights)) <= 1:
        return list(range(len(weights)))
    ranked = sorted(range(len(weights)), key=lambda i: (weights[i], i))
    return [ranked[r] for r in bit_reversed(len(ranked))]


def request_weights(requests: Sequence, default_max_tokens: int | None) -> list[int]:
    """Each request's estimated tokens: its prompt (UTF-8 bytes / 4; only the ranks are used) and
    its output (its max_tokens, else the run's)."""
    return [estimate_tokens(request_text(r)) + (r.max_tokens or default_max_tokens or 0) for r in requests]


def send_order(requests: Sequence, order: RequestOrder, default_max_tokens: int | None) -> list:
    """The requests in the order a run sends them."""
    if order == "file":
        return list(requests)
    return [requests[i] for i in mixed_order(request_weights(requests, default_max_tokens))]
