"""`planner prompts stats`: exact figures on a small fixture, and the estimate is labelled as one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from replay.corpus.lengths import ESTIMATE_RULE, estimate_tokens

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
GOOD = FIXTURES / "good.jsonl"
GOOD_SHA = "72d2f228fd668c4f2e86c99917a3c284076d415652c667a398331ec7ab30f608"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_estimate_rule():
    assert ESTIMATE_RULE == "UTF-8 bytes / 4, rounded up"
    assert [estimate_tokens(t) for t in ("", "a", "abcd", "abcde", "café")] == [0, 1, 1, 2, 2]


def test_table_on_the_fixture(capsys):
    # Inputs are 10, 20, 30, 40, 100 estimated tokens (40 ... 400 UTF-8 bytes, one "é" among
    # them); max_tokens 16, 32, 64, 128 and one missing. Percentiles interpolate linearly.
    rc, out, err = run_cli(capsys, "prompts", "stats", str(GOOD))
    assert rc == 0 and err == ""
    assert out == (
        f"{GOOD}: 5 requests, sha256 {GOOD_SHA[:12]}\n"
        "forms: prompt 3, messages 2\n"
        "categories: chat 2, code 1, rag 1, (none) 1\n"
        "\n"
        "tokens (estimated: UTF-8 bytes / 4, rounded up; pass --url to count with the server's tokenizer)\n"
        "                           p50     p90     p99     max     mean\n"
        "input                       30      76      98     100     40.0\n"
        "output (max_tokens)         48     109     126     128     60.0\n"
        "total                       73     146     166     168     85.0\n"
        "1 request has no max_tokens: left out of output and total\n"
        "\n"
        "prefix cache (block size 16, vLLM's GPU default; pass --block-size or --url; requests in corpus order)\n"
        "  full prompt blocks    10, unique 10 (100.0%), held by 2+ requests 0\n"
        "  hit rate, unbounded cache  0.0% of prompt tokens\n"
        "  (no KV pool size: pass --kv-blocks, or --url to read the server's, for an LRU hit rate)\n"
    )


def test_a_shared_system_prompt_is_counted_as_vllm_caches_it(tmp_path, capsys):
    # 4 prompts of 48 estimated tokens (3 blocks of 16): 32 tokens of shared system prompt, then
    # 16 of their own. Requests 2-4 hit the 2 shared blocks (the third is never hit: it ends with
    # the last token): 3 x 32 hit tokens of 4 x 48.
    path = tmp_path / "shared.jsonl"
    lines = [json.dumps({"prompt": "S" * 128 + f"question {i:02d}".ljust(64, ".")}) for i in range(4)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rc, out, _ = run_cli(capsys, "prompts", "stats", str(path), "--json", "--kv-blocks", "20")
    assert rc == 0
    assert json.loads(out)["prefix_cache"] == {
        "block_size": 16,
        "block_size_source": "vLLM's GPU default; pass --block-size or --url",
        "requests": 4,
        "prompt_tokens": 192,
        "total_blocks": 12,
        "unique_blocks": 6,
        "shared_blocks": 2,
        "hit_rate_unbounded": 0.5,
        "kv_blocks": 20,
        "kv_blocks_source": "--kv-blocks",
        "hit_rate_lru": 0.5,
        # 48 + 16 (vLLM's default max_tokens) = 4 blocks a request: 20 // 4 = 5 without the cache;
        # with it the 2 system-prompt blocks are held once: 2 + 9 x 2 <= 20.
        "concurrency_bound": {
            "mean_blocks_per_request": 4.0,
            "no_prefix_cache": 5,
            "shared_prefix_blocks": 2,
            "mean_own_blocks_per_request": 2.0,
            "prefix_cache": 9,
        },
    }
    # Two blocks of room: each request's own block evicts the system prompt's first block.
    rc, out, _ = run_cli(capsys, "prompts", "stats", str(path), "--kv-blocks", "2")
    assert "  hit rate, LRU cache        0.0% of prompt tokens (2 blocks, --kv-blocks)\n" in out
    assert out.endswith(
        "  KV concurrency bound       1 without the cache (4.00 blocks a request), 1 with it"
        " (2 shared blocks once + 2.00 own a request)\n"
    )
    # Blocks of 32: the system prompt is one block, and 47 // 32 = 1 block may hit.
    rc, out, _ = run_cli(capsys, "prompts", "stats", str(path), "--json", "--block-size", "32")
    assert json.loads(out)["prefix_cache"]["hit_rate_unbounded"] == round(3 * 32 / 192, 4)


def test_bad_block_size_is_one_error_line(capsys):
    with pytest.raises(SystemExit):
        main(["prompts", "stats", str(GOOD), "--block-size", "0"])
    assert "--block-size '0': must be a positive integer" in capsys.readouterr().err


def test_json_on_the_fixture(capsys):
    rc, out, _ = run_cli(capsys, "prompts", "stats", str(GOOD), "--json")
    assert rc == 0
    assert json.loads(out) == {
        "file": str(GOOD),
        "sha256": GOOD_SHA,
        "requests": 5,
        "skipped_invalid": 0,
        "skipped_samples": [],
        "forms": {"prompt": 3, "messages": 2},
        "categories": {"chat": 2, "code": 1, "rag": 1, "(none)": 1},
        "tokens": {"source": "estimate", "rule": "UTF-8 bytes / 4, rounded up"},
        "input_tokens": {"p50": 30.0, "p90": 76.0, "p99": 97.6, "max": 100.0, "mean": 40.0},
        "output_tokens": {"p50": 48.0, "p90": 108.8, "p99": 126.08, "max": 128.0, "mean": 60.0},
        "total_tokens": {"p50": 73.0, "p90": 145.8, "p99": 165.78, "max": 168.0, "mean": 85.0},
        "without_max_tokens": 1,
        "prefix_cache": {
            "block_size": 16,
            "block_size_source": "vLLM's GPU default; pass --block-size or --url",
            "requests": 5,
            "prompt_tokens": 200,
            "total_blocks": 10,
            "unique_blocks": 10,
            "shared_blocks": 0,
            "hit_rate_unbounded": 0.0,
            "kv_blocks": None,
            "kv_blocks_source": None,
            "hit_rate_lru": None,
        },
    }


def test_skip_invalid_is_reported(capsys):
    path = FIXTURES / "mixed.jsonl"
    rc, out, _ = run_cli(capsys, "prompts", "stats", str(path), "--skip-invalid")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"{path}: 3 requests, sha256 {lines[0].split()[-1]}"
    assert lines[1] == f"skipped 4 invalid lines (first: {path}:2: invalid JSON at column 27: Expecting ',' delimiter)"
    assert lines[3] == "categories: chat 1, (none) 2"


def test_invalid_corpus_is_one_error_line(capsys):
    path = FIXTURES / "mixed.jsonl"
    rc, out, err = run_cli(capsys, "prompts", "stats", str(path))
    assert (rc, out) == (2, "")
    assert err == f"planner prompts: error: {path}:2: invalid JSON at column 27: Expecting ',' delimiter\n"


def test_corpus_without_categories_or_max_tokens(tmp_path, capsys):
    path = tmp_path / "plain.jsonl"
    path.write_text('{"prompt": "abcdefgh"}\n', encoding="utf-8")
    rc, out, _ = run_cli(capsys, "prompts", "stats", str(path))
    assert rc == 0
    assert "\ncategories:" not in out
    assert "input                        2       2       2       2      2.0\n" in out
    assert "output (max_tokens)          -       -       -       -        -\n" in out
    assert "1 request has no max_tokens: left out of output and total\n\nprefix cache" in out


def test_subcommand_is_required(capsys):
    with pytest.raises(SystemExit) as info:
        main(["prompts"])
    assert info.value.code == 2
    assert "SUBCOMMAND" in capsys.readouterr().err
