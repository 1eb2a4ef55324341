"""What a corpus holds before it is replayed: request forms, categories, and token-length
percentiles of inputs, outputs (max_tokens) and both. Input lengths come from the server's own
/tokenize (chat template included) or, without a server, from an estimate
(replay.corpus.lengths.ESTIMATE_RULE) that every output names.

The prefix-cache figures (replay.prefix.sharing) hash the same tokens: the server's token ids with
a server, else the estimate's 4-byte pieces of the text."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from replay.client.streaming import StreamingClient
from replay.corpus.jsonl import Corpus
from replay.prefix.bound import KvBounds, kv_bounds
from replay.prefix.sharing import Sharing, sharing
from replay.prefix.tokens import prompt_blocks

TOKENIZE_CONCURRENCY = 16
NO_CATEGORY = "(none)"


@dataclass
class TokenSummary:
    p50: float
    p90: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, values: list[int]) -> TokenSummary | None:
        if not values:
            return None
        arr = np.asarray(values, dtype=float)
        # numpy's default (linear) interpolation, as replay.stats.samples uses for latencies.
        p50, p90, p99 = np.percentile(arr, (50, 90, 99))
        # Two decimals: token counts are integers, so more digits are interpolation noise.
        return cls(*(round(float(v), 2) for v in (p50, p90, p99, arr.max(), arr.mean())))


@dataclass(frozen=True)
class PrefixFigures:
    """A corpus's prefix sharing (replay.prefix.sharing), where its block and pool sizes came
    from, and, with a pool size, the KV concurrency bounds it gives."""

    sharing: Sharing
    block_size_source: str
    kv_blocks_source: str | None
    concurrency_bound: KvBounds | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            **self.sharing.to_dict(),
            "block_size_source": self.block_size_source,
            "kv_blocks_source": self.kv_blocks_source,
        }
        if self.concurrency_bound is not None:
            out["concurrency_bound"] = self.concurrency_bound.to_dict()
        return out


def prefix_figures(
    corpus: Corpus, prompts: list[tuple[int, list[int]]], block_size: int, kv_blocks: int | None, *,
    block_size_source: str, kv_blocks_source: str,
) -> PrefixFigures:
    """The prefix figures of a corpus's (prompt tokens, block hashes), in corpus order; the bounds
    need `kv_blocks`, the pool's size in blocks."""
    bounds = None
    if kv_blocks is not None:
        bounds = kv_bounds(
            prompts, [r.max_tokens for r in corpus.requests], block_size=block_size, kv_blocks=kv_blocks
        )
    return PrefixFigures(
        sharing=sharing(prompts, block_size, kv_blocks),
        block_size_source=block_size_source,
        kv_blocks_source=kv_blocks_source if kv_blocks is not None else None,
        concurrency_bound=bounds,
    )


def corpus_stats(
    corpus: Corpus, input_tokens: list[int], tokens: dict[str, Any], prefix_cache: PrefixFigures | None = None
) -> dict[str, Any]:
    """The figures `prompts stats` shows, as JSON-ready data; input_tokens[i] belongs to request i."""
    reqs = corpus.requests
    forms = {"prompt": sum(r.prompt is not None for r in reqs), "messages": sum(r.messages is not None for r in reqs)}
    categories: dict[str, int] = {}
    if any("category" in r.extra for r in reqs):
        counts = Counter(str(r.extra.get("category", NO_CATEGORY)) for r in reqs)
        # Largest first; requests without a category come last whatever their count.
        categories = dict(sorted(counts.items(), key=lambda kv: (kv[0] == NO_CATEGORY, -kv[1], kv[0])))
    outputs = [r.max_tokens for r in reqs if r.max_tokens is not None]
    totals = [n + r.max_tokens for n, r in zip(input_tokens, reqs) if r.max_tokens is not None]

    def summary(values: list[int]) -> dict[str, float] | None:
        s = TokenSummary.of(values)
        return None if s is None else asdict(s)

    return {
        "file": corpus.path,
        "sha256": corpus.sha256,
        "requests": len(reqs),
        "skipped_invalid": corpus.skipped_invalid,
        "skipped_samples": list(corpus.skipped_samples),
        "forms": forms,
        "categories": categories,
        "tokens": tokens,
        "input_tokens": summary(input_tokens),
        "output_tokens": summary(outputs),
        "total_tokens": summary(totals),
        "without_max_tokens": len(reqs) - len(outputs),
        "prefix_cache": None if prefix_cache is None else prefix_cache.to_dict(),
    }


