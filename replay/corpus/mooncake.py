"""Mooncake-style traces (JSONL of `timestamp`, `input_length`, `output_length`, `hash_ids`) as a
planner corpus whose prompts share exactly the blocks the trace says they share.

In such a trace a request's prompt is cut into blocks of `block_size` tokens (512 in Mooncake's
published traces) and `hash_ids[i]` names its block i: two requests with the same id at the same
place hold the same tokens there (ids are chained: equal ids imply equal earlier blocks). The
prompt synthesised here is the concatenation of one text per block, each a deterministic function
of its id, so equal ids give equal text and different ids different text.

Token scheme: the offline estimate's (replay.corpus.lengths: one token per 4 bytes of UTF-8). A block's
text is 4 x block_size ASCII bytes, so its tokens under that estimate are exactly that block and
`planner prompts stats --block-size N` (no --url) sees exactly the traced sharing. A real
tokenizer cuts the same text into other tokens: equal text prefixes stay equal token prefixes, so
sharing survives, but a block's tokens no longer line up with the trace's blocks one for one and
lengths differ from `input_length` by the tokenizer's bytes per token.
"""

from __future__ import annotations

import json
import math
import random
import string
from dataclasses import dataclass
from pathlib import Path

from replay.atomic import atomic_text
from replay.corpus.lengths import BYTES_PER_TOKEN
from replay.errors import CorpusError

MOONCAKE_BLOCK_SIZE = 512
_ALPHABET = string.ascii_lowercase + " "


@dataclass
class MooncakeResult:
    requests: int
    blocks: int
    distinct_blocks: int


def block_text(hash_id: int, tokens: int) -> str:
    """The text of block `hash_id`, `tokens` estimated tokens long (a shorter last block is a
    prefix of the full block's text, so a partial block shared by id stays shared)."""
    rng = random.Random(hash_id)
    # A distinct head per id: random texts of other ids cannot collide by chance on a short block.
    head = f"[{hash_id}]"
    body = "".join(rng.choice(_ALPHABET) for _ in range(MOONCAKE_BLOCK_SIZE * BYTES_PER_TOKEN))
    return (head + body)[: tokens * BYTES_PER_TOKEN]


def _field(obj: dict, key: str, where: str, *, minimum: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CorpusError(f"{where}: field '{key}' is {value!r}; it must be an integer >= {minimum}")
    return value


def convert_mooncake(src: Path, dst: Path, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> MooncakeResult:
    """Write the planner corpus of a Mooncake trace: one prompt request per line, max_tokens the
    traced output length, timestamp_s the arrival (the trace's milliseconds from its earliest line)."""
    if block_size < 1 or block_size > MOONCAKE_BLOCK_SIZE * 64:
        raise CorpusError(f"block size {block_size}: must be between 1 and {MOONCAKE_BLOCK_SIZE * 64}")
    rows: list[tuple[float, str, int]] = []
    blocks = 0
    distinct: set[int] = set()
    try:
        text = src.read_text(encoding="utf-8")
    except OSError as exc:
        raise CorpusError(f"{src}: cannot read: {exc.strerror or exc}") from None
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{src}:{lineno}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{where}: invalid JSON at column {exc.colno}: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise CorpusError(f"{where}: a line must be a JSON object with timestamp, input_length, output_length, hash_ids")
        stamp = obj.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp) or stamp < 0:
            raise CorpusError(f"{where}: field 'timestamp' is {stamp!r}; it must be a number >= 0 (milliseconds)")
        n_in = _field(obj, "input_length", where, minimum=1)
        n_out = _field(obj, "output_length", where, minimum=1)
        ids = obj.get("hash_ids")
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise CorpusError(f"{where}: field 'hash_ids' must be a list of integers")
        if len(ids) != math.ceil(n_in / block_size):
            raise CorpusError(
                f"{where}: {len(ids)} hash_ids for input_length {n_in}: with blocks of {block_size} tokens it needs"
                f" {math.ceil(n_in / block_size)} (is the trace's block size another? pass --block-size)"
            )
        sizes = [block_size] * (len(ids) - 1) + [n_in - block_size * (len(ids) - 1)]
        prompt = "".join(block_text(h, n) for h, n in zip(ids, sizes))
        blocks += len(ids)
        distinct.update(ids)
        rows.append((float(stamp), prompt, n_out))
    if not rows:
        raise CorpusError(f"{src}: no trace lines")
    first_ms = min(stamp for stamp, _, _ in rows)
    with atomic_text(dst) as out:
        for stamp, prompt, n_out in rows:
            row = {"prompt": prompt, "max_tokens": n_out, "timestamp_s": round((stamp - first_ms) / 1000, 6)}
            out.write(json.dumps(row) + "\n")
    return MooncakeResult(requests=len(rows), blocks=blocks, distinct_blocks=len(distinct))
