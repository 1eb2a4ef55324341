"""Block hashing against vLLM's own, the LRU simulation, and the prefix-aware KV bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.corpus.lengths import estimate_tokens
from replay.prefix.bound import prefix_aware_bound
from replay.prefix.sharing import block_hashes, estimate_token_ids, sharing, simulate_hits

FIXTURE = Path(__file__).parents[1] / "fixtures" / "prefix_cache" / "vllm_block_hashes.json"


def _structure(hashes: dict[str, list]) -> list[tuple[str, int, str, int]]:
    """Every (sequence, block) pair that equals another one: the sharing, whatever the hash values."""
    flat = [(name, i, h) for name, hs in sorted(hashes.items()) for i, h in enumerate(hs)]
    return [(a, i, b, j) for a, i, h in flat for b, j, g in flat if (a, i) < (b, j) and h == g]


def test_chaining_shares_exactly_the_blocks_vllm_shares():
    recorded = json.loads(FIXTURE.read_text())
    ours = {name: block_hashes(tokens, recorded["block_size"]) for name, tokens in recorded["sequences"].items()}
    assert {k: len(v) for k, v in ours.items()} == {k: len(v) for k, v in recorded["hashes"].items()}
    assert _structure(ours) == _structure(recorded["hashes"])
    # The fixture holds both kinds: shared prefixes, and equal tokens under different parents.
    assert ("a", 0, "b", 0) in _structure(ours)
    assert ("a", 1, "c", 1) not in _structure(ours)


def test_estimate_token_ids_follow_the_estimate_rule():
    for text in ("", "abc", "abcd", "héllo wörld, a longer text"):
        assert len(estimate_token_ids(text)) == estimate_tokens(text)
    assert estimate_token_ids("abcdefgh")[0] == estimate_token_ids("abcdXYZ")[0]


def test_hits_are_leading_cached_blocks_and_never_the_last_token():
    a, b = block_hashes(list(range(12)), 4), block_hashes([0, 1, 2, 3, 9, 9, 9, 9], 4)
    # a: nothing cached; b: block 0 hits, block 1 differs; a again: 12 tokens, only 2 blocks may hit.
    hits, queries = simulate_hits([(12, a), (8, b), (12, a)], 4, None)
    assert (hits, queries) == (0 + 4 + 8, 32)


def test_lru_evicts_the_least_recently_used():
    x, y = block_hashes(list(range(8)), 4), block_hashes(list(range(100, 108)), 4)
    assert simulate_hits([(9, x), (9, y), (9, x)], 4, None)[0] == 8
    # Room for 2 blocks: y evicted x, so the third request misses.
    assert simulate_hits([(9, x), (9, y), (9, x)], 4, 2)[0] == 0
    assert simulate_hits([(9, x), (9, y), (9, x)], 4, 4)[0] == 8


def test_sharing_counts_blocks_and_rates():
    system = list(range(8))
    prompts = [(10, block_hashes(system + [50 + i, 60 + i], 4)) for i in range(4)]
    s = sharing(prompts, 4, kv_blocks=1)
    assert (s.total_blocks, s.unique_blocks, s.shared_blocks) == (8, 2, 2)
    assert s.hit_rate_unbounded == pytest.approx(3 * 8 / 40)
    # One block of room: the chain's second block evicts its first, so nothing leads with a hit.
    assert s.hit_rate_lru == 0.0


def test_prefix_aware_bound_counts_a_shared_prefix_once():
    # 10 requests: 6 shared prompt blocks, 2 of their own (a partial block and the output).
    system = list(range(6 * 4))
    hashes = [block_hashes(system + [1000 + i], 4) for i in range(10)]
    blocks = [8] * 10
    n, own, shared = prefix_aware_bound(blocks, hashes, pool_blocks=100)
    assert (own, shared) == (2, 6)
    # 6 + 47 x 2 = 100; the old bound is 100 // 8 = 12.
    assert n == 47


def test_prefix_aware_bound_without_sharing_is_the_old_bound():
    hashes = [block_hashes(list(range(i * 100, i * 100 + 16)), 4) for i in range(5)]
    n, own, shared = prefix_aware_bound([5] * 5, hashes, pool_blocks=52)
    assert (n, own, shared) == (10, 5, 0)