def render_stats(stats: dict[str, Any]) -> str:
    """The plain aligned table `prompts stats` prints (stable, so tests and READMEs can quote it)."""
    n = stats["requests"]
    lines = [f"{stats['file']}: {n} request{'s' if n != 1 else ''}, sha256 {stats['sha256'][:12]}"]
    if stats["skipped_invalid"]:
        lines.append(f"skipped {stats['skipped_invalid']} invalid lines (first: {stats['skipped_samples'][0]})")
    lines.append(f"forms: prompt {stats['forms']['prompt']}, messages {stats['forms']['messages']}")
    if stats["categories"]:
        lines.append("categories: " + ", ".join(f"{k} {v}" for k, v in stats["categories"].items()))
    lines.append("")
    lines.append(token_label(stats["tokens"]))
    lines.append(f"{'':<22}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}{'mean':>9}")
    for name, key in (("input", "input_tokens"), ("output (max_tokens)", "output_tokens"), ("total", "total_tokens")):
        s = stats[key]
        if s is None:
            lines.append(f"{name:<22}{'-':>8}{'-':>8}{'-':>8}{'-':>8}{'-':>9}")
        else:
            cells = "".join(f"{s[k]:>8.0f}" for k in ("p50", "p90", "p99", "max"))
            lines.append(f"{name:<22}{cells}{s['mean']:>9.1f}")
    missing = stats["without_max_tokens"]
    if missing:
        which = "1 request has" if missing == 1 else f"{missing} requests have"
        lines.append(f"{which} no max_tokens: left out of output and total")
    if stats.get("prefix_cache"):
        lines += ["", *render_prefix_cache(stats["prefix_cache"])]
    return "\n".join(lines)


def render_prefix_cache(pc: dict[str, Any]) -> list[str]:
    share = pc["unique_blocks"] / pc["total_blocks"] if pc["total_blocks"] else 1.0
    lines = [
        f"prefix cache (block size {pc['block_size']}, {pc['block_size_source']}; requests in corpus order)",
        f"  full prompt blocks    {pc['total_blocks']}, unique {pc['unique_blocks']} ({share:.1%}),"
        f" held by 2+ requests {pc['shared_blocks']}",
        f"  hit rate, unbounded cache  {pc['hit_rate_unbounded']:.1%} of prompt tokens",
    ]
    if pc["kv_blocks"] is not None:
        lines.append(
            f"  hit rate, LRU cache        {pc['hit_rate_lru']:.1%} of prompt tokens"
            f" ({pc['kv_blocks']} blocks, {pc['kv_blocks_source']})"
        )
        b = pc.get("concurrency_bound")
        if b:
            lines.append(
                f"  KV concurrency bound       {b['no_prefix_cache']} without the cache"
                f" ({b['mean_blocks_per_request']:.2f} blocks a request), {b['prefix_cache']} with it"
                f" ({b['shared_prefix_blocks']} shared blocks once + {b['mean_own_blocks_per_request']:.2f} own a request)"
            )
    else:
        lines.append("  (no KV pool size: pass --kv-blocks, or --url to read the server's, for an LRU hit rate)")
    return lines


def token_label(tokens: dict[str, Any]) -> str:
    if tokens["source"] == "estimate":
        return f"tokens (estimated: {tokens['rule']}; pass --url to count with the server's tokenizer)"
    return f"tokens (counted by {tokens['url']}/tokenize, model {tokens['model']}, api {tokens['api']})"


async def server_prompt_blocks(
    corpus: Corpus,
    url: str,
    *,
    model: str | None,
    api: str,
    api_key: str | None,
    block_size: Callable[[str | None], int],
) -> tuple[list[tuple[int, list[int]]], str, str | None]:
    """Every request's (input tokens, block hashes) by the server's /tokenize, the model that
    counted them, and the server's /metrics text (None without one). `block_size(metrics_text)`
    picks the block size to hash with."""
    async with StreamingClient(
        url, model=model, api=api, api_key=api_key, max_connections=TOKENIZE_CONCURRENCY
    ) as client:
        served = await client.check()
        metrics = await client.metrics_text()
        prompts = await prompt_blocks(client, corpus.requests, block_size(metrics), workers=TOKENIZE_CONCURRENCY)
    return prompts, served, metrics
