"""Tokens each corpus request will hold in the KV cache, for the corpus-aware concurrency.

No tokenizer is loaded (the planner never imports vLLM or transformers), so prompt lengths are
estimated as UTF-8 bytes / 4, rounded up: about right for English text under BPE vocabularies
of 32k-150k entries, low for code and non-Latin scripts. Chat templates add a few tokens per
message that are not counted. Every figure built on these is labelled an estimate.

A request holds prompt + max_tokens tokens at its longest, capped at max_model_len. Lines
without max_tokens use `default_max_tokens`; when that is None too, they are assumed to run to
max_model_len, which is what vLLM allows them.
"""

from __future__ import annotations

import math
from pathlib import Path

from replay.corpus.jsonl import load_corpus, request_text
from replay.prefix.sharing import block_hashes, estimate_token_ids

BYTES_PER_TOKEN = 4


def estimated_prompt_tokens(text: str) -> int:
    return max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))


def corpus_request_tokens(path: str | Path, *, max_model_len: int, default_max_tokens: int | None) -> tuple[list[int], dict]:
    corpus = load_corpus(path)
    tokens = []
    filled = 0
    for req in corpus.requests:
        prompt = estimated_prompt_tokens(request_text(req))
        out = req.max_tokens if req.max_tokens is not None else default_max_tokens
        if out is None:
            filled += 1
            tokens.append(max_model_len)
        else:
            tokens.append(min(prompt + out, max_model_len))
    info = {
        "path": str(path),
        "sha256": corpus.sha256,
        "token_counts": f"estimated as UTF-8 bytes / {BYTES_PER_TOKEN}",
        "requests_run_to_max_model_len": filled,
        "mean_tokens_per_request": round(sum(tokens) / len(tokens), 1) if tokens else None,
    }
    return tokens, info


def corpus_prompt_hashes(path: str | Path, block_size: int) -> list[list[int]]:
    """Every request's full prompt blocks as vLLM's prefix cache names them (chained hashes,
    replay.prefix.sharing), over the estimate's tokens: every 4 bytes of text one token."""
    return [block_hashes(estimate_token_ids(request_text(req)), block_size) for req in load_corpus(path).requests]
