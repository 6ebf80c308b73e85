"""What a set of alternated timings says: each candidate's median with its spread, and a verdict on two.

A noisy machine (a shared 2-core CPU, a laptop on battery) moves a timing by tens of percent from one
minute to the next, so a single ratio can point either way. ``timing.alternating_runs`` times candidates in
rounds that run each once in turn; round ``i`` of two candidates ran side by side, so their ratio is one
paired observation of the speed-up. ``speedup`` takes the median of those ratios and their range (lowest
to highest round), and calls the candidate faster only when even its worst round beat the baseline:

    >>> str(speedup([13.0, 12.0, 14.0], [10.0, 10.0, 10.0]))
    '1.30x, 1.20-1.40 over 3 alternated runs: faster'
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_RUNS = 3  # fewer rounds cannot show a spread worth a verdict


def _checked(times: Sequence[float], what: str) -> list[float]:
    values = [float(t) for t in times]
    if len(values) < MIN_RUNS:
        raise ValueError(f"{what}: need at least {MIN_RUNS} alternated runs for a spread, got {len(values)}")
    if not all(math.isfinite(t) and t > 0 for t in values):
        raise ValueError(f"{what}: every time must be positive and finite, got {values}")
    return values


@dataclass(frozen=True)
class Spread:
    """One candidate's times: the median and the range (``low <= median <= high``) over ``runs`` runs."""

    median: float
    low: float
    high: float
    runs: int

    @classmethod
    def of(cls, times: Sequence[float]) -> Spread:
        values = _checked(times, "spread")
        return cls(statistics.median(values), min(values), max(values), len(values))

    def format(self, unit: str = "ms", digits: int = 1) -> str:
        return f"{self.median:.{digits}f} {unit} ({self.low:.{digits}f}-{self.high:.{digits}f})"


@dataclass(frozen=True)
class Speedup:
    """How many times faster a candidate ran than a baseline: the median of the per-round ratios
    (baseline time / candidate time) and their range, ``low <= ratio <= high``, over ``runs`` rounds."""

    ratio: float
    low: float
    high: float
    runs: int

    @property
    def verdict(self) -> str:
        """The word for this spread: "faster" when every round's ratio is above 1, "slower" when every one
        is below, else "not distinguishable here" (the spread of this run straddles 1)."""
        if self.low > 1:
            return "faster"
        if self.high < 1:
            return "slower"
        return "not distinguishable here"

    def __str__(self) -> str:
        spread = f"{self.low:.2f}-{self.high:.2f} over {self.runs} alternated runs"
        return f"{self.ratio:.2f}x, {spread}: {self.verdict}"


def speedup(baseline_ms: Sequence[float], candidate_ms: Sequence[float]) -> Speedup:
    """The candidate's speed-up over the baseline from paired rounds (``timing.alternating_runs``: round ``i``
    of each list ran side by side). Any positive unit works, as long as both lists share it."""
    base, cand = _checked(baseline_ms, "baseline"), _checked(candidate_ms, "candidate")
    if len(base) != len(cand):
        raise ValueError(
            "baseline and candidate must come from the same alternated rounds: "
            f"{len(base)} and {len(cand)} runs"
        )
    ratios = [b / c for b, c in zip(base, cand, strict=True)]
    return Speedup(statistics.median(ratios), min(ratios), max(ratios), len(ratios))
