"""`planner estimate --model org/name` against a local server that answers as the Hub does
(HF_ENDPOINT) and a Hub cache laid out as huggingface_hub lays it out; no network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.fake_hub import FakeHub, Repo, commit_of, llama_tensors, serve, sharded, write_cached_repo

FIXTURES = Path(__file__).parent.parent / "fixtures" / "model_configs"
CONFIG = (FIXTURES / "llama-3-8b.json").read_bytes()
TENSORS = llama_tensors(json.loads(CONFIG))
SHARDS, INDEX = sharded(TENSORS, 4)
WEIGHT_BYTES = sum(f.data_bytes for f in SHARDS.values())
MAIN = commit_of("main")
V1 = commit_of("v1")


@pytest.fixture(scope="module")
def hub():
    fake = FakeHub(
        repos={
            "meta-llama/Llama-3.1-8B-Instruct": Repo(
                files={"config.json": CONFIG, "model.safetensors.index.json": INDEX, **SHARDS},
                revisions={"main": MAIN, "v1": V1},
            ),
            "meta-llama/Gated-8B": Repo(files={"config.json": CONFIG}, revisions={"main": MAIN}, gated=True),
            "org/config-only": Repo(files={"config.json": CONFIG}, revisions={"main": MAIN}),
        }
    )
    server, _ = serve(fake)
    yield fake
    server.shutdown()
    server.server_close()


def planner(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PLANNER_"))}
    return subprocess.run(
        [sys.executable, "-m", "planner", "estimate", *args], env={**base, **env}, capture_output=True, text=True, timeout=60
    )


def hub_env(hub: FakeHub, home: Path, **extra: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1", **extra}


def test_a_hub_name_is_sized_from_ranged_header_reads_without_weight_bytes(hub, tmp_path):
    hub.served.clear()
    out = planner(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--json"], hub_env(hub, tmp_path))
    assert out.returncode == 0, out.stderr
    point = json.loads(out.stdout)["points"][0]
    assert point["model"]["path"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert point["model"]["revision"] == MAIN
    w = point["weights"]
    assert (w["source"], w["read_from"], w["files"], w["tensors"]) == ("safetensors", "Hub headers", 4, len(TENSORS))
    assert w["total_bytes"] == WEIGHT_BYTES
    # Every shard's header was read, and not one byte after it.
    assert {name for _, name, _, _ in hub.served} == set(SHARDS)
    assert hub.weight_bytes_served() == 0
    # The small files went into the cache as huggingface_hub lays it out.
    snapshot = tmp_path / "hub" / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / MAIN
    assert sorted(p.name for p in snapshot.iterdir()) == ["config.json", "model.safetensors.index.json"]
    assert (snapshot.parent.parent / "refs" / "main").read_text() == MAIN


def test_a_revision_after_the_name_is_read_at_its_commit(hub, tmp_path):
    out = planner(["--model", "meta-llama/Llama-3.1-8B-Instruct@v1", "--gpu", "NVIDIA H100 80GB HBM3"], hub_env(hub, tmp_path))
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith(f"meta-llama/Llama-3.1-8B-Instruct@v1 at {V1[:12]} (llama), tensor-parallel 1 on h100-80gb")
    assert "exact: 291 tensors in 4 safetensors file(s), Hub headers" in out.stdout


@pytest.mark.parametrize(
    ("model", "token", "line"),
    [
        (
            "org/no-such-model", None,
            "org/no-such-model: no such model on the Hub, or no access to it (HTTP 401): check the name; "
            "if the model is private or gated, set HF_TOKEN to a token that can read it",
        ),
        (
            "meta-llama/Gated-8B", None,
            "meta-llama/Gated-8B is a gated model (HTTP 401): accept its licence on the model's Hub page, "
            "then set HF_TOKEN to a token of that account",
        ),
        (
            "meta-llama/Gated-8B", "hf_test",
            "meta-llama/Gated-8B is a gated model (HTTP 403): accept its licence on the model's Hub page, "
            "then set HF_TOKEN to a token of that account",
        ),
        (
            "meta-llama/Llama-3.1-8B-Instruct@v9", None,
            "meta-llama/Llama-3.1-8B-Instruct@v9: the Hub has no such revision (HTTP 404); give a branch, tag or commit after '@'",
        ),
    ],
)  # fmt: skip
def test_hub_errors_are_one_line_saying_which_model_why_and_what_to_do(hub, tmp_path, model, token, line):
    env = hub_env(hub, tmp_path, **({"HF_TOKEN": token} if token else {}))
    out = planner(["--model", model, "--gpu", "H100"], env)
    assert (out.returncode, out.stderr) == (2, f"planner estimate: error: {line}\n")


def test_offline_reads_the_cache_only(hub, tmp_path):
    # Safetensors files in the cache are header-only here: only their headers are read.
    cache = tmp_path / "hub"
    write_cached_repo(cache, "meta-llama/Llama-3.1-8B-Instruct", {
        "config.json": CONFIG, "model.safetensors.index.json": INDEX, **{n: f.head for n, f in SHARDS.items()},
    }, MAIN)  # fmt: skip
    write_cached_repo(cache, "org/config-only", {"config.json": CONFIG}, MAIN)
    hub.requests.clear()
    # The endpoint is the fake Hub, so a request would be seen: offline mode makes none.
    env = hub_env(hub, tmp_path, HF_HUB_OFFLINE="1")
    out = planner(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h100-sxm", "--json"], env)
    assert out.returncode == 0, out.stderr
    point = json.loads(out.stdout)["points"][0]
    assert (point["model"]["revision"], point["weights"]["read_from"], point["weights"]["total_bytes"]) == (MAIN, "Hub cache", WEIGHT_BYTES)

    out = planner(["--model", "org/config-only", "--gpu", "h100"], env)
    assert out.returncode == 0, out.stderr
    assert "note: weights: parameter count from config.json x dtype bytes (HF_HUB_OFFLINE=1 and the safetensors index is not in the Hub cache)" in out.stdout

    out = planner(["--model", "org/not-cached", "--gpu", "h100"], env)
    assert out.returncode == 2
    assert out.stderr.startswith(
        f"planner estimate: error: org/not-cached: config.json is not in the Hub cache ({tmp_path / 'hub'}) and HF_HUB_OFFLINE=1 is set; "
        "fetch it once with `hf download org/not-cached config.json` or unset HF_HUB_OFFLINE"
    )
    assert hub.requests == []
