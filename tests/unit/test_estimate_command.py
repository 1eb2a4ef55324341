"""`planner estimate` end to end through the CLI, on hand-made model folders."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from planner.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
TINY = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}  # fmt: skip


def tiny_model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [512, 64], "data_offsets": [0, 65536]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(65536))
    return tmp_path


def test_cpu_text_report(tmp_path, capsys):
    model = tiny_model(tmp_path)
    rc = main(["estimate", "--model", str(model), "--device", "cpu", "--kv-cache-memory-bytes", "2M", "--max-model-len", "1024"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[1] == "  weights per GPU, a lower bound (exact: 1 tensors in 1 safetensors file(s))     64.00 KiB"
    assert out[2] == "KV bytes per token per GPU: 256 (2 layers, 2 KV heads per rank)"
    assert out[3] == "KV pool: 2.00 MiB = 64 blocks of 128 tokens (63 usable, 1 null block reserved), 8,192 tokens as vLLM reports them"
    assert out[4] == "max concurrency at 1,024 tokens per request: 8.00x"
    assert out[5] == "verdict: fits, 1.72 MiB to spare"


def test_json_with_several_tp_sizes(capsys):
    cfg = str(CONFIGS / "llama-3-70b.json")
    rc = main(["estimate", "--model", cfg, "--gpu", "h100", "--max-model-len", "8192", "--tensor-parallel-size", "1,2,4", "--json"])
    points = json.loads(capsys.readouterr().out)["points"]
    assert rc == 0
    assert [p["settings"]["tensor_parallel_size"] for p in points] == [1, 2, 4]
    assert [p["verdict"]["status"] for p in points] == ["does_not_fit", "fits", "fits"]
    assert points[0]["verdict"]["reason"] == "no_kv_memory"
    assert [p["kv_bytes_per_token"] for p in points] == [327_680, 163_840, 81_920]


def test_corpus_aware_concurrency(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    model = tiny_model(tmp_path / "m")
    corpus = tmp_path / "c.jsonl"
    # 400 bytes -> 100 tokens + 28 = 128 tokens = 1 block; 1000 bytes -> 250 + 100 = 350 tokens = 3 blocks
    corpus.write_text(json.dumps({"prompt": "a" * 400, "max_tokens": 28}) + "\n" + json.dumps({"prompt": "b" * 1000, "max_tokens": 100}) + "\n")
    rc = main(["estimate", "--model", str(model), "--device", "cpu", "--kv-cache-memory-bytes", "2M", "--max-model-len", "1024",
               "--prompts", str(corpus), "--json"])  # fmt: skip
    c = json.loads(capsys.readouterr().out)["points"][0]["corpus"]
    assert rc == 0
    assert c["mean_blocks_per_request"] == 2.0
    assert c["concurrency"] == 31.5  # 63 usable blocks / 2
    assert c["token_counts"] == "estimated as UTF-8 bytes / 4"
    # Nothing shared: the prefix cache changes nothing.
    assert (c["concurrency_prefix_cache"], c["shared_prefix_blocks"]) == (31, 0)


def test_corpus_aware_concurrency_with_a_shared_prefix(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    model = tiny_model(tmp_path / "m")
    corpus = tmp_path / "c.jsonl"
    # 10 requests: 1024 bytes of shared system prompt (256 tokens = 2 CPU blocks of 128), then
    # 100 tokens of their own, and 28 out: 384 tokens = 3 blocks, 1 of its own.
    system = "s" * 1024
    corpus.write_text("".join(json.dumps({"prompt": system + f"{i:03d}" + "q" * 397, "max_tokens": 28}) + "\n" for i in range(10)))
    rc = main(["estimate", "--model", str(model), "--device", "cpu", "--kv-cache-memory-bytes", "2M", "--max-model-len", "1024",
               "--prompts", str(corpus)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    # 63 usable blocks: 21 requests of 3 blocks; 2 shared + 61 x 1 with the cache.
    assert "corpus-aware concurrency (estimate; estimated as UTF-8 bytes / 4): 21.00 (10 requests, 3.0 blocks each" in out
    assert "  with vLLM's prefix cache: 61 (2 shared prompt blocks held once, 1.0 blocks of its own a request)\n" in out


def test_errors_are_one_line(tmp_path, capsys):
    rc = main(["estimate", "--model", str(tmp_path), "--gpu", "h100"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == f"planner estimate: error: {tmp_path} has no config.json; --model takes a Hub name (org/name or org/name@revision), a local model folder (config.json plus safetensors) or a config.json\n"
    rc = main(["estimate", "--model", str(CONFIGS / "llama-3-8b.json"), "--gpu", "v100"])
    assert rc == 2
    assert "--gpu 'v100' is not in the catalogue; known: l4 (NVIDIA L4 24 GB); a10g" in capsys.readouterr().err
    rc = main(["estimate", "--model", str(CONFIGS / "llama-3-8b.json")])
    assert "needs the GPU's memory: give --gpu NAME or --gpu-memory-gib N" in capsys.readouterr().err
