"""Sizes as vLLM's flags spell them, and GiB for people.

vLLM 0.32 parses --kv-cache-memory-bytes and --max-num-batched-tokens with
`vllm.utils.argparse_utils.human_readable_int`: a lowercase suffix is decimal (k = 10**3,
m = 10**6, g = 10**9, t = 10**12, decimals allowed: "25.6k" = 25,600), an uppercase one is binary
(K = 2**10, M = 2**20, G = 2**30, T = 2**40, whole numbers only: "1.5G" is an error there). So
"2M" is 2,097,152 bytes and "2m" is 2,000,000. This module repeats that rule so that a sweep's
prediction and the server agree on the pool size to the byte.
"""

from __future__ import annotations

import re

from planner.errors import ConfigError

GIB = 2**30

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
VALID_HELP = "an integer, or a number with k/m/g/t (decimal) or K/M/G/T (binary, whole numbers only), e.g. 2M, 256K, 1G"


def parse_vllm_int(value: int | str, *, what: str) -> int:
    """Parse a value the way vLLM's human_readable_int does; `what` names the flag in errors."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: expected {VALID_HELP}, got {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    match = _SIZE.fullmatch(text)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise ConfigError(
                f"{what}: {text!r} has a decimal with the binary suffix {suffix}; vLLM rejects that "
                f"(use {number}{suffix.lower()} for decimal units)"
            )
        return int(number) * _BINARY[suffix]
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{what}: expected {VALID_HELP}, got {value!r}") from None


def gib(n_bytes: int | float) -> float:
    return n_bytes / GIB


def format_bytes(n: int | None) -> str:
    """A byte count for people: GiB, MiB, KiB or bytes, two decimals; "-" for None."""
    if n is None:
        return "-"
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,} B"
