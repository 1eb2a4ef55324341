import pytest

from planner.errors import ConfigError
from planner.estimate import Verdict
from planner.sweep.config import load_settings, public_settings
from planner.sweep.grid import expand, fingerprint
from planner.sweep.predict import should_skip
from planner.vllm_args import fixed_flags

BASE = """
prompts = "prompts/prod.jsonl"

[server]
command = ["python", "-m", "vllm.entrypoints.openai.api_server"]
model = "./models/tiny"
args = ["--enforce-eager"]
api_key = "s3cret"

[grid]
max_model_len = [2048, 4096]
gpu_memory_utilization = [0.9]
[grid.extra]
kv_cache_memory_bytes = ["1M", "4M"]
enable_prefix_caching = [false]
[grid.env]
VLLM_CPU_OMP_THREADS_BIND = ["all"]

[replay]
min_requests = 50

[slo]
ttft_p99_ms = 800
headroom = 0.2

[gpus]
devices = "none"
"""


def write(tmp_path, text):
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def test_load_expand_and_relative_model_path(tmp_path):
    settings = load_settings(write(tmp_path, BASE))
    assert settings.server.model == str((tmp_path / "models" / "tiny").resolve())
    assert settings.replay.min_requests == 50
    assert settings.slo.headroom == 0.2 and settings.slo.rules() == {"ttft_p99_ms": 800.0}
    points = expand(settings)
    assert [p.id for p in points] == [
        "01-mml2048-kv_cache_memory_bytes1M",
        "02-mml2048-kv_cache_memory_bytes4M",
        "03-mml4096-kv_cache_memory_bytes1M",
        "04-mml4096-kv_cache_memory_bytes4M",
    ]
    assert points[1].flags == [
        "--max-model-len", "2048", "--gpu-memory-utilization", "0.9",
        "--kv-cache-memory-bytes", "4M", "--no-enable-prefix-caching",
    ]
    assert points[0].env == {"VLLM_CPU_OMP_THREADS_BIND": "all"}
    assert points[0].config["env"] == {"VLLM_CPU_OMP_THREADS_BIND": "all"}
    assert points[0].gpus == 1


def test_unknown_key_names_the_key_its_line_and_the_valid_ones(tmp_path):
    path = write(tmp_path, BASE.replace("min_requests = 50", "min_requests = 50\nmin_request = 5"))
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    msg = str(err.value)
    line = BASE.replace("min_requests = 50", "min_requests = 50\nmin_request = 5").splitlines().index("min_request = 5") + 1
    assert f"{path}:{line}: unknown key 'replay.min_request' in [replay]; valid keys: " in msg
    assert "min_requests" in msg and "warmup_requests" in msg


