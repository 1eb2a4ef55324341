"""The order a run sends the corpus's requests in: the file's, or one in which every run of
consecutive requests holds the corpus's mix.

Why an order at all: every step of a run draws the requests after the last step's (the cursor
wraps, so a step does not repeat what the prefix cache still holds), and each start of a server
begins at the order's head. Near the KV pool's knee a step's verdict is set by the KV demand of
the slice it draws, so the order decides how much of a step's verdict is the slice's.

"balanced" (the default) balances what the KV pool holds. A closed loop of n keeps n requests in
flight; a request holds its prompt's tokens and a growing output for about as many decode steps
as it generates, so while it runs it holds (prompt + output / 2) tokens on average, for `output`
steps. What a slice of consecutive requests keeps in the pool, on average over its time, is
their sum of (prompt + output / 2) x output over their sum of output. The order makes that ratio
the corpus's in every slice: each request's excess u = (prompt + output / 2 - r) x output over
the corpus's ratio r is known, and the order takes, at each place, a request whose excess has the
sign that brings the running sum of excesses back towards 0 (from the positive or the
non-positive requests, each group in the bit-reversed order of its ranks by |u|, below). The
running sum then never strays by more than the largest single |u|, so any slice's excess is at
most twice that, whatever its length and wherever it starts. Prompt tokens are the server's
tokenizer's counts where the caller has them (a sweep counts them with vLLM's /tokenize), else
the UTF-8 bytes / 4 estimate; output tokens are max_tokens (the line's, else the run's). Without
an output length for every request it falls back to "mixed".

On the CPU demo's prod.jsonl, counted with the tiny model's tokenizer, the mean KV holding of 112
consecutive requests (about one demo step's warm-up and window) ranges, over every start, from
0.84 to 1.19 of the corpus's in the mixed order and from 0.92 to 1.07 in this one (56 requests:
0.76-1.36 and 0.79-1.14). The mixed order's requests 56-111, those in flight when the first
step of every server start opens its window, held 1.29 times the corpus's; in this order 1.00
(docs/concepts/repeatability.md).

"mixed" ranks the requests by their estimated tokens (prompt and output) and sends them in the
bit-reversed order of their ranks, the van der Corput sequence: the first two requests are the
shortest and the median, the first four add the quartiles, and so on. Any run of consecutive
requests then samples the distribution of that sum evenly; over prod.jsonl's 600 requests the
mean estimated tokens of 50 consecutive ones ranges over 14% of the corpus's mean in this order
and 61% in the file's. But a sum of prompt and output is not what the pool holds over time.

Each request is sent once before any is sent again, in every order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from replay.corpus.jsonl import request_text
from replay.corpus.lengths import estimate_tokens

RequestOrder = Literal["balanced", "mixed", "file"]


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


def balanced_order(prompt_tokens: Sequence[float], output_tokens: Sequence[float]) -> list[int]:
    """Indices such that every run of consecutive requests keeps the corpus's mean KV holding
    (see the module's docstring): a running sum of excesses held within the largest one."""
    held = [(p + o / 2) * o for p, o in zip(prompt_tokens, output_tokens, strict=True)]
    steps = sum(output_tokens)
    if not held or steps <= 0:
        return list(range(len(held)))
    ratio = sum(held) / steps
    excess = [h - ratio * o for h, o in zip(held, output_tokens)]
    positive = [i for i, u in enumerate(excess) if u > 0]
    other = [i for i, u in enumerate(excess) if u <= 0]
    # Each group spread over its own sizes, so a group's next request is never the biggest of a run.
    positive = [positive[k] for k in mixed_order([excess[i] for i in positive])]
    other = [other[k] for k in mixed_order([-excess[i] for i in other])]
    order: list[int] = []
    running, p, q = 0.0, 0, 0
    while p < len(positive) or q < len(other):
        if q < len(other) and (running > 0 or p == len(positive)):
            i, q = other[q], q + 1
        else:
            i, p = positive[p], p + 1
        order.append(i)
        running += excess[i]
    return order


def output_lengths(requests: Sequence, default_max_tokens: int | None) -> list[int] | None:
    """Each request's output tokens (its max_tokens, else the run's); None when some have neither."""
    lengths = [r.max_tokens or default_max_tokens for r in requests]
    return None if any(n is None for n in lengths) else [int(n) for n in lengths]


def send_order(
    requests: Sequence,
    order: RequestOrder,
    default_max_tokens: int | None,
    prompt_tokens: Sequence[int] | None = None,
) -> list:
    """The requests in the order a run sends them. `prompt_tokens`: the server tokenizer's counts,
    in the corpus's order, where the caller has them ("balanced" estimates them otherwise)."""
    if order == "file":
        return list(requests)
    if order == "balanced" and (outputs := output_lengths(requests, default_max_tokens)) is not None:
        if prompt_tokens is None or len(prompt_tokens) != len(requests):
            prompt_tokens = [estimate_tokens(request_text(r)) for r in requests]
        return [requests[i] for i in balanced_order(prompt_tokens, outputs)]
    return [requests[i] for i in mixed_order(request_weights(requests, default_max_tokens))]
