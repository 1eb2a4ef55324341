"""Token-length estimates for when no server is at hand to count with its own tokenizer.

The rule is deliberately crude and stated wherever a figure built on it is shown: English prose
averages about four UTF-8 bytes per token with the BPE tokenizers of common chat models. Code and
non-Latin text come out lower than the real count, so an estimate is a planning hint, never a
measurement.
"""

from __future__ import annotations

import math

BYTES_PER_TOKEN = 4
ESTIMATE_RULE = f"UTF-8 bytes / {BYTES_PER_TOKEN}, rounded up"


def estimate_tokens(text: str) -> int:
    """ceil(UTF-8 bytes / 4); 0 only for the empty string."""
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)
