"""Token counts of a corpus by the server's own tokenizer (vLLM's /tokenize)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

TOKENIZE_WORKERS = 16


async def token_counts(client, requests: Sequence, *, workers: int = TOKENIZE_WORKERS) -> list[int]:
    """Every request's prompt tokens, in corpus order.

    A fixed pool of workers pulls from one iterator, so memory stays flat for 100k-line corpora;
    the first error cancels the other workers and is raised as itself.
    """
    counts = [0] * len(requests)
    work = iter(range(len(requests)))

    async def worker() -> None:
        for i in work:
            counts[i] = await client.tokenize(requests[i])

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(min(workers, len(requests))):
                group.create_task(worker())
    except BaseExceptionGroup as errors:
        raise errors.exceptions[0] from None
    return counts
