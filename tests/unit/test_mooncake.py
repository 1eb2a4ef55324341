"""Mooncake traces as prompts whose blocks share exactly as the trace's hash_ids say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from replay.corpus.jsonl import load_corpus
from replay.corpus.lengths import estimate_tokens
from replay.corpus.mooncake import convert_mooncake
from replay.errors import CorpusError
from replay.prefix.sharing import block_hashes, estimate_token_ids

BLOCK = 16
TRACE = [
    {"timestamp": 1000, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]},
    {"timestamp": 1500, "input_length": 48, "output_length": 7, "hash_ids": [1, 2, 4]},
    {"timestamp": 1200, "input_length": 20, "output_length": 3, "hash_ids": [1, 5]},
    {"timestamp": 3000, "input_length": 40, "output_length": 5, "hash_ids": [6, 2, 3]},
    # A partial last block shared by id: both requests end with the same 8 tokens of block 3.
    {"timestamp": 3100, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]},
]


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_blocks_share_exactly_as_the_hash_ids_say(tmp_path: Path):
    out = tmp_path / "corpus.jsonl"
    result = convert_mooncake(_write(tmp_path, TRACE), out, block_size=BLOCK)
    assert (result.requests, result.blocks, result.distinct_blocks) == (5, 14, 6)
    corpus = load_corpus(out)
    texts = [r.prompt for r in corpus.requests]
    assert [estimate_tokens(t) for t in texts] == [r["input_length"] for r in TRACE]
    assert [r.max_tokens for r in corpus.requests] == [r["output_length"] for r in TRACE]
    assert [r.timestamp_s for r in corpus.requests] == [0.0, 0.5, 0.2, 2.0, 2.1]
    hashes = [block_hashes(estimate_token_ids(t), BLOCK) for t in texts]
    # Full blocks are equal exactly when the traced ids up to them are (ids are a chained prefix).
    for a, ra in zip(hashes, TRACE):
        for b, rb in zip(hashes, TRACE):
            for i in range(min(len(a), len(b))):
                assert (a[i] == b[i]) == (ra["hash_ids"][: i + 1] == rb["hash_ids"][: i + 1]), (ra, rb, i)
    # Request 1's and 5's partial last blocks: the same text.
    assert texts[0] == texts[4]


def test_the_cli_and_a_wrong_block_size(tmp_path: Path, capsys):
    trace = _write(tmp_path, TRACE)
    assert main(["prompts", "mooncake", str(trace), str(tmp_path / "c.jsonl"), "--block-size", str(BLOCK)]) == 0
    assert capsys.readouterr().out == (
        f"converted 5 trace requests to {tmp_path / 'c.jsonl'}: 14 blocks of {BLOCK} tokens, 6 distinct\n"
    )
    # The default is Mooncake's 512: 40 tokens are one block, not three.
    with pytest.raises(CorpusError, match=r"trace.jsonl:1: 3 hash_ids for input_length 40: with blocks of 512"):
        convert_mooncake(trace, tmp_path / "c.jsonl")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}, "field 'timestamp' is -1"),
        ({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}, "field 'input_length' is 0"),
        ({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": ["a"]}, "field 'hash_ids' must be a list of integers"),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path: Path, row: dict, message: str):
    with pytest.raises(CorpusError, match=rf"trace.jsonl:2: {message}"):
        convert_mooncake(_write(tmp_path, [TRACE[0], row]), tmp_path / "c.jsonl", block_size=BLOCK)
