"""The unit tier's Hub: an offline Hub cache built from tests/fixtures/model_configs and
header-only safetensors (no weights), as huggingface_hub lays it out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from huggingface_hub import constants

from planner.estimate.model_source import resolve_model
from tests.fakes.fake_hub import commit_of, write_hub_cache

CONFIGS = Path(__file__).parent.parent / "fixtures" / "model_configs"

# Hub name -> (config fixture, safetensors shards written as header-only files, or 0 for config.json only).
MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": ("llama-3.1-8b-instruct.json", 4),
    "meta-llama/Llama-3.1-70B-Instruct": ("llama-3.1-70b-instruct.json", 30),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ("mixtral-8x7b-v0.1.json", 19),
    # A model cached without its safetensors index: weights from the parameter count.
    "org/config-only": ("llama-3.1-8b-instruct.json", 0),
}


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf") / "hub"
    write_hub_cache(cache, {repo: ((CONFIGS / fixture).read_bytes(), shards) for repo, (fixture, shards) in MODELS.items()}, commit_of("main"))
    return cache


@pytest.fixture
def offline_hub(hub_cache, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv("PLANNER_GPU", raising=False)
    for key in [k for k in os.environ if k.startswith("PLANNER_") and "__" in k]:
        monkeypatch.delenv(key)
    # Models are resolved once per process; a test must not see another's cache.
    resolve_model.cache_clear()
    yield hub_cache
    resolve_model.cache_clear()


