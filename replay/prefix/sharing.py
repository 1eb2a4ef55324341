"""A corpus's shared prefixes as vLLM's prefix cache sees them.

vLLM (V1, prefix caching on by default) splits a prompt's token ids into full blocks of
`block_size` and names each block by a hash chained on its parent block's hash
(vllm.v1.core.kv_cache_utils.hash_block_tokens): two blocks are the same cache entry only when
their tokens and every token before them are equal. A partial last block is never cached. A new
request reuses the longest run of leading blocks already cached, and never its whole prompt (the
last token is always computed), so at most (n - 1) // block_size blocks hit. vLLM counts
`vllm:prefix_cache_queries` as the request's prompt tokens and `vllm:prefix_cache_hits` as the
hit blocks' tokens; the hit rates here are the same ratio.

The hashes here are Python's hash of (parent, block tokens) tuples: not vLLM's values (sha256 of
its own pickled objects), but the same equal/unequal structure, which is all that sharing needs
(tests/unit/test_prefix_cache.py checks it against vLLM's own, recorded as a fixture).

Without a server's tokenizer, token ids come from the offline estimate (replay.corpus.lengths: one
token per started 4 bytes of UTF-8): each 4-byte piece of the text is one token id, so a shared
text prefix is a shared token prefix, cut at 4-byte boundaries, and a request has exactly
`estimate_tokens(text)` tokens.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from replay.corpus.lengths import BYTES_PER_TOKEN


def estimate_token_ids(text: str) -> list[int]:
    """The offline estimate's tokens: every started 4-byte piece of the UTF-8 text is one id."""
    data = text.encode("utf-8")
    return [int.from_bytes(data[i : i + BYTES_PER_TOKEN], "little") for i in range(0, len(data), BYTES_PER_TOKEN)]


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One hash per full block, each chained on its parent's, as vLLM's prefix cache names blocks."""
    if block_size < 1:
        raise ValueError(f"block_size {block_size}: must be a positive integer")
    parent = 0
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        out.append(parent)
    return out


def cacheable_blocks(prompt_tokens: int, block_size: int) -> int:
    """Blocks of a prompt that can hit: vLLM always computes the last prompt token."""
    return max(0, prompt_tokens - 1) // block_size


@dataclass
class Sharing:
    """A corpus's prompt blocks and the hit rates of caches replaying it in order."""

    block_size: int
    requests: int
    prompt_tokens: int
    # Full prompt blocks over all requests, and how many distinct ones (by chained hash).
    total_blocks: int
    unique_blocks: int
    # Distinct blocks that two or more requests hold (the prefixes worth caching).
    shared_blocks: int
    # Hit tokens / prompt tokens (vLLM's prefix_cache_hits / prefix_cache_queries).
    hit_rate_unbounded: float
    # The same for an LRU cache of kv_blocks blocks (None without a pool size).
    kv_blocks: int | None = None
    hit_rate_lru: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def simulate_hits(prompts: Iterable[tuple[int, Sequence[int]]], block_size: int, capacity: int | None) -> tuple[int, int]:
    """(hit tokens, queried tokens) of a cache replaying the prompts one after another.

    `prompts` holds (prompt tokens, full-block hashes) in corpus order. Each request hits its
    longest run of cached leading blocks, then its full blocks are (re)inserted as the most
    recent; with `capacity`, the least recently used blocks are evicted beyond it. Requests run
    one at a time here: a pool that also holds running requests' blocks evicts sooner.
    """
    cache: OrderedDict[int, None] = OrderedDict()
    hits = queries = 0
    for n, hashes in prompts:
        queries += n
        hit = 0
        for h in hashes[: cacheable_blocks(n, block_size)]:
            if h not in cache:
                break
            hit += 1
        hits += hit * block_size
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        if capacity is not None:
            while len(cache) > capacity:
                cache.popitem(last=False)
    return hits, queries


def sharing(prompts: Sequence[tuple[int, Sequence[int]]], block_size: int, kv_blocks: int | None = None) -> Sharing:
    """The sharing figures of (prompt tokens, block hashes) pairs in corpus order."""
    holders = Counter(h for _, hashes in prompts for h in set(hashes))
    total = sum(len(hashes) for _, hashes in prompts)

    def rate(capacity: int | None) -> float:
        hits, queries = simulate_hits(prompts, block_size, capacity)
        return round(hits / queries, 4) if queries else 0.0

    return Sharing(
        block_size=block_size,
        requests=len(prompts),
        prompt_tokens=sum(n for n, _ in prompts),
        total_blocks=total,
        unique_blocks=len(holders),
        shared_blocks=sum(1 for c in holders.values() if c > 1),
        hit_rate_unbounded=rate(None),
        kv_blocks=kv_blocks,
        hit_rate_lru=None if kv_blocks is None else rate(kv_blocks),
    )


def expected_shared_blocks(holder_fractions: Sequence[float], n: int) -> float:
    """Distinct shared blocks that n requests drawn at random from the corpus hold together:
    a block that a fraction f of the requests holds is among them with probability 1 - (1 - f)^n."""
    return sum(1.0 - (1.0 - f) ** n for f in holder_fractions)
