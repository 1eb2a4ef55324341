from pathlib import Path

from planner.launcher import VllmServer


def child_env(tmp_path: Path, args, env=None):
    server = VllmServer(["vllm", "serve"], model="m", log_path=tmp_path / "server.log", args=args, env=env)
    return server._child_env()


def test_kv_cache_space_from_the_shell_does_not_override_the_points_pool(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert "VLLM_CPU_KVCACHE_SPACE" not in child_env(tmp_path, ["--kv-cache-memory-bytes", "2M"])
    assert "VLLM_CPU_KVCACHE_SPACE" not in child_env(tmp_path, ["--kv-cache-memory-bytes=2M"])
    # without the flag, or asked for in the point's own environment, it stays
    assert child_env(tmp_path, ["--max-model-len", "2048"])["VLLM_CPU_KVCACHE_SPACE"] == "1"
    env = child_env(tmp_path, ["--kv-cache-memory-bytes", "2M"], env={"VLLM_CPU_KVCACHE_SPACE": "2"})
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_api_key_travels_in_the_environment_only(tmp_path):
    server = VllmServer(["vllm", "serve"], model="m", log_path=tmp_path / "l", args=["--api-key", "k3y"])
    assert server._child_env()["VLLM_API_KEY"] == "k3y"
    assert "k3y" not in " ".join(server.command_for_record)
