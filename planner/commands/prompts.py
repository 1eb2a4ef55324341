"""`planner prompts`: look at a corpus before replaying it, and convert ShareGPT dumps, chat logs and
Mooncake traces into one.

    planner prompts stats FILE [--url URL] [--block-size N] [--kv-blocks N]
                                               counts, token-length percentiles, prefix sharing
    planner prompts convert --from sharegpt IN OUT [--max-tokens-from-reply]
    planner prompts mooncake IN OUT [--block-size 512]   a Mooncake trace, its traced blocks shared
    planner prompts sharegpt IN OUT [--single-request [--max-tokens-from-reply]]
    planner prompts chatlog IN OUT

Without --url, input lengths are an estimate (replay.corpus.lengths.ESTIMATE_RULE) and every output
says so; with --url they are the server's own /tokenize counts, chat template included. The work
is replay's (replay.prefix.corpus_stats, replay.corpus.sharegpt); this module parses and prints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from planner.cliargs import env_default, positive_int
from planner.vllm_log import cache_config_labels
from replay.corpus.chatlog import group_chat_log
from replay.corpus.jsonl import load_corpus
from replay.corpus.lengths import ESTIMATE_RULE
from replay.corpus.mooncake import MOONCAKE_BLOCK_SIZE, convert_mooncake
from replay.corpus.sharegpt import convert_sharegpt, convert_sharegpt_sessions
from replay.prefix.corpus_stats import corpus_stats, prefix_figures, render_stats, server_prompt_blocks
from replay.prefix.tokens import estimated_prompt_blocks

# vLLM's default block size on GPUs (the CPU build uses 128); used when neither the flag nor a
# server says.
DEFAULT_BLOCK_SIZE = 16

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prompts",
        help="inspect a prompt corpus or convert one from ShareGPT",
        description="Inspect a prompt corpus (counts, token lengths) or convert ShareGPT conversations into one.",
    )
    psub = p.add_subparsers(dest="prompts_command", metavar="SUBCOMMAND", required=True)

    st = psub.add_parser(
        "stats",
        help="request counts and token-length percentiles of a corpus",
        description="Request counts by form and category, and p50/p90/p99/max/mean of input, requested output"
        f" (max_tokens) and total tokens. Input tokens are estimated ({ESTIMATE_RULE}) unless --url is given,"
        " in which case the server's /tokenize counts them.",
    )
    st.add_argument("file", type=Path, metavar="FILE", help="corpus JSONL (see prompts/README.md)")
    st.add_argument("--url", default=None, help="count input tokens with this server's /tokenize, e.g. http://127.0.0.1:8000")
    st.add_argument("--api-key", default=None, help="sent as a Bearer token (env PLANNER_API_KEY)")
    st.add_argument("--model", default=None, help="model whose tokenizer counts (default: the first in /v1/models)")
    st.add_argument(
        "--api",
        choices=["completions", "chat"],
        default="completions",
        help="how prompt-form requests are tokenized: as a raw prompt or as one user message (default completions)",
    )
    st.add_argument(
        "--block-size",
        type=positive_int("--block-size"),
        default=None,
        help=f"KV block size of the prefix-cache figures (default: the server's with --url, else {DEFAULT_BLOCK_SIZE})",
    )
    st.add_argument(
        "--kv-blocks",
        type=positive_int("--kv-blocks"),
        default=None,
        help="KV pool size in blocks for the LRU hit rate (default: the server's num_gpu_blocks with --url)",
    )
    st.add_argument("--skip-invalid", action="store_true", help="skip invalid lines (and report how many)")
    st.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    st.set_defaults(run=run_stats)

    cv = psub.add_parser(
        "convert",
        help="convert ShareGPT conversations to the planner's JSONL",
        description="Convert ShareGPT-style conversations (a JSON list or JSONL of {id, conversations: [{from, value}]})"
        " to the planner's JSONL: each conversation becomes one messages request ending at its last human turn.",
    )
    cv.add_argument("--from", dest="source", choices=["sharegpt"], required=True, help="input format")
    _in_out(cv, "ShareGPT JSON or JSONL file")
    cv.add_argument(
        "--max-tokens-from-reply",
        action="store_true",
        help=f"set max_tokens to the estimated length ({ESTIMATE_RULE}) of the reply that followed",
    )
    cv.set_defaults(run=run_convert)

    mc = psub.add_parser(
        "mooncake",
        help="synthesise a corpus from a Mooncake-style trace, sharing exactly its traced blocks",
        description="Convert a Mooncake-style trace (JSONL of timestamp in ms, input_length, output_length, hash_ids)"
        " to the planner's JSONL: each line a prompt made of one text per hash id (equal ids, equal text), with"
        f" max_tokens the output length and timestamp_s the arrival. Block lengths are in estimated tokens"
        f" ({ESTIMATE_RULE}), so `prompts stats --block-size N` sees exactly the traced sharing.",
    )
    _in_out(mc, "Mooncake trace JSONL")
    mc.add_argument(
        "--block-size",
        type=positive_int("--block-size"),
        default=MOONCAKE_BLOCK_SIZE,
        help=f"tokens per hash id in the trace (default {MOONCAKE_BLOCK_SIZE}, as in Mooncake's traces)",
    )
    mc.set_defaults(run=run_mooncake)

    sg = psub.add_parser(
        "sharegpt",
        help="ShareGPT conversations as sessions (every human turn a turn)",
        description="Convert ShareGPT-style conversations to the planner's session form: one conversation line each,"
        " every human turn a turn, the gpt reply after it as its recorded assistant text and (estimated,"
        f" {ESTIMATE_RULE}) max_tokens. --single-request writes the older form instead: one messages request per"
        " conversation, ending at its last human turn (as `convert --from sharegpt`).",
    )
    _in_out(sg, "ShareGPT JSON or JSONL file")
    sg.add_argument("--single-request", action="store_true", help="one request per conversation instead of a session")
    sg.add_argument(
        "--max-tokens-from-reply",
        action="store_true",
        help="with --single-request: set max_tokens from the reply that followed (sessions always do)",
    )
    sg.set_defaults(run=run_sharegpt)

    cl = psub.add_parser(
        "chatlog",
        help="group an OpenAI-style chat log into sessions",
        description="Group a chat log (JSONL of logged chat requests, {\"messages\": [...]} each, optional max_tokens"
        " and timestamp_s) into sessions: a request whose messages repeat an earlier one's and its reply is that"
        " conversation's next turn. Writes session turn lines (session_id, turn, the new messages, the recorded reply).",
    )
    _in_out(cl, "chat log JSONL")
    cl.set_defaults(run=run_chatlog)


def _in_out(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("input", type=Path, metavar="IN", help=what)
    parser.add_argument("output", type=Path, metavar="OUT", help="planner JSONL to write (replaced atomically)")


def run_stats(args: argparse.Namespace) -> int:
    corpus = load_corpus(args.file, skip_invalid=args.skip_invalid)
    labels: dict[str, str] | None = None
    if args.url:
        api_key = args.api_key or env_default("PLANNER_API_KEY")
        url = args.url.rstrip("/")

        def block_size(metrics: str | None) -> int:
            nonlocal labels
            labels = cache_config_labels(metrics) if metrics else None
            return _block_size(args.block_size, labels)[0]

        prompts, model, _ = asyncio.run(
            server_prompt_blocks(
                corpus, url, model=args.model, api=args.api, api_key=api_key, block_size=block_size
            )
        )
        tokens = {"source": "server", "url": url, "model": model, "api": args.api}
    else:
        prompts = estimated_prompt_blocks(corpus.requests, args.block_size or DEFAULT_BLOCK_SIZE)
        tokens = {"source": "estimate", "rule": ESTIMATE_RULE}
    size, size_source = _block_size(args.block_size, labels)
    kv_blocks, kv_source = args.kv_blocks, "--kv-blocks"
    if kv_blocks is None and _label_int(labels, "num_gpu_blocks"):
        kv_blocks, kv_source = _label_int(labels, "num_gpu_blocks"), "the server's num_gpu_blocks"
    prefix = prefix_figures(corpus, prompts, size, kv_blocks, block_size_source=size_source, kv_blocks_source=kv_source)
    stats = corpus_stats(corpus, [n for n, _ in prompts], tokens, prefix)
    print(json.dumps(stats, indent=2) if args.json else render_stats(stats))
    return 0


def _block_size(flag: int | None, labels: dict[str, str] | None) -> tuple[int, str]:
    if flag:
        return flag, "--block-size"
    served = _label_int(labels, "block_size")
    if served:
        return served, "the server's"
    return DEFAULT_BLOCK_SIZE, "vLLM's GPU default; pass --block-size or --url"


def _label_int(labels: dict[str, str] | None, key: str) -> int | None:
    try:
        return int((labels or {})[key])
    except (KeyError, ValueError):
        return None


def run_mooncake(args: argparse.Namespace) -> int:
    result = convert_mooncake(args.input, args.output, block_size=args.block_size)
    print(
        f"converted {result.requests} trace requests to {args.output}: {result.blocks} blocks of"
        f" {args.block_size} tokens, {result.distinct_blocks} distinct"
    )
    return 0


def run_convert(args: argparse.Namespace) -> int:
    result = convert_sharegpt(args.input, args.output, max_tokens_from_reply=args.max_tokens_from_reply)
    print(
        f"converted {result.converted} conversations to {args.output};"
        f" skipped {result.skipped_no_human} with no human turn"
    )
    return 0


def run_sharegpt(args: argparse.Namespace) -> int:
    from planner.errors import ConfigError

    if args.single_request:
        return run_convert(args)
    if args.max_tokens_from_reply:
        raise ConfigError("--max-tokens-from-reply goes with --single-request; sessions always take max_tokens from the replies")
    result = convert_sharegpt_sessions(args.input, args.output)
    print(
        f"converted {result.converted} conversations to sessions in {args.output};"
        f" skipped {result.skipped_no_human} with no human turn"
    )
    return 0


def run_chatlog(args: argparse.Namespace) -> int:
    result = group_chat_log(args.input, args.output)
    print(f"grouped {result.lines} logged requests into {result.sessions} sessions ({result.turns} turns) in {args.output}")
    return 0
