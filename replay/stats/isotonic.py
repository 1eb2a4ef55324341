"""Isotonic regression: the non-decreasing sequence nearest some values. Pure math that three
stages share: the search fits each rule's measured / bound against load with it
(replay.search.policy), the between-step margin reads the scatter around it
(replay.stats.across_steps), and the knee read from every step fits pass probability with it
(replay.search.pass_fit)."""

from __future__ import annotations

from collections.abc import Sequence


def isotonic(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Pool-adjacent-violators: the non-decreasing sequence nearest `values` in weighted least
    squares."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for mean, _, count in blocks:
        out.extend([mean] * int(count))
    return out
