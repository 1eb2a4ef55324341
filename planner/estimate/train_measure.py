"""The estimate next to what PyTorch measured for the same step (scripts/measure_train.py).

`measure_case` turns training settings into the measuring script's case; `compare` lines the two
up. `planner measure-train` and the e2e tests both use them, so the table in docs/guides/memory.md and the
command's output are computed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import ConfigError
from planner.estimate.architecture import load_config
from planner.estimate.train import TrainEstimate, TrainSettings

# The estimate must come this close to PyTorch (the bar): model states within 5%,
# saved activations within 15%.
STATES_TOLERANCE = 0.05
ACTIVATIONS_TOLERANCE = 0.15
STATE_FIELDS = ("weights_bytes", "master_weights_bytes", "gradients_bytes", "optimizer_bytes")


@dataclass(frozen=True)
class Row:
    quantity: str
    estimate_bytes: int
    measured_bytes: int
    tolerance: float

    @property
    def error(self) -> float:
        """Relative error of the estimate; 0 when both are 0."""
        if self.measured_bytes == 0:
            return 0.0 if self.estimate_bytes == 0 else float("inf")
        return (self.estimate_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def within(self) -> bool:
        return abs(self.error) <= self.tolerance


def measure_case(settings: TrainSettings, seq_len: int, *, name: str, device: str = "auto", load_weights: bool = True) -> dict[str, Any]:
    """The measuring script's case for these settings (one replica, or FSDP over --gpus workers)."""
    if settings.tensor_parallel_size != 1:
        raise ConfigError("--tensor-parallel-size: measure-train runs data parallelism only; tensor parallelism is estimated, not measured")
    if settings.strategy in ("zero1", "zero2", "zero3"):
        raise ConfigError(f"--strategy {settings.strategy}: measure-train runs single, ddp (one replica) or fsdp (PyTorch's ZeRO-3)")
    path = Path(settings.model)
    case: dict[str, Any] = {"name": name}
    if path.is_dir():
        case.update(model=str(path), load_weights=load_weights)
    else:
        case["config"] = load_config(path)[0]
    fsdp = settings.strategy == "fsdp"
    case.update(
        precision=settings.precision,
        optimizer=settings.optimizer,
        micro_batch=settings.micro_batch,
        seq_len=seq_len,
        checkpointing=settings.checkpointing,
        checkpoint_every=settings.checkpoint_every,
        lora_rank=settings.lora_rank,
        lora_targets=list(settings.lora_targets),
        freeze_layers=settings.freeze_layers,
        strategy="fsdp" if fsdp else "single",
        workers=settings.data_parallel if fsdp else 1,
        device=device,
    )
    return case


def compare(estimate: TrainEstimate, measured: dict[str, Any]) -> list[Row]:
    b = estimate.per_gpu
    rows = [Row(f, getattr(b, f), int(measured[f]), STATES_TOLERANCE) for f in STATE_FIELDS]
    rows.append(Row("saved_activations_bytes", b.activations_bytes, int(measured["saved_activations_bytes"]), ACTIVATIONS_TOLERANCE))
    return rows