def test_unknown_table(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'grids' in \[\(top level\)\]; valid keys: cost, cpus, estimate, executor, gpus, grid"):
        load_settings(write(tmp_path, BASE + "\n[grids]\nx = 1\n"))


def test_bad_values_and_slos_are_explained(tmp_path):
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization 1.5 is not a fraction"):
        load_settings(write(tmp_path, BASE.replace("[0.9]", "[1.5]")))
    with pytest.raises(ConfigError, match=r"unknown SLO 'ttft_p98_ms'"):
        load_settings(write(tmp_path, BASE.replace("ttft_p99_ms = 800", "ttft_p98_ms = 800")))
    with pytest.raises(ConfigError, match=r"--port is set by the planner"):
        load_settings(write(tmp_path, BASE.replace('args = ["--enforce-eager"]', 'args = ["--port", "1"]')))
    with pytest.raises(ConfigError, match=r"server.model is required"):
        load_settings(write(tmp_path, BASE.replace('model = "./models/tiny"\n', "")))
    with pytest.raises(ConfigError, match=r"not valid TOML"):
        load_settings(write(tmp_path, "[server\n"))
    with pytest.raises(ConfigError, match=r"no such file"):
        load_settings(tmp_path / "missing.toml")


def test_environment_then_flags_override_the_file(tmp_path, monkeypatch):
    path = write(tmp_path, BASE)
    monkeypatch.setenv("PLANNER_SLO__HEADROOM", "0.3")
    monkeypatch.setenv("PLANNER_REPLAY__MIN_REQUESTS", "70")
    settings = load_settings(path)
    assert settings.slo.headroom == 0.3 and settings.replay.min_requests == 70
    assert settings.slo.rules() == {"ttft_p99_ms": 800.0}
    settings = load_settings(path, {"slo": {"headroom": 0.05}})
    assert settings.slo.headroom == 0.05


def test_secrets_never_reach_the_saved_settings(tmp_path):
    text = BASE.replace("[grid]", '[server.env]\nHF_TOKEN = "hf_abc"\nOMP_NUM_THREADS = "2"\n\n[grid]')
    saved = public_settings(load_settings(write(tmp_path, text)))
    assert saved["server"]["api_key"] == "***"
    assert saved["server"]["env"] == {"HF_TOKEN": "***", "OMP_NUM_THREADS": "2"}
    assert "s3cret" not in repr(saved) and "hf_abc" not in repr(saved)


def test_fingerprint_changes_with_what_the_result_depends_on(tmp_path):
    settings = load_settings(write(tmp_path, BASE))
    point = expand(settings)[0]
    fp = fingerprint(settings, point, corpus_sha256="a" * 64, vllm_version="0.32.0")
    assert fp == fingerprint(settings, point, corpus_sha256="a" * 64, vllm_version="0.32.0")
    assert fp != fingerprint(settings, point, corpus_sha256="b" * 64, vllm_version="0.32.0")
    assert fp != fingerprint(settings, point, corpus_sha256="a" * 64, vllm_version="0.33.0")
    assert fp != fingerprint(settings, expand(settings)[1], corpus_sha256="a" * 64, vllm_version="0.32.0")
    other = load_settings(write(tmp_path, BASE.replace("ttft_p99_ms = 800", "ttft_p99_ms = 900")))
    assert fp != fingerprint(other, expand(other)[0], corpus_sha256="a" * 64, vllm_version="0.32.0")


def test_tensor_parallel_points_need_that_many_gpus(tmp_path):
    settings = load_settings(write(tmp_path, BASE.replace("[grid]", "[grid]\ntensor_parallel_size = [1, 4]")))
    assert sorted({p.gpus for p in expand(settings)}) == [1, 4]


def test_fixed_flags_and_skip_rule():
    assert fixed_flags(["--enforce-eager", "--max-num-seqs", "8", "--dtype=bfloat16"]) == {
        "enforce_eager": True, "max_num_seqs": "8", "dtype": "bfloat16",
    }
    verdict = {"status": "does_not_fit", "clear_margin": True, "reason": "kv_too_small", "message": "m",
               "largest_fitting_max_model_len": 896}
    assert should_skip(Verdict(**verdict), prune=True) == "kv_too_small: m; the largest max_model_len that fits is 896"
    assert should_skip(Verdict(**verdict), prune=False) is None
    assert should_skip(Verdict(**{**verdict, "clear_margin": False}), prune=True) is None
    assert should_skip(Verdict(**{**verdict, "message": None}), prune=True) == (
        "kv_too_small; the largest max_model_len that fits is 896"
    )


def test_dry_run_prints_the_grid_and_every_command_without_secrets(tmp_path, capsys):
    from planner.cli import main

    assert main(["sweep", "--config", str(write(tmp_path, BASE)), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    model = str((tmp_path / "models" / "tiny").resolve())
    assert out[0] == "4 points; server command: python -m vllm.entrypoints.openai.api_server"
    assert out[1] == (
        "01-mml2048-kv_cache_memory_bytes1M: VLLM_CPU_OMP_THREADS_BIND=all python -m vllm.entrypoints.openai.api_server"
        f" --model {model} --host 127.0.0.1 --port '<free port>' --enforce-eager --max-model-len 2048"
        " --gpu-memory-utilization 0.9 --kv-cache-memory-bytes 1M --no-enable-prefix-caching"
    )
    # Each command is followed by the point's expected duration: unknown without a previous run
    # or --request-duration-s.
    assert out[2] == "  expected duration unknown (give --request-duration-s, or run once into this output folder)"
    # Then the speed classes, the strategy (adaptive by default) and its plan: each point's class and
    # bound, in launch order (planner.sweep.dry_run).
    assert out[9:11] == [
        "speed classes: 1 (points that differ only in [sweep] memory_only_flags: gpu_memory_utilization,"
        " kv_cache_memory_bytes, max_model_len, num_gpu_blocks_override, max_num_seqs)",
        "  c1: every point: 4 points",
    ]
    assert out[11].startswith("strategy: adaptive: highest bound per GPU first;")
    assert out[12] == "plan, in launch order:"
    assert out[13] == (
        "  02-mml2048-kv_cache_memory_bytes4M: class c1, upper bound unknown before start-up: read from the server at"
        " start-up (give --request-duration-s for the estimate's)"
    )
    assert out[17] == "expected total: unknown (no point's duration is known; give --request-duration-s)"
    assert len(out) == 18
    assert "s3cret" not in "\n".join(out)
    # Exhaustive: every point, in grid order.
    assert main(["sweep", "--config", str(write(tmp_path, BASE + '\n[sweep]\nstrategy = "exhaustive"\n')), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[11] == "strategy: exhaustive: every point is searched in full, in grid order ([sweep] strategy)"
    assert out[12].startswith("  01-mml2048-kv_cache_memory_bytes1M: class c1,")
    assert len(out) == 17


@pytest.mark.parametrize("path", ["examples/cpu-demo.toml", "examples/cpu-adaptive.toml", "examples/cpu-adaptive-verify.toml", "docker/sweep.toml"])
def test_shipped_sweep_configs_are_valid(path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    settings = load_settings(root / path)
    assert expand(settings), f"{path} expands to no point"


def test_cpu_demo_grid_has_the_promised_points():
    from pathlib import Path

    settings = load_settings(Path(__file__).resolve().parents[2] / "examples/cpu-demo.toml")
    points = expand(settings)
    assert len(points) == 4
    assert settings.server.command[1:] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" in settings.server.args
    assert len(settings.grid.extra["kv_cache_memory_bytes"]) >= 2
    assert settings.prompts.endswith("prompts/prod.jsonl")


def test_api_key_in_server_args_is_redacted_in_saved_settings_and_dry_run(tmp_path, capsys):
    from planner.cli import main

    path = write(tmp_path, BASE.replace('args = ["--enforce-eager"]', 'args = ["--enforce-eager", "--api-key", "SECRET123"]'))
    saved = public_settings(load_settings(path))
    assert "SECRET123" not in repr(saved)
    assert main(["sweep", "--config", str(path), "--dry-run"]) == 0
    assert "SECRET123" not in capsys.readouterr().out


@pytest.mark.parametrize("args", ['["--tensor-parallel-size", "2"]', '["-tp", "2"]', '["--pipeline-parallel-size=2"]'])
def test_parallelism_belongs_in_the_grid_so_gpus_are_counted(tmp_path, args):
    with pytest.raises(ConfigError, match=r"decides how many GPUs a point takes; set it in \[grid\]"):
        load_settings(write(tmp_path, BASE.replace('args = ["--enforce-eager"]', f"args = {args}")))


def test_sweep_replay_table_rejects_planned_loads(tmp_path):
    with pytest.raises(ConfigError, match=r"\[replay\] concurrency, find_max: a sweep searches every point itself"):
        load_settings(write(tmp_path, BASE.replace("min_requests = 50", "min_requests = 50\nconcurrency = [4]\nfind_max = true")))


def test_server_view_slos_in_the_slo_table(tmp_path):
    text = BASE.replace("ttft_p99_ms = 800", "ttft_p99_ms = 800\nserver_ttft_p99_ms = 500\nserver_queue_p99_ms = 250")
    assert load_settings(write(tmp_path, text)).slo.rules() == {
        "ttft_p99_ms": 800.0, "server_ttft_p99_ms": 500.0, "server_queue_p99_ms": 250.0,
    }
    with pytest.raises(ConfigError, match=r"keep no maximum"):
        load_settings(write(tmp_path, BASE.replace("ttft_p99_ms = 800", "server_ttft_max_ms = 800")))


def test_executor_table_is_strict_and_explained(tmp_path):
    path = write(tmp_path, BASE + """
[executor]
kind = "slurm"
address = "head"
max_retries = -1
retries = 2
[executor.node_selector]
resources = { nvlink = 0 }
""")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    text = str(err.value)
    lines = BASE.count("\n")
    assert f"sweep.toml:{lines + 3}: executor.kind: Input should be 'local' or 'ray' (got 'slurm')" in text
    assert f"sweep.toml:{lines + 4}: executor.address: 'head' is not a Ray address" in text
    assert f"sweep.toml:{lines + 5}: executor.max_retries" in text
    assert f"sweep.toml:{lines + 6}: unknown key 'executor.retries' in [executor]; valid keys: address," in text
    assert "executor.node_selector.resources: resource 'nvlink': amount 0 must be > 0" in text


def test_executor_from_the_file_the_environment_and_the_flag(tmp_path, monkeypatch):
    from planner.cli import build_parser
    from planner.commands.sweep import overrides_from_args

    path = write(tmp_path, BASE + '\n[executor]\nkind = "local"\naddress = "ray://head:10001"\n[executor.node_selector]\ngpu_type = "H100"\n')
    settings = load_settings(path)
    assert settings.executor.kind == "local" and settings.executor.max_retries == 1
    assert settings.executor.node_selector.gpu_type == "H100"
    monkeypatch.setenv("PLANNER_EXECUTOR__KIND", "ray")
    assert load_settings(path).executor.kind == "ray"
    monkeypatch.setenv("PLANNER_EXECUTOR__KIND", "local")
    args = build_parser().parse_args(["sweep", "--config", str(path), "--executor", "ray"])
    settings = load_settings(path, overrides_from_args(args))
    assert settings.executor.kind == "ray"
    assert settings.executor.address == "ray://head:10001", "the flag sets the kind and keeps the file's other keys"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ('["--nnodes", "2"]', r"--nnodes decides how many nodes a point spans; set it in \[grid.extra\] \(nnodes = \[N\]\)"),
        ('["-n=2"]', r"--nnodes decides how many nodes"),
        ('["--node-rank", "1"]', r"--node-rank is set by the planner on each node of a multi-node point"),
        ('["--master-addr=10.0.0.1"]', r"--master-addr is set by the planner"),
        ('["--headless"]', r"--headless is set by the planner"),
    ],
)
def test_multi_node_flags_belong_to_the_grid_or_the_planner(tmp_path, args, says):
    with pytest.raises(ConfigError, match=says):
        load_settings(write(tmp_path, BASE.replace('args = ["--enforce-eager"]', f"args = {args}")))


def test_a_point_across_nodes_splits_its_gpus_evenly(tmp_path):
    grid = BASE.replace('enable_prefix_caching = [false]', "nnodes = [1, 2]").replace(
        "gpu_memory_utilization = [0.9]", "gpu_memory_utilization = [0.9]\ntensor_parallel_size = [4]"
    )
    points = expand(load_settings(write(tmp_path, grid)))
    assert {(p.nnodes, p.gpus, p.gpus_per_node) for p in points} == {(1, 4, 4), (2, 4, 2)}
    assert ["--nnodes", "2"] == [f for p in points if p.nnodes == 2 for f in p.flags][-2:]

    uneven = grid.replace("nnodes = [1, 2]", "nnodes = [3]")
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, uneven))
    line = uneven.splitlines().index("[grid]") + 1
    assert (
        f"sweep.toml:{line}: grid: [grid.extra] nnodes 3 does not divide the 4 GPUs of tensor_parallel_size 4 x"
        " pipeline_parallel_size 1: vLLM puts the same number on each node; nnodes can be 1, 2, 4"
    ) in str(err.value)
    # The tensor parallel size counts wherever the grid gives it.
    in_extra = uneven.replace("tensor_parallel_size = [4]\n", "").replace("nnodes = [3]", "nnodes = [3]\ntensor_parallel_size = [4]")
    with pytest.raises(ConfigError, match="nnodes 3 does not divide the 4 GPUs"):
        load_settings(write(tmp_path, in_extra))
    for extra, says in (("nnodes = [0]", "nnodes: 0 is not a whole number >= 1"),
                        ('master_port = [29500]', "the planner sets --master-port on each node")):
        with pytest.raises(ConfigError, match=says):
            load_settings(write(tmp_path, grid.replace("nnodes = [1, 2]", extra)))


def test_vllms_ray_backend_is_refused_on_the_ray_executor(tmp_path):
    text = BASE.replace('args = ["--enforce-eager"]', 'args = ["--distributed-executor-backend", "ray"]')
    assert load_settings(write(tmp_path, text)).executor.kind == "local", "locally vLLM starts its own Ray"
    with pytest.raises(ConfigError, match=r"ray \(\[server\] args\): vLLM's Ray backend places its workers with a placement group of its own"):
        load_settings(write(tmp_path, text + '\n[executor]\nkind = "ray"\n'))
    in_grid = BASE.replace("enable_prefix_caching = [false]", 'distributed-executor-backend = ["mp", "ray"]')
    with pytest.raises(ConfigError, match=r"\(\[grid.extra\] distributed-executor-backend\).*\[grid.extra\] nnodes = \[N\]"):
        load_settings(write(tmp_path, in_grid + '\n[executor]\nkind = "ray"\n'))


def test_the_old_ways_keep_the_fingerprints_results_had_before_request_order_and_ramp_s(tmp_path):
    # Before [replay] request_order and ramp_s, requests went in the file's order and closed loops
    # started at once. Under "file" and 0 a --resume finds the points measured then (their
    # fingerprint, computed at c28ea28 from this same config, is the constant below); under the
    # new defaults, or either one alone, they are measured again.
    settings = load_settings(write(tmp_path, BASE.replace("./models/tiny", "/models/tiny")))
    point = expand(settings)[0]

    def under(**changes) -> str:
        changed = settings.model_copy(update={"replay": settings.replay.model_copy(update=changes)})
        return fingerprint(changed, point, corpus_sha256="a" * 64, vllm_version="0.32.0")

    assert settings.replay.request_order == "balanced" and settings.replay.ramp_s is None
    assert under(request_order="file", ramp_s=0.0) == "eba1a17faa040bf3"
    assert under() != "eba1a17faa040bf3"
    assert under(request_order="file") != "eba1a17faa040bf3"
    assert under(ramp_s=0.0) != "eba1a17faa040bf3"
    # At da8581c, the mixed order's fingerprint of this config (before ramp_s): kept under ramp_s = 0.
    assert under(request_order="mixed", ramp_s=0.0) == "2d1adf80a5a6ddce"
    # The balanced order is another way of measuring: points measured under "mixed" are measured again.
    assert under() != under(request_order="mixed")
