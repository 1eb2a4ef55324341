"""Builds a tiny random-weight Llama and a byte-level BPE tokenizer that real vLLM can serve.

No model can be downloaded where the demo and the e2e tests run, and vLLM's CPU build is slow,
so the model is as small as vLLM allows while keeping the KV sizing easy to check by hand:

    KV bytes per token = layers x 2 (K and V) x kv_heads x head_dim x dtype bytes
                       = 2 x 2 x 1 x 32 x 2 (bf16) = 256 bytes

head_dim is 32 because vLLM's CPU attention supports no smaller head (0.32 accepts 32, 64, 80,
96, 112, 128, ...; a head of 16 starts but fails on the first request with "Unsupported CPU
attention configuration"), and one KV head keeps the per-token figure at 256 bytes.

so `--kv-cache-memory-bytes 2M` is a pool of 8,192 tokens (64 blocks of 128 on CPU), small enough
that a handful of long requests fill it. max_position_embeddings is 131072: this tokenizer is
small, so prompts/prod.jsonl's longest requests take about 11,000 tokens here, and a sweep's
max_model_len axis needs room above that to show a value whose KV need no pool of the demo meets.

This file runs inside vLLM's own environment (`.venv-vllm/bin/python scripts/tinymodel.py --out
DIR`, which scripts/build-tiny-model.sh runs), where the planner is not installed: the module
level imports only the standard library and it imports no planner module. torch, transformers and tokenizers are
imported inside the functions that need them.

A finished folder holds build-info.json, written last. A second run with the same build
parameters finds it, checks the files it lists, and returns without rebuilding.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Bump when the output changes for the same parameters (file layout, tokenizer settings, ...),
# so folders built by an older builder are rebuilt.
BUILDER_VERSION = 1

BUILD_INFO = "build-info.json"

DEFAULT_PARAMS: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 131072,
    "dtype": "bfloat16",
    "seed": 0,
}

# vllm/v1/attention/backends/cpu_attn.py, get_supported_head_sizes() in 0.32.
CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, PAD, *ROLE_TOKENS)

# Roles other than system/user/assistant still render (as plain text between the markers), so a
# corpus with a "tool" turn does not fail at the template.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}\n{% endif %}"
)

# The tokenizer's training text, embedded so that the model is the same wherever it is built and
# does not depend on any corpus in the repository. Mixed prose, chat, code and numbers, so the
# merges cover what prompts look like and a prompt's token count is in a plausible range.
TRAINING_TEXT = """\
The capacity planner starts a server, waits until it is healthy, and sends requests at a steady
concurrency. Each request streams its answer back one token at a time. The time to the first token
tells us how long the prompt waited and how long the prefill took; the time between tokens tells us
how busy the decoder is. When the cache is full, new requests wait in the queue, and sometimes a
running request is preempted and must start again. That is why the planner watches the queue, the
cache usage and the number of preemptions while it measures latency.

User: Can you summarise the meeting notes from Tuesday in three bullet points?
Assistant: Sure. First, the team agreed to move the release to the second week of the month.
Second, the load tests showed that latency stays under the target up to sixty concurrent users.
Third, the on-call rotation will change next quarter, and everyone should check the new schedule.

User: What is the difference between throughput and latency?
Assistant: Throughput is how much work the system finishes per second, for example tokens per
second across all requests. Latency is how long one request takes from start to finish. A server
can have high throughput and poor latency at the same time when many requests share the hardware.

def percentile(values, q):
    ordered = sorted(values)
    if not ordered:
        return None
    index = (len(ordered) - 1) * q / 100.0
    low = int(index)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (index - low)

for step in range(1, 65):
    result = run_step(concurrency=step, window_s=30.0, warmup_requests=8)
    if result.ttft_ms.p95 > 2000 or result.itl_ms.p95 > 100:
        break

{"model": "tiny-llama", "prompt": "Write a haiku about autumn rain.", "max_tokens": 128,
 "temperature": 0.7, "stream": true, "stream_options": {"include_usage": true}}

Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096 8192 0.5 0.95 0.99 99.9%
Dates and times: 2024-01-15 09:30:00, 12 March, Monday, Friday, 3 pm, 18:45, UTC.

