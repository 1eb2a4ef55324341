"""`planner prompts`: look at a corpus before replaying it, and convert ShareGPT dumps into one.

    planner prompts stats FILE [--url URL]     counts and token-length percentiles
    planner prompts convert --from sharegpt IN OUT [--max-tokens-from-reply]

Without --url, input lengths are an estimate (replay.lengths.ESTIMATE_RULE) and every output
says so; with --url they are the server's own /tokenize counts, chat template included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from planner.cliargs import env_default
from replay.client import StreamingClient
from replay.tokens import token_counts
from replay.corpus import Corpus, load_corpus, request_text
from replay.errors import CorpusError
from replay.lengths import ESTIMATE_RULE, estimate_tokens

# In-flight /tokenize calls: enough to hide the round trip, few enough not to crowd a live server.
TOKENIZE_CONCURRENCY = 16
NO_CATEGORY = "(none)"


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
    cv.add_argument("input", type=Path, metavar="IN", help="ShareGPT JSON or JSONL file")
    cv.add_argument("output", type=Path, metavar="OUT", help="planner JSONL to write (replaced atomically)")
    cv.add_argument(
        "--max-tokens-from-reply",
        action="store_true",
        help=f"set max_tokens to the estimated length ({ESTIMATE_RULE}) of the reply that followed",
    )
    cv.set_defaults(run=run_convert)


# --- stats ------------------------------------------------------------------------------------


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
        # numpy's default (linear) interpolation, as replay.stats uses for latencies.
        p50, p90, p99 = np.percentile(arr, (50, 90, 99))
        # Two decimals: token counts are integers, so more digits are interpolation noise.
        return cls(*(round(float(v), 2) for v in (p50, p90, p99, arr.max(), arr.mean())))


def corpus_stats(corpus: Corpus, input_tokens: list[int], tokens: dict[str, Any]) -> dict[str, Any]:
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
    return "\n".join(lines)


def token_label(tokens: dict[str, Any]) -> str:
    if tokens["source"] == "estimate":
        return f"tokens (estimated: {tokens['rule']}; pass --url to count with the server's tokenizer)"
    return f"tokens (counted by {tokens['url']}/tokenize, model {tokens['model']}, api {tokens['api']})"


async def server_token_counts(
    corpus: Corpus, url: str, *, model: str | None, api: str, api_key: str | None
) -> tuple[list[int], str]:
    """Every request's input tokens by the server's /tokenize, and the model that counted them."""
    async with StreamingClient(
        url, model=model, api=api, api_key=api_key, max_connections=TOKENIZE_CONCURRENCY
    ) as client:
        served = await client.check()
        counts = await token_counts(client, corpus.requests, workers=TOKENIZE_CONCURRENCY)
    return counts, served


def run_stats(args: argparse.Namespace) -> int:
    corpus = load_corpus(args.file, skip_invalid=args.skip_invalid)
    if args.url:
        api_key = args.api_key or env_default("PLANNER_API_KEY")
        url = args.url.rstrip("/")
        input_tokens, model = asyncio.run(
            server_token_counts(corpus, url, model=args.model, api=args.api, api_key=api_key)
        )
        tokens = {"source": "server", "url": url, "model": model, "api": args.api}
    else:
        input_tokens = [estimate_tokens(request_text(r)) for r in corpus.requests]
        tokens = {"source": "estimate", "rule": ESTIMATE_RULE}
    stats = corpus_stats(corpus, input_tokens, tokens)
    print(json.dumps(stats, indent=2) if args.json else render_stats(stats))
    return 0


# --- convert ----------------------------------------------------------------------------------

# ShareGPT dumps name the speakers in several ways; these are the ones seen in the common sets.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}
TURN_KEYS = ("conversations", "conversation", "messages")


@dataclass
class ConvertResult:
    converted: int
    skipped_no_human: int


def _sharegpt_items(path: Path) -> Iterator[tuple[int | None, str, Any]]:
    """(line, label, item) per conversation of a JSON list (line None, label "item N: ") or of JSONL."""
    src = str(path)
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise CorpusError(f"cannot read the ShareGPT file: {exc.strerror or exc}", path=src) from exc
    with f:
        first = ""
        while not first:
            chunk = f.read(1)
            if not chunk:
                break
            first = chunk.strip()
        f.seek(0)
        if first == "[":
            # A JSON list has to be parsed whole; ShareGPT dumps are distributed that way.
            try:
                items = json.load(f)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"invalid JSON at column {exc.colno}: {exc.msg}", path=src, line=exc.lineno) from None
            for i, item in enumerate(items):
                yield None, f"item {i}: ", item
            return
        for lineno, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                item = json.loads(text)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"invalid JSON at column {exc.colno}: {exc.msg}", path=src, line=lineno) from None
            yield lineno, "", item


def sharegpt_request(item: Any, index: int, *, max_tokens_from_reply: bool, fail) -> dict[str, Any] | None:
    """One planner request from one ShareGPT conversation; None when it has no human turn.

    fail(message) builds the CorpusError that names the conversation's place in the file.
    """
    if not isinstance(item, dict):
        raise fail(f"expected a conversation object, found {_json_kind(item)}")
    key = next((k for k in TURN_KEYS if k in item), None)
    if key is None:
        raise fail(f"no turns; a conversation needs one of the keys {', '.join(TURN_KEYS)}")
    turns = item[key]
    if not isinstance(turns, list):
        raise fail(f"{key!r} is {_json_kind(turns)}; it must be a list of turns")
    messages: list[dict[str, str]] = []
    for t, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise fail(f"{key}[{t}] is {_json_kind(turn)}; a turn is an object like {{\"from\": \"human\", \"value\": \"...\"}}")
        speaker = turn.get("from", turn.get("role"))
        text = turn.get("value", turn.get("content"))
        role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
        if role is None:
            raise fail(f"{key}[{t}] has speaker {speaker!r}; valid speakers ('from' or 'role'): {', '.join(SHAREGPT_ROLES)}")
        if not isinstance(text, str):
            raise fail(f"{key}[{t}] has no text; a turn needs a string 'value' (or 'content')")
        messages.append({"role": role, "content": text})
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        return None
    raw_id = item.get("id")
    valid_id = isinstance(raw_id, str | int) and not isinstance(raw_id, bool)
    req: dict[str, Any] = {"id": str(raw_id) if valid_id else f"sharegpt-{index}", "messages": messages[: last_user + 1]}
    if max_tokens_from_reply:
        reply = next((m for m in messages[last_user + 1 :] if m["role"] == "assistant"), None)
        if reply is not None and reply["content"]:
            req["max_tokens"] = estimate_tokens(reply["content"])
    return req


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def convert_sharegpt(src: Path, dst: Path, *, max_tokens_from_reply: bool = False) -> ConvertResult:
    """Write the planner JSONL for a ShareGPT file; OUT appears whole or not at all."""
    converted = skipped = 0
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    except OSError as exc:
        raise CorpusError(f"cannot write the converted corpus: {exc.strerror or exc}", path=str(dst)) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            for index, (line, label, item) in enumerate(_sharegpt_items(src)):

                def fail(message: str, line: int | None = line, label: str = label) -> CorpusError:
                    return CorpusError(label + message, path=str(src), line=line)

                req = sharegpt_request(item, index, max_tokens_from_reply=max_tokens_from_reply, fail=fail)
                if req is None:
                    skipped += 1
                    continue
                out.write(json.dumps(req, ensure_ascii=False) + "\n")
                converted += 1
        if converted == 0:
            raise CorpusError(
                f"no conversation has a human turn ({skipped} skipped); nothing to write to {dst}", path=str(src)
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise
    return ConvertResult(converted=converted, skipped_no_human=skipped)


def run_convert(args: argparse.Namespace) -> int:
    result = convert_sharegpt(args.input, args.output, max_tokens_from_reply=args.max_tokens_from_reply)
    print(
        f"converted {result.converted} conversations to {args.output};"
        f" skipped {result.skipped_no_human} with no human turn"
    )
    return 0
