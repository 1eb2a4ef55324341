"""The search's ceiling for a point: the KV pool divided by what a corpus request really holds.

vLLM's start-up figure assumes every request uses the whole max_model_len; real requests hold
their prompt plus what they generate, rounded up to whole blocks. With vLLM's prefix cache on
(the V1 default), requests in flight together that share a prefix hold its blocks once:
prefix_aware_bound counts them so (its docstring states the model); a point whose args carry
--no-enable-prefix-caching keeps the old bound.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from replay.prefix.sharing import expected_shared_blocks

# vLLM completions' default max_tokens, used to size requests that ask for none.
VLLM_DEFAULT_MAX_TOKENS = 16


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


def prefix_aware_bound(
    request_blocks: Sequence[int], hashes: Sequence[Sequence[int]], *, pool_blocks: float
) -> tuple[int, float, int]:
    """The largest n whose requests in flight fit the pool when shared blocks are held once.

    Model: a block that two or more corpus requests hold (a shared prefix) takes one slot for all
    the requests in flight that hold it; every other block (the request's own prompt blocks, its
    partial last block, what it generates) takes one slot per request. With n requests drawn at
    random from the corpus, that is expected_shared_blocks(n) + n x mean own blocks per request,
    which must fit `pool_blocks`. Returns (n, mean own blocks per request, distinct shared blocks).
    The n is at least 1 and never below the pool over the mean whole request (the old bound).
    """
    holders = Counter(h for hs in hashes for h in set(hs))
    shared = {h for h, c in holders.items() if c > 1}
    own = [max(0, blocks - sum(1 for h in hs if h in shared)) for blocks, hs in zip(request_blocks, hashes)]
    mean_own = sum(own) / len(own)
    fractions = [holders[h] / len(hashes) for h in shared]
    old = math.floor(pool_blocks / (sum(request_blocks) / len(request_blocks)))

    def fits(n: int) -> bool:
        return expected_shared_blocks(fractions, n) + n * mean_own <= pool_blocks

    # Requests in flight each hold at least one block of their own in practice; the pool is a
    # ceiling on n that keeps the search finite when a corpus is all shared.
    lo, hi = max(1, old), max(1, int(pool_blocks))
    if not fits(lo):
        return lo, mean_own, len(shared)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo, mean_own, len(shared)


@dataclass(frozen=True)
class KvBounds:
    """The sweep's two KV concurrency bounds for a pool of kv_blocks, as `prompts stats` shows them."""

    mean_blocks_per_request: float
    # Requests the pool holds when each holds all its own blocks.
    no_prefix_cache: int
    # Distinct blocks shared by two or more requests, and what each request holds beside them.
    shared_prefix_blocks: int
    mean_own_blocks_per_request: float
    # Requests the pool holds when those in flight hold their shared blocks once (never below
    # no_prefix_cache).
    prefix_cache: int

    def to_dict(self) -> dict:
        return asdict(self)


def kv_bounds(
    prompts: Sequence[tuple[int, Sequence[int]]], max_tokens: Sequence[int | None], *, block_size: int, kv_blocks: int
) -> KvBounds:
    """Both bounds for requests of (prompt tokens, block hashes) and max_tokens (None: vLLM's
    completions default), in corpus order."""
    blocks = [
        request_blocks(n, out or VLLM_DEFAULT_MAX_TOKENS, block_size=block_size, max_model_len=None)
        for (n, _), out in zip(prompts, max_tokens)
    ]
    mean = sum(blocks) / len(blocks)
    old = concurrency_upper_bound(
        kv_cache_tokens=kv_blocks * block_size, block_size=block_size, mean_blocks_per_request=mean, max_concurrency_reported=None
    )
    with_cache, own, shared = prefix_aware_bound(blocks, [h for _, h in prompts], pool_blocks=kv_blocks)
    return KvBounds(
        mean_blocks_per_request=round(mean, 3),
        no_prefix_cache=old,
        shared_prefix_blocks=shared,
        mean_own_blocks_per_request=round(own, 3),
        prefix_cache=max(old, with_cache),
    )
