"""Reading vLLM's argument lists (planner.vllm_args) and keeping the API key secret."""

from __future__ import annotations

import pytest

from planner.errors import LaunchError
from planner.sweep.config import ServerSection
from planner.vllm_args import flag_int, has_flag, take_api_key


def test_has_flag_in_every_form():
    args = ["--enforce-eager", "--max-num-seqs", "8", "--block-size=32"]
    assert has_flag(args, "--enforce-eager") and has_flag(args, "--max-num-seqs") and has_flag(args, "--block-size")
    assert has_flag(["-tp", "2"], "--tensor-parallel-size", "-tp")
    assert not has_flag(args, "--max-num") and not has_flag(["--block-sizes=1"], "--block-size")


def test_flag_int_takes_the_first_value():
    assert flag_int(["--block-size", "32", "--block-size=64"], "--block-size") == 32
    assert flag_int(["--block-size=64"], "--block-size") == 64
    assert flag_int(["--block-size", "big"], "--block-size") is None
    assert flag_int(["--block-size"], "--block-size") is None


def test_take_api_key_removes_it_from_the_arguments():
    assert take_api_key(["--a", "--api-key", "k1", "--b"]) == (["--a", "--b"], "k1")
    assert take_api_key(["--api-key=k2"]) == ([], "k2")
    with pytest.raises(LaunchError, match="--api-key has no value"):
        take_api_key(["--api-key"])


def test_the_api_key_setting_never_shows_in_a_repr():
    server = ServerSection(model="m", api_key="s3cret")
    assert "s3cret" not in repr(server) and "s3cret" not in str(server.model_dump())
    assert server.api_key is not None and server.api_key.get_secret_value() == "s3cret"
