"""`planner prompts stats --url`: input tokens counted by the fake server's /tokenize.

The fake tokenizer counts ceil(UTF-8 bytes / 4) per text, plus 4 tokens per chat message for the
template, so every figure below can be checked by hand.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from planner.cli import main
from replay.corpus.jsonl import load_corpus
from replay.prefix.corpus_stats import server_prompt_blocks
from tests.fakes.openai_server import Behavior, FakeServer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
GOOD = FIXTURES / "good.jsonl"
# good.jsonl: two chat requests (two messages of 4 + 7 text tokens; one of 20), three prompts of 30, 40, 100.
SERVER_COUNTS = [4 + 4 + 7 + 4, 20 + 4, 30, 40, 100]


async def server_token_counts(corpus, url: str, *, model: str | None, api: str) -> tuple[list[int], str]:
    prompts, served, _ = await server_prompt_blocks(
        corpus, url, model=model, api=api, api_key=None, block_size=lambda _metrics: 16
    )
    return [n for n, _ in prompts], served


def test_counts_come_from_tokenize_in_corpus_order():
    corpus = load_corpus(GOOD)

    async def go():
        async with FakeServer(Behavior()) as srv:
            return await server_token_counts(corpus, srv.url, model=None, api="completions")

    assert asyncio.run(go()) == (SERVER_COUNTS, "fake-model")


def test_chat_api_wraps_prompts_in_one_user_message():
    corpus = load_corpus(GOOD)

    async def go():
        async with FakeServer(Behavior()) as srv:
            return await server_token_counts(corpus, srv.url, model="fake-model", api="chat")

    counts, _ = asyncio.run(go())
    assert counts == SERVER_COUNTS[:2] + [n + 4 for n in SERVER_COUNTS[2:]]


def test_many_requests_keep_their_order(tmp_path):
    # More requests than workers, each of a different length: a mix-up between workers would show.
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps({"prompt": "x" * (4 * n)}) + "\n" for n in range(1, 201)), encoding="utf-8")
    corpus = load_corpus(path)

    async def go():
        async with FakeServer(Behavior()) as srv:
            return await server_token_counts(corpus, srv.url, model=None, api="completions")

    counts, _ = asyncio.run(go())
    assert counts == list(range(1, 201))


def test_cli_with_url_and_api_key_from_the_environment(spawn_fake_server, monkeypatch, capsys):
    url = spawn_fake_server("--api-key", "s3cret", "--model", "tiny")
    monkeypatch.setenv("PLANNER_API_KEY", "s3cret")
    assert main(["prompts", "stats", str(GOOD), "--url", url + "/", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["tokens"] == {"source": "server", "url": url, "model": "tiny", "api": "completions"}
    # [19, 24, 30, 40, 100]: linear percentiles as in the estimate case, mean 213 / 5.
    assert stats["input_tokens"] == {"p50": 30.0, "p90": 76.0, "p99": 97.6, "max": 100.0, "mean": 42.6}
    # Totals of the four with max_tokens: 35, 56, 94, 168.
    assert stats["total_tokens"] == {"p50": 75.0, "p90": 145.8, "p99": 165.78, "max": 168.0, "mean": 88.25}

    assert main(["prompts", "stats", str(GOOD), "--url", url]) == 0
    out = capsys.readouterr().out
    assert f"tokens (counted by {url}/tokenize, model tiny, api completions)\n" in out
    assert "estimated" not in out


def test_cli_reports_a_rejected_key_in_one_line(spawn_fake_server, capsys):
    url = spawn_fake_server("--api-key", "s3cret")
    rc = main(["prompts", "stats", str(GOOD), "--url", url, "--api-key", "wrong"])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err.startswith("planner prompts: error: ") and err.count("\n") == 1


def test_cli_reports_an_unserved_model(spawn_fake_server, capsys):
    url = spawn_fake_server()
    rc = main(["prompts", "stats", str(GOOD), "--url", url, "--model", "llama-70b"])
    assert rc == 2
    assert capsys.readouterr().err == (
        "planner prompts: error: model 'llama-70b' is not served here; served models: fake-model\n"
    )


def test_cli_with_url_takes_block_size_and_pool_from_the_server(spawn_fake_server, tmp_path, capsys):
    # The fake's block size is 16 and 48 KV tokens are 3 blocks. 4 prompts of 48 tokens share a
    # 32-token system prompt: requests 2-4 hit its 2 blocks, 3 x 32 of 192 tokens.
    path = tmp_path / "shared.jsonl"
    lines = [json.dumps({"prompt": "S" * 128 + f"question {i:02d}".ljust(64, ".")}) for i in range(4)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    url = spawn_fake_server("--kv-cache-tokens", "48")
    assert main(["prompts", "stats", str(path), "--url", url, "--json"]) == 0
    pc = json.loads(capsys.readouterr().out)["prefix_cache"]
    assert (pc["block_size"], pc["block_size_source"]) == (16, "the server's")
    assert (pc["kv_blocks"], pc["kv_blocks_source"]) == (3, "the server's num_gpu_blocks")
    assert (pc["total_blocks"], pc["unique_blocks"], pc["hit_rate_unbounded"], pc["hit_rate_lru"]) == (12, 6, 0.5, 0.5)
