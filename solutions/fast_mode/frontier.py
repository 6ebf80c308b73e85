"""The latency/throughput frontier, its price, and where a "faster for more money" claim falls on it.

A batch sweep gives, for each batch size, the speed one user sees and the machine's aggregate output. A
machine rented at a fixed price per hour produces ``aggregate * 3600`` tokens an hour, so its cost per token
goes as ``1 / aggregate``. A fast mode that serves a user at batch ``fast`` instead of ``bulk`` is then
``per_user(fast) / per_user(bulk)`` times faster and, priced at cost, ``aggregate(bulk) / aggregate(fast)``
times dearer per token. ``place_claim`` finds the pairs of batch sizes whose two ratios come closest to a
claim's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FrontierPoint:
    batch: int
    per_user_tokens_per_s: float
    aggregate_tokens_per_s: float

    def __post_init__(self) -> None:
        if self.batch < 1 or not self.per_user_tokens_per_s > 0 or not self.aggregate_tokens_per_s > 0:
            raise ValueError(f"a frontier point needs batch >= 1 and positive speeds, got {self}")


def cost_per_million_tokens(aggregate_tokens_per_s: float, price_per_hour: float) -> float:
    """Dollars per million output tokens of a machine rented at ``price_per_hour``, at this rate."""
    if not aggregate_tokens_per_s > 0 or price_per_hour < 0:
        raise ValueError(
            "need aggregate_tokens_per_s > 0 and price_per_hour >= 0, got "
            f"{aggregate_tokens_per_s}, {price_per_hour}"
        )
    return price_per_hour / (3600 * aggregate_tokens_per_s) * 1e6


@dataclass(frozen=True)
class ClaimPlacement:
    """Two batch sizes read as a fast mode (``fast``) and the normal one (``bulk``), beside a claim."""

    fast: FrontierPoint
    bulk: FrontierPoint
    speed_ratio: float  # per-user speed, fast over bulk
    price_ratio: float  # cost per token, fast over bulk
    claimed_speed_ratio: float
    claimed_price_ratio: float

    @property
    def distance(self) -> float:
        """How far both ratios are from the claim's, summed on a log scale (0: exactly the claim)."""
        return abs(math.log(self.speed_ratio / self.claimed_speed_ratio)) + abs(
            math.log(self.price_ratio / self.claimed_price_ratio)
        )

    def within(self, tolerance: float) -> bool:
        """True when each ratio is within a factor ``1 + tolerance`` of the claim's (0.2: 20%), either way."""
        limit = math.log1p(tolerance)
        return (
            abs(math.log(self.speed_ratio / self.claimed_speed_ratio)) <= limit
            and abs(math.log(self.price_ratio / self.claimed_price_ratio)) <= limit
        )


def place_claim(points: list[FrontierPoint], speed_ratio: float, price_ratio: float) -> list[ClaimPlacement]:
    """Every (fast, bulk) pair with fast's batch below bulk's, closest to the claim first."""
    if not speed_ratio > 0 or not price_ratio > 0:
        raise ValueError(f"claimed ratios must be > 0, got {speed_ratio} and {price_ratio}")
    placements = [
        ClaimPlacement(
            fast,
            bulk,
            fast.per_user_tokens_per_s / bulk.per_user_tokens_per_s,
            bulk.aggregate_tokens_per_s / fast.aggregate_tokens_per_s,
            speed_ratio,
            price_ratio,
        )
        for fast in points
        for bulk in points
        if fast.batch < bulk.batch
    ]
    return sorted(placements, key=lambda p: p.distance)
