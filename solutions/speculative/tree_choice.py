"""Which draft tree to run: the one whose measured costs and acceptance predict the fastest decoding.

A speculative step drafts (``draft_ms``: the head's passes, one per depth) and then verifies the root and the
tree's nodes in one pass, ``rows = nodes + 1`` rows, which costs ``verify_ratio(rows)`` plain steps (1 at one
row; ``bench decode --rows`` measures it); it emits ``tau`` tokens on average (teacher-forced acceptance on
held-back answers, ``speculative/acceptance.py``). So against plain decoding, whose step costs ``step_ms``::

    S = tau / (draft_ms / step_ms + verify_ratio(rows))       (= tau / (1 + k c + v))

A bigger tree raises tau but pays more drafting and a longer verify pass; the best size depends on the
machine, the dtype and the head, which is why it is chosen from this run's measurements (EAGLE-2 grows its
tree by draft confidence to the size its GPU verifies at the price of one step; on a CPU that size is small).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TreeOption:
    """A chain (``nodes = 0``: ``depth`` drafts) or a tree of ``nodes`` drafts, ``depth`` deep, ``top_k``
    expanded per depth, with its measured ``tau`` and drafting milliseconds per step."""

    name: str
    depth: int
    top_k: int
    nodes: int
    tau: float
    draft_ms: float

    @property
    def rows(self) -> int:
        """Rows of its verify pass: the root and every draft."""
        return 1 + (self.nodes or self.depth)


def interpolate(measured: dict[int, float]) -> Callable[[int], float]:
    """A row count's cost from measured ``{rows: ratio to one row}``: linear between the nearest measured
    counts, the last slope beyond them. Raises ValueError without one row's ratio or with fewer than two."""
    if 1 not in measured or len(measured) < 2:
        raise ValueError(f"need the ratio at 1 row and at least one other row count, got {sorted(measured)}")
    points = sorted(measured.items())

    def ratio(rows: int) -> float:
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        for (r0, y0), (r1, y1) in zip(points, points[1:]):
            if rows <= r1:
                return y0 + (y1 - y0) * (rows - r0) / (r1 - r0)
        (r0, y0), (r1, y1) = points[-2], points[-1]
        return y1 + (y1 - y0) * (rows - r1) / (r1 - r0)

    return ratio


def predicted_speedup(option: TreeOption, step_ms: float, verify_ratio: Callable[[int], float]) -> float:
    """``tau / (draft_ms / step_ms + verify_ratio(rows))``: the option's decoding speed over plain."""
    if step_ms <= 0:
        raise ValueError(f"a plain step must take some time, got {step_ms} ms")
    return option.tau / (option.draft_ms / step_ms + verify_ratio(option.rows))


def choose_tree(
    options: list[TreeOption], step_ms: float, verify_ratio: Callable[[int], float]
) -> tuple[TreeOption, list[tuple[TreeOption, float]]]:
    """The option predicted fastest, and every option with its predicted speed-up, fastest first."""
    if not options:
        raise ValueError("no draft option to choose from")
    ranked = sorted(
        ((o, predicted_speedup(o, step_ms, verify_ratio)) for o in options), key=lambda pair: -pair[1]
    )
    return ranked[0][0], ranked