Once upon a time, in a small town by the sea, there lived an old clockmaker who repaired every clock
in the valley. Children brought him broken music boxes, and sailors brought him compasses that no
longer pointed north. He worked slowly and carefully, and he never charged more than a loaf of
bread. One winter night a stranger knocked at his door with a watch that ran backwards.

Question: A train leaves the station at 8 am travelling at 60 km per hour. Another train leaves the
same station at 9 am travelling at 90 km per hour on the same track. When does the second train
catch up with the first? Answer: The first train has a 60 km lead. The second train gains 30 km
every hour, so it catches up after two hours, at 11 am, 180 km from the station.

Translate to French: Good morning, how are you today? Bonjour, comment allez-vous aujourd'hui ?
Translate to German: The weather is nice and the coffee is hot. Das Wetter ist schön und der Kaffee
ist heiß. Translate to Spanish: Where is the train station? ¿Dónde está la estación de tren?

SELECT user_id, COUNT(*) AS orders, SUM(total) AS revenue FROM orders WHERE created_at >= '2024-01-01'
GROUP BY user_id HAVING COUNT(*) > 3 ORDER BY revenue DESC LIMIT 10;

Please review the following function and explain any bugs you find, then suggest a fix and a test
that would have caught the problem. Keep the answer short and focus on correctness first.
"""

REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


class TinyModelError(Exception):
    """A tiny model cannot be built where asked (the folder holds something else, ...)."""


def build_params(**overrides: Any) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(DEFAULT_PARAMS))
    if unknown:
        raise TinyModelError(f"unknown build parameter(s) {unknown}; valid: {sorted(DEFAULT_PARAMS)}")
    params = {**DEFAULT_PARAMS, **overrides}
    if params["num_attention_heads"] % params["num_key_value_heads"]:
        raise TinyModelError(
            f"num_attention_heads ({params['num_attention_heads']}) must be a multiple of "
            f"num_key_value_heads ({params['num_key_value_heads']})"
        )
    if params["head_dim"] not in CPU_ATTENTION_HEAD_SIZES:
        raise TinyModelError(
            f"head_dim {params['head_dim']} is not served by vLLM's CPU attention; "
            f"valid: {', '.join(map(str, CPU_ATTENTION_HEAD_SIZES))}"
        )
    if params["dtype"] not in ("bfloat16", "float16", "float32"):
        raise TinyModelError(f"dtype {params['dtype']!r} is not one of bfloat16, float16, float32")
    return params


def kv_bytes_per_token(params: dict[str, Any]) -> int:
    """Bytes of KV cache one token takes across all layers (K and V)."""
    dtype_bytes = {"bfloat16": 2, "float16": 2, "float32": 4}[params["dtype"]]
    return (
        params["num_hidden_layers"] * 2 * params["num_key_value_heads"] * params["head_dim"] * dtype_bytes
    )


def is_built(out: Path, params: dict[str, Any]) -> bool:
    """True when `out` holds a complete model built by this builder version with `params`."""
    try:
        info = json.loads((out / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return False
    if info.get("builder_version") != BUILDER_VERSION or info.get("params") != params:
        return False
    files = info.get("files")
    if not isinstance(files, dict) or not set(REQUIRED_FILES) <= set(files):
        return False
    for name, size in files.items():
        path = out / name
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def ensure_built(
    out: Path, params: dict[str, Any] | None = None, *, force: bool = False
) -> tuple[bool, dict[str, Any]]:
    """Builds the model into `out` unless it is already there (or `force`). Returns (built_now, build_info)."""
    params = params if params is not None else build_params()
    out = Path(out)
    if not force and is_built(out, params):
        return False, json.loads((out / BUILD_INFO).read_text())
    if out.exists() and not out.is_dir():
        raise TinyModelError(f"{out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / BUILD_INFO).exists():
        # A folder without our build-info is someone else's; never delete it.
        raise TinyModelError(
            f"{out}: folder is not empty and holds no {BUILD_INFO}; choose an empty or new folder"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and swap it in at the end, so an interrupted build never leaves a
    # folder that looks complete.
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        info = _build_into(staging, params)
        if _swap_in(staging, out, params, force=force):
            return True, info
        return False, json.loads((out / BUILD_INFO).read_text())
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap_in(staging: Path, out: Path, params: dict[str, Any], *, force: bool) -> bool:
    """Moves the finished build to `out`; False when another builder got there first.

    `make test` and `make demo` may build the same folder at once. The old folder is renamed
    aside before it is deleted, so a reader never sees it half removed.
    """
    if not force and is_built(out, params):
        return False
    if out.exists():
        stale = Path(tempfile.mkdtemp(prefix=f".{out.name}.stale-", dir=out.parent))
        try:
            os.replace(out, stale / out.name)
        except FileNotFoundError:
            pass  # another builder moved it first
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.replace(staging, out)
    except OSError:
        # Another builder's folder landed between the rename and ours: keep it if it is complete.
        if is_built(out, params):
            return False
        raise
    return True


def _build_into(folder: Path, params: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    tokenizer = _train_tokenizer(params["vocab_size"])
    tokenizer.save_pretrained(folder)
    _make_tokenizer_config_portable(folder)
    _save_model(folder, params, bos_id=tokenizer.bos_token_id, eos_id=tokenizer.eos_token_id,
                pad_id=tokenizer.pad_token_id)
    # mkdtemp makes the staging folder private and safetensors writes 0600 files; a container
    # running vLLM as another user must still read the model.
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)
    files = {
        path.name: path.stat().st_size for path in sorted(folder.iterdir()) if path.is_file()
    }
    info = {
        "builder": "scripts/tinymodel.py",
        "builder_version": BUILDER_VERSION,
        "params": params,
        "kv_bytes_per_token": kv_bytes_per_token(params),
        "weights_sha256": _sha256(folder / "model.safetensors"),
        "files": files,
        "build_s": round(time.perf_counter() - started, 3),
    }
    (folder / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info


def _train_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        # Every byte is in the vocabulary, so any text (any language, any emoji) tokenizes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAINING_TEXT.splitlines(keepends=True), trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise TinyModelError(
            f"the embedded training text yields {tok.get_vocab_size()} tokens, not vocab_size "
            f"{vocab_size}; choose a vocab_size of at most {tok.get_vocab_size()}"
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS),
        chat_template=CHAT_TEMPLATE,
        model_max_length=DEFAULT_PARAMS["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def _make_tokenizer_config_portable(folder: Path) -> None:
    # transformers 5 names the class TokenizersBackend and puts the template in its own file;
    # older transformers (a GPU box's vLLM may pin one) know only PreTrainedTokenizerFast and read
    # the template from tokenizer_config.json. Both versions load this form.
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "chat_template.jinja").unlink(missing_ok=True)


def _save_model(folder: Path, params: dict[str, Any], *, bos_id: int, eos_id: int, pad_id: int) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, params["dtype"])
    config = LlamaConfig(
        vocab_size=params["vocab_size"],
        hidden_size=params["hidden_size"],
        intermediate_size=params["intermediate_size"],
        num_hidden_layers=params["num_hidden_layers"],
        num_attention_heads=params["num_attention_heads"],
        num_key_value_heads=params["num_key_value_heads"],
        head_dim=params["head_dim"],
        max_position_embeddings=params["max_position_embeddings"],
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype=params["dtype"],
    )
    torch.manual_seed(params["seed"])
    # Initialise in float32 on the CPU and cast afterwards, so the weights are the same whatever
    # the default dtype or device of the environment.
    with torch.device("cpu"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype).eval()
    model.save_pretrained(folder, safe_serialization=True)
    GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id).save_pretrained(folder)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tinymodel",
        description="Build (or reuse) a tiny random-weight Llama with a BPE tokenizer for vLLM.",
    )
    parser.add_argument("--out", required=True, type=Path, help="folder to build into")
    parser.add_argument("--seed", type=int, default=DEFAULT_PARAMS["seed"], help="weight seed (default 0)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a complete build is there")
    args = parser.parse_args(argv)
    try:
        params = build_params(seed=args.seed)
        built, info = ensure_built(args.out, params, force=args.force)
    except TinyModelError as exc:
        print(f"tinymodel: error: {exc}", file=sys.stderr)
        return 2
    verb = "built" if built else "reusing"
    print(
        f"tinymodel: {verb} {args.out} ({info['kv_bytes_per_token']} KV bytes/token, "
        f"weights sha256 {info['weights_sha256'][:12]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
