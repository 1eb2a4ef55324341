"""Token counts of a corpus by the server's own tokenizer (vLLM's /tokenize)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from replay.corpus.jsonl import request_text
from replay.prefix.sharing import block_hashes, estimate_token_ids

TOKENIZE_WORKERS = 16


async def token_counts(client, requests: Sequence, *, workers: int = TOKENIZE_WORKERS) -> list[int]:
    """Every request's prompt tokens, in corpus order."""
    return await _each(client.tokenize, requests, workers)


async def prompt_blocks(
    client, requests: Sequence, block_size: int, *, workers: int = TOKENIZE_WORKERS
) -> list[tuple[int, list[int]]]:
    """Every request's (prompt tokens, chained full-block hashes) by the server's tokenizer, in
    corpus order; the token ids themselves are not kept."""

    async def one(request) -> tuple[int, list[int]]:
        ids = await client.token_ids(request)
        return len(ids), block_hashes(ids, block_size)

    return await _each(one, requests, workers)


async def _each(call, requests: Sequence, workers: int) -> list:
    """call(request) for every request, results in corpus order.

    A fixed pool of workers pulls from one iterator, so memory stays flat for 100k-line corpora;
    the first error cancels the other workers and is raised as itself.
    """
    counts: list = [None] * len(requests)
    work = iter(range(len(requests)))

    async def worker() -> None:
        for i in work:
            counts[i] = await call(requests[i])

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(workers, len(requests))):
                group.create_task(worker())
    except BaseExceptionGroup as errors:
        raise errors.exceptions[0] from None
    return counts


def estimated_prompt_blocks(requests: Sequence, block_size: int) -> list[tuple[int, list[int]]]:
    """Every request's (prompt tokens, chained full-block hashes) by the offline estimate
    (replay.corpus.lengths), in corpus order: what a corpus looks like without a server."""
    out = []
    for r in requests:
        ids = estimate_token_ids(request_text(r))
        out.append((len(ids), block_hashes(ids, block_size)))
    return out
