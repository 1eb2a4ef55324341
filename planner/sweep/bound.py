"""The search's ceiling for a point: the KV pool divided by what a corpus request really holds.

vLLM's start-up figure assumes every request uses the whole max_model_len; real requests hold
their prompt plus what they generate, rounded up to whole blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def request_blocks(prompt_tokens: int, output_tokens: int, *, block_size: int, max_model_len: int | None) -> int:
    total = prompt_tokens + output_tokens
    if max_model_len is not None:
        # vLLM clamps prompt + max_tokens to max_model_len.
        total = min(total, max_model_len)
    return max(1, math.ceil(total / block_size))


def mean_blocks(
    lengths: Sequence[tuple[int, int]], *, block_size: int, max_model_len: int | None
) -> float:
    """Mean KV blocks per request over (prompt_tokens, output_tokens) pairs."""
    if not lengths:
        raise ValueError("no request lengths")
    blocks = [request_blocks(p, o, block_size=block_size, max_model_len=max_model_len) for p, o in lengths]
    return sum(blocks) / len(blocks)


def concurrency_upper_bound(
    *, kv_cache_tokens: int, block_size: int, mean_blocks_per_request: float, max_concurrency_reported: float | None
) -> int:
    corpus_bound = math.floor(kv_cache_tokens / block_size / mean_blocks_per_request)
    reported = math.floor(max_concurrency_reported) if max_concurrency_reported else 0
    return max(1, corpus_bound, reported)
