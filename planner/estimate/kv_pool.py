"""How vLLM cuts the KV memory into blocks, and how many blocks a request takes.

Mirrors vllm/v1/core/kv_cache_utils.py (0.32):

- Layers of one attention kind share block tables. With one kind there is one group of all the
  layers; with several (sliding + full) vLLM makes groups of equal size: the smallest kind's
  layer count, or the largest one's when max < 1.5 x min, padding the last group of a kind.
  One block of the pool holds `group_size` layers' pages, so
  bytes_per_block = group_size x block_size x KV bytes per token per layer.
- num_blocks = available_bytes // bytes_per_block. Block 0 is a null block the pool never hands
  out, so the start-up check and the largest-model-length search plan against num_blocks - 1.
- A request of n tokens takes cdiv(n, block_size) blocks in each full-attention group, and
  cdiv(min(window - 1 + in_flight_tokens, n), block_size) + 1 in each sliding-window group,
  where in_flight_tokens = max_num_batched_tokens x concurrent batches (2 with async
  scheduling, which vLLM turns on by default on GPU).
- Reported capacity: max concurrency = num_blocks / blocks of one max_model_len request, and
  "KV cache size" tokens = int(max concurrency x max_model_len). Note this uses num_blocks,
  the null block included, exactly as the start-up line does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from planner.estimate.architecture import Architecture, AttentionKind
from replay.prefix.bound import prefix_aware_bound


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVGroup:
    kind: AttentionKind
    sliding_window: int | None


@dataclass(frozen=True)
class PoolLayout:
    block_size: int
    bytes_per_token_per_layer: int
    group_size: int
    groups: tuple[KVGroup, ...]
    padding_layers: int
    in_flight_tokens: int

    @property
    def page_bytes(self) -> int:
        return self.block_size * self.bytes_per_token_per_layer

    @property
    def bytes_per_block(self) -> int:
        return self.group_size * self.page_bytes

    def blocks_for_tokens(self, tokens: int) -> int:
        """Blocks one request of `tokens` tokens holds at most, over every group."""
        total = 0
        for group in self.groups:
            if group.kind == "full":
                total += cdiv(tokens, self.block_size)
            else:
                window_tokens = min(int(group.sliding_window or 0) - 1 + self.in_flight_tokens, tokens)
                total += cdiv(window_tokens, self.block_size) + 1
        return total


def pool_layout(
    arch: Architecture, *, tp: int, kv_cache_dtype: str, block_size: int, in_flight_tokens: int
) -> PoolLayout:
    counts = arch.layer_counts()
    smallest, largest = min(counts.values()), max(counts.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups: list[KVGroup] = []
    padding = 0
    for kind, n in counts.items():
        n_groups = cdiv(n, group_size)
        padding += n_groups * group_size - n
        window = arch.sliding_window if kind == "sliding" else None
        groups.extend(KVGroup(kind, window) for _ in range(n_groups))
    return PoolLayout(
        block_size=block_size,
        bytes_per_token_per_layer=arch.kv_bytes_per_token_per_layer(tp, kv_cache_dtype),
        group_size=group_size,
        groups=tuple(groups),
        padding_layers=padding,
        in_flight_tokens=in_flight_tokens,
    )


@dataclass(frozen=True)
class Pool:
    bytes: int
    num_blocks: int
    # num_blocks - 1: the null block is never handed out.
    usable_blocks: int
    block_size: int
    blocks_per_request: int
    max_concurrency: float
    # vLLM's "KV cache size: N tokens" figure.
    kv_cache_tokens: int
    # Tokens the usable blocks hold when every block is full and no window frees any.
    usable_tokens: int


def size_pool(layout: PoolLayout, available_bytes: int, max_model_len: int) -> Pool:
    num_blocks = max(0, available_bytes // layout.bytes_per_block)
    per_request = layout.blocks_for_tokens(max_model_len)
    concurrency = num_blocks / per_request if per_request else 0.0
    return Pool(
        bytes=num_blocks * layout.bytes_per_block,
        num_blocks=num_blocks,
        usable_blocks=max(0, num_blocks - 1),
        block_size=layout.block_size,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        kv_cache_tokens=int(concurrency * max_model_len),
        # A token takes a slot in every group's block table.
        usable_tokens=max(0, num_blocks - 1) * layout.block_size // len(layout.groups),
    )


def needed_bytes(layout: PoolLayout, max_model_len: int) -> int:
    """Pool bytes vLLM requires to start: one max_model_len request plus the null block."""
    return (layout.blocks_for_tokens(max_model_len) + 1) * layout.bytes_per_block


def largest_fitting_len(layout: PoolLayout, available_bytes: int, upper: int) -> int:
    """The largest max_model_len <= upper whose request fits, as vLLM estimates it (0 if none)."""
    usable = available_bytes - layout.bytes_per_block
    if usable <= 0 or layout.blocks_for_tokens(1) * layout.bytes_per_block > usable:
        return 0
    lo, hi, best = 1, upper, 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if layout.blocks_for_tokens(mid) * layout.bytes_per_block <= usable:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


@dataclass(frozen=True)
class CorpusConcurrency:
    """Concurrency the pool carries for a corpus: each request's tokens rounded up to blocks, and,
    with the prompts' block hashes, with vLLM's prefix cache too."""

    requests: int
    mean_blocks_per_request: float
    max_blocks_per_request: int
    concurrency: float
    concurrency_floor: int
    # With the prompts' block hashes only (None without).
    concurrency_prefix_cache: int | None = None
    shared_prefix_blocks: int | None = None
    mean_own_blocks_per_request: float | None = None

    def to_dict(self) -> dict:
        """As `planner estimate` reports it: the prefix-cache figures only when they were computed."""
        return {k: v for k, v in asdict(self).items() if v is not None or k not in PREFIX_CACHE_FIELDS}


PREFIX_CACHE_FIELDS = ("concurrency_prefix_cache", "shared_prefix_blocks", "mean_own_blocks_per_request")


def corpus_concurrency(
    layout: PoolLayout, pool: Pool, request_tokens: list[int], prompt_hashes: list[list[int]] | None = None
) -> CorpusConcurrency:
    """Concurrency the pool carries for this corpus: each request's tokens rounded up to blocks.

    With the prompts' block hashes, also the concurrency with vLLM's prefix cache, where requests
    in flight hold the blocks they share once (replay.prefix.bound.prefix_aware_bound)."""
    blocks = [layout.blocks_for_tokens(n) for n in request_tokens]
    mean_blocks = sum(blocks) / len(blocks)
    carried = pool.usable_blocks / mean_blocks if mean_blocks else 0.0
    out = CorpusConcurrency(
        requests=len(blocks),
        mean_blocks_per_request=round(mean_blocks, 3),
        max_blocks_per_request=max(blocks),
        concurrency=round(carried, 3),
        concurrency_floor=math.floor(carried),
    )
    if prompt_hashes is None:
        return out
    with_cache, own, shared = prefix_aware_bound(blocks, prompt_hashes, pool_blocks=pool.usable_blocks)
    return replace(
        out,
        concurrency_prefix_cache=max(with_cache, math.floor(carried)),
        shared_prefix_blocks=shared,
        mean_own_blocks_per_request=round(own, 3),
    )
