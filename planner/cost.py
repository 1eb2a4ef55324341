"""What a measured point costs: $ per hour per replica, $ per million output tokens at the safe
concurrency, and a fleet's $ per hour and per month.

There are no built-in prices: GPU prices change weekly and differ by contract. A price comes
from `--gpu-hour-price PRICE` (every GPU), `--gpu-hour-price TYPE=PRICE` (one GPU type), or the
sweep config's `[cost] gpu_hour = {TYPE = PRICE, ...}`, in that order. TYPE matches a point's
GPU model (nvidia-smi's name, say "NVIDIA H100 80GB HBM3") when it is the whole name or a whole
word of it ("H100"), case aside; the longest matching TYPE wins. A point whose GPU model was not
recorded is priced only by a plain `--gpu-hour-price PRICE`.

    $/hour per replica       = price x GPUs per replica
    $ per 1M output tokens   = price / (output tokens/s per GPU at the safe concurrency x 3600) x 1e6
    fleet $/hour             = price x GPUs of the fleet;  $/month = $/hour x 730
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.errors import ConfigError

# 365 days x 24 hours / 12 months: the month cloud price sheets use.
HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class Price:
    per_gpu_hour: float
    # Where it came from: "--gpu-hour-price", "--gpu-hour-price H100=...", "[cost] gpu_hour H100".
    source: str


@dataclass(frozen=True)
class Prices:
    """The prices a run was given: one for every GPU, and per GPU type (flags over the config)."""

    every_gpu: float | None = None
    by_type: tuple[tuple[str, float, str], ...] = ()

    def for_gpu(self, gpu_model: str | None) -> Price | None:
        if self.every_gpu is not None:
            return Price(self.every_gpu, "--gpu-hour-price")
        if not gpu_model:
            return None
        matches = [(t, p, src) for t, p, src in self.by_type if _matches(t, gpu_model)]
        if not matches:
            return None
        # Flags come first in by_type; among one source the most specific type wins.
        first_source = matches[0][2].split(" ")[0]
        kind, price, src = max((m for m in matches if m[2].startswith(first_source)), key=lambda m: len(m[0]))
        return Price(price, f"{src} {kind}")

    def __bool__(self) -> bool:
        return self.every_gpu is not None or bool(self.by_type)


def _matches(kind: str, gpu_model: str) -> bool:
    kind, model = kind.casefold().strip(), gpu_model.casefold()
    return kind == model or re.search(rf"(?<![\w-]){re.escape(kind)}(?![\w-])", model) is not None


def _positive(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{where}: {value!r} is not a price; give a positive number of dollars per GPU-hour")
    return float(value)


def parse_flag_prices(values: Sequence[str]) -> tuple[float | None, list[tuple[str, float, str]]]:
    """--gpu-hour-price values: PRICE (every GPU) or TYPE=PRICE, repeatable."""
    every: float | None = None
    by_type: list[tuple[str, float, str]] = []
    for text in values:
        kind, eq, number = text.rpartition("=")
        try:
            price = float(number)
        except ValueError:
            raise ConfigError(f"--gpu-hour-price {text!r}: expected PRICE or TYPE=PRICE, e.g. 2.49 or H100=2.49") from None
        price = _positive(price, f"--gpu-hour-price {text!r}")
        if eq and not kind.strip():
            raise ConfigError(f"--gpu-hour-price {text!r}: the GPU type before '=' is empty")
        if eq:
            by_type.append((kind.strip(), price, "--gpu-hour-price"))
        elif every is not None:
            raise ConfigError("--gpu-hour-price PRICE is given twice; give one price for every GPU, or TYPE=PRICE each")
        else:
            every = price
    return every, by_type


def prices(flags: Sequence[str] = (), config: Mapping[str, object] | None = None, where: str = "[cost] gpu_hour") -> Prices:
    """Prices from the flags, then from a config's (or a saved sweep's) [cost] gpu_hour table."""
    every, by_type = parse_flag_prices(flags)
    for kind, price in (config or {}).items():
        by_type.append((str(kind), _positive(price, f"{where} {kind}"), "[cost] gpu_hour"))
    return Prices(every, tuple(by_type))


def saved_gpu_hour(settings_extra: Mapping[str, object] | None) -> dict[str, object]:
    """[cost] gpu_hour as a sweep.json's settings saved it ({} when the sweep had none)."""
    cost = (settings_extra or {}).get("cost")
    table = cost.get("gpu_hour") if isinstance(cost, dict) else None
    return dict(table) if isinstance(table, dict) else {}


@dataclass(frozen=True)
class PointCost:
    price: Price
    per_replica_hour: float
    # None when the point measured no output tokens/s.
    per_million_output_tokens: float | None


def point_cost(price: Price, gpus: int, output_tokens_per_s_per_gpu: float | None) -> PointCost:
    per_mtok = None
    if output_tokens_per_s_per_gpu:
        per_mtok = price.per_gpu_hour / (output_tokens_per_s_per_gpu * 3600.0) * 1e6
    return PointCost(price, price.per_gpu_hour * gpus, per_mtok)


@dataclass(frozen=True)
class FleetCost:
    replicas: int
    gpus: int
    per_hour: float
    per_month: float


def fleet_cost(price: Price, replicas: int, gpus_per_replica: int) -> FleetCost:
    gpus = replicas * gpus_per_replica
    per_hour = price.per_gpu_hour * gpus
    return FleetCost(replicas, gpus, per_hour, per_hour * HOURS_PER_MONTH)


def money(x: float | None) -> str:
    if x is None:
        return "-"
    return f"${x:,.2f}" if x >= 1 else f"${x:.3g}"
