"""`planner measure-train`: run the step `planner estimate --train` budgets, and put the two side by side.

The step runs in vLLM's or the training environment (torch and transformers), not the planner's:
scripts/measure_train.py under that environment's python. On a CUDA GPU it records
torch.cuda.max_memory_allocated / max_memory_reserved next to the estimate's total; without one
it records the CPU figures and says that peak CUDA memory needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from replay.results import write_json_atomic

from planner.cliargs import env_default
from planner.commands import estimate_train
from planner.errors import ConfigError
from planner.estimate.gpu_catalog import CATALOG
from planner.estimate.memory import WorkingMemoryModel
from planner.estimate.train import train_estimate
from planner.estimate.train_measure import compare, measure_case
from planner.estimate.units import format_bytes

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "measure_train.py"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "measure-train",
        help="run one real training step and record the memory it holds next to `estimate --train`",
        description=(
            "Runs one forward, backward and optimizer step of the configuration with PyTorch in vLLM's (or a training) "
            "environment, and prints the measured weights, gradients, optimizer state, saved activations and, on a CUDA GPU, "
            "peak allocated and reserved memory beside the estimate."
        ),
    )
    p.add_argument("--model", required=True, type=Path, help="model folder (config.json, safetensors) or a config.json (random weights)")
    p.add_argument("--gpu", default=env_default("PLANNER_GPU"), help=f"GPU for the estimate's verdict: {', '.join(CATALOG)} (env PLANNER_GPU)")
    p.add_argument("--gpu-memory-gib", type=float, default=env_default("PLANNER_GPU_MEMORY_GIB"), help="GPU memory in GiB (env PLANNER_GPU_MEMORY_GIB)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="where the step runs (default auto: CUDA when torch sees it)")
    p.add_argument("--random-weights", action="store_true", help="build the model from its config.json instead of loading its weights")
    p.add_argument(
        "--python", default=None,
        help="python with torch and transformers (env PLANNER_TRAIN_PYTHON; default PLANNER_VLLM_VENV/bin/python, then .venv-vllm/bin/python)",
    )  # fmt: skip
    p.add_argument("--output", type=Path, default=None, help="write the estimate, the measurement and the comparison to this JSON file")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="give up on the step after this long (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    defaults = WorkingMemoryModel()
    p.add_argument("--reserve-gib", type=float, default=defaults.reserve_gib, help="extra reserve per GPU in the estimate (default %(default)s)")
    p.add_argument("--cuda-context-gib", type=float, default=defaults.cuda_context_gib, help="CUDA context per GPU in the estimate (default %(default)s)")
    p.add_argument("--nccl-gib", type=float, default=defaults.nccl_gib, help="NCCL buffers per GPU in the estimate (default %(default)s)")
    estimate_train.add_arguments(p)
    p.set_defaults(run=run)


def training_python(flag: str | None) -> str:
    """The python that runs the step: --python, PLANNER_TRAIN_PYTHON, vLLM's environment."""
    chosen = flag or os.environ.get("PLANNER_TRAIN_PYTHON")
    if chosen:
        return chosen
    venv = Path(os.environ.get("PLANNER_VLLM_VENV") or REPO / ".venv-vllm")
    python = venv / "bin" / "python"
    if not python.exists():
        raise ConfigError(
            f"no python with torch found: {python} does not exist; give --python (env PLANNER_TRAIN_PYTHON) "
            "or PLANNER_VLLM_VENV, or run `make vllm`"
        )
    return str(python)


def run_script(python: str, cases: list[dict], timeout_s: float) -> dict:
    """Run the measuring script on these cases in one process; its parsed results."""
    if not SCRIPT.is_file():
        raise ConfigError(f"{SCRIPT} is missing: measure-train runs from a checkout of the planner's repository")
    with tempfile.TemporaryDirectory(prefix="planner-measure-train-") as tmp:
        cases_file, out_file = Path(tmp, "cases.json"), Path(tmp, "results.json")
        cases_file.write_text(json.dumps({"cases": cases}))
        env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}
        try:
            done = subprocess.run(
                [python, str(SCRIPT), "--cases", str(cases_file), "--out", str(out_file)],
                capture_output=True, text=True, timeout=timeout_s, env=env,
            )  # fmt: skip
        except FileNotFoundError:
            raise ConfigError(f"--python {python}: no such program") from None
        except subprocess.TimeoutExpired:
            raise ConfigError(f"the training step did not finish within --timeout-s {timeout_s:g}") from None
        if not out_file.exists():
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise ConfigError(f"{python} {SCRIPT.name} failed (exit {done.returncode}):\n{tail}")
        return json.loads(out_file.read_text())


def run(args: argparse.Namespace) -> int:
    settings = estimate_train.settings_from(args, 1, "planner measure-train")
    estimate = train_estimate(settings)
    case = measure_case(settings, estimate.activations.seq_len, name="measure-train", device=args.device, load_weights=not args.random_weights)
    results = run_script(training_python(args.python), [case], args.timeout_s)
    result = results["results"][0]
    if result["error"]:
        raise ConfigError(f"the training step failed: {result['error']}")
    measured = result["measured"]
    rows = compare(estimate, measured)
    record = {
        "estimate": estimate.model_dump(mode="json"),
        "measured": measured,
        "comparison": [
            {"quantity": r.quantity, "estimate_bytes": r.estimate_bytes, "measured_bytes": r.measured_bytes,
             "relative_error": None if r.error == float("inf") else round(r.error, 4), "tolerance": r.tolerance, "within": r.within}
            for r in rows
        ],  # fmt: skip
        "environment": {k: results[k] for k in ("torch", "transformers", "cuda_available")},
        "case": case,
    }
    if args.output is not None:
        write_json_atomic(args.output, record)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print("\n".join(render(record)))
    return 0


def render(record: dict) -> list[str]:
    """The side-by-side table of one record; a pure function of it."""
    m, est = record["measured"], record["estimate"]
    env = record["environment"]
    lines = [f"{est['model']}: one training step with torch {env['torch']}, transformers {env['transformers']}"]
    lines.append(f"  {'':<26}{'estimate':>14}{'measured':>14}{'error':>9}")
    for row in record["comparison"]:
        err = "-" if row["relative_error"] is None else f"{row['relative_error']:+.1%}"
        lines.append(f"  {row['quantity']:<26}{format_bytes(row['estimate_bytes']):>14}{format_bytes(row['measured_bytes']):>14}{err:>9}")
    total = est["per_gpu"]["total_bytes"]
    if m.get("cuda_max_allocated_bytes") is not None:
        lines.append(f"  {'estimate total per GPU':<26}{format_bytes(total):>14}")
        lines.append(f"  {'CUDA peak allocated':<26}{'':>14}{format_bytes(m['cuda_max_allocated_bytes']):>14}  on {m.get('cuda_device', 'cuda')}")
        lines.append(f"  {'CUDA peak reserved':<26}{'':>14}{format_bytes(m['cuda_max_reserved_bytes']):>14}")
    else:
        lines.append(f"  process peak RSS (CPU): {format_bytes(m['process_max_rss_bytes'])}; {m.get('cuda_note', '')}")
    lines.append("Measure the exact configuration you will run, keep headroom, and measure again after any change.")
    return lines
