"""Lab 7: choose a fast mode's engine options from a latency target and a machine's measured figures.

A decode step streams every weight once and then does a little more work for each row it computes
(Lessons 0 and 3). With figures measured on the machine (``fast_mode.measure``):

    step_s(rows) = weight_bytes / linear_bandwidth + step_overhead_s + (rows - 1) * row_s

A batch of B sequences computes B rows a step. Speculative decoding (Lesson 4) makes every sequence verify
its drafts in the same pass, ``B * verify_rows`` rows, and gains ``tau`` tokens a pass instead of one, after
drafting. So, with every one of B slots taken:

    per-user tokens/s  = tau / (step_s(B * verify_rows) + draft_s(B))
    aggregate tokens/s = B * per-user tokens/s      what the machine sells (its cost per token: 1 / this)
    TTFT               = prompt_tokens / prefill_tokens_per_s + step_s(B * verify_rows)
                         (the new prompt's prefill, and the step already in flight)

The choice: among the configurations (weight format x speculation x batch cap) whose per-user speed and TTFT
meet the target, the one with the highest aggregate throughput, so the cheapest per token. The bus leaves with
as many passengers as it can while still arriving on time. When none meets the target, the fastest per user,
marked ``meets_target=False``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WeightFormat:
    """How one weight format decodes on one machine; every figure measured (``fast_mode.measure``).

    Invariant: all figures positive except ``row_s`` and ``step_overhead_s`` (>= 0)."""

    name: str
    engine_options: dict[str, Any]  # the LLM(...) keywords that select it: dtype, quantization
    weight_bytes: float  # bytes one decode step reads
    linear_bandwidth: float  # bytes/s the step's matrix products stream them at
    step_overhead_s: float  # the rest of a batch-1 step: norms, attention, sampling, the engine's bookkeeping
    row_s: float  # what each row beyond the first adds to a step (another sequence, or a draft to verify)
    prefill_tokens_per_s: float

    def __post_init__(self) -> None:
        for name in ("weight_bytes", "linear_bandwidth", "prefill_tokens_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"WeightFormat {self.name!r}: {name} must be > 0, got {getattr(self, name)}")
        for name in ("step_overhead_s", "row_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(
                    f"WeightFormat {self.name!r}: {name} must be >= 0, got {getattr(self, name)}"
                )

    def step_s(self, rows: int) -> float:
        """Seconds of a decode step computing ``rows`` rows: the weight read, the overhead, the rows."""
        if rows < 1:
            raise ValueError(f"a step computes at least one row, got rows={rows}")
        return self.weight_bytes / self.linear_bandwidth + self.step_overhead_s + (rows - 1) * self.row_s


@dataclass(frozen=True)
class Speculation:
    """A drafter as measured on one kind of content. ``verify_rows``: rows one sequence's verify pass
    computes (1 without drafts, k + 1 for a chain of k, N + 1 for a tree of N nodes). ``tau``: tokens a pass
    gains (the engine's ``mean_acceptance_length``). ``draft_s``: drafting time per step for one sequence.
    Chains are drafted for the whole batch in lockstep (one ``draft_s`` a step); trees one sequence at a time
    (``per_sequence_drafts``: ``draft_s`` for each)."""

    name: str
    engine_options: dict[str, Any] = field(default_factory=dict)
    verify_rows: int = 1
    tau: float = 1.0
    draft_s: float = 0.0
    per_sequence_drafts: bool = False

    def __post_init__(self) -> None:
        if self.verify_rows < 1:
            raise ValueError(f"Speculation {self.name!r}: verify_rows must be >= 1, got {self.verify_rows}")
        if not 1.0 <= self.tau <= self.verify_rows:
            raise ValueError(
                f"Speculation {self.name!r}: tau must lie in [1, verify_rows={self.verify_rows}] (a pass "
                f"gains at least the target's own token and at most every draft plus it), got {self.tau}"
            )
        if self.draft_s < 0:
            raise ValueError(f"Speculation {self.name!r}: draft_s must be >= 0, got {self.draft_s}")

    def draft_seconds(self, batch: int) -> float:
        """Drafting time of one step for ``batch`` sequences."""
        return self.draft_s * (batch if self.per_sequence_drafts else 1)


NO_SPECULATION = Speculation("none")


@dataclass(frozen=True)
class MachineProfile:
    """One machine's measured figures: the weight formats it can run, the drafters measured with each format
    (``speculations[format name]``: the head drafts in the target's dtype, and tau moves with its rounding;
    plain decoding is always a candidate besides them) and the batch caps to consider."""

    name: str
    formats: tuple[WeightFormat, ...]
    speculations: dict[str, tuple[Speculation, ...]] = field(default_factory=dict)
    batch_caps: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

    def __post_init__(self) -> None:
        if not self.formats:
            raise ValueError(f"MachineProfile {self.name!r} has no weight format to choose from")
        if not self.batch_caps or min(self.batch_caps) < 1:
            raise ValueError(f"MachineProfile {self.name!r}: batch_caps must be >= 1, got {self.batch_caps}")
        unknown = set(self.speculations) - {f.name for f in self.formats}
        if unknown:
            raise ValueError(
                f"MachineProfile {self.name!r}: speculations for unknown formats {sorted(unknown)}"
            )

    def drafters(self, fmt: WeightFormat) -> tuple[Speculation, ...]:
        """No speculation, then every drafter measured with ``fmt``."""
        return (NO_SPECULATION, *self.speculations.get(fmt.name, ()))


@dataclass(frozen=True)
class LatencyTarget:
    """What a user is promised: at least ``per_user_tokens_per_s`` output tokens/s, and the first token within
    ``ttft_s`` seconds of a ``prompt_tokens``-token prompt."""

    per_user_tokens_per_s: float
    ttft_s: float = math.inf
    prompt_tokens: int = 256

    def __post_init__(self) -> None:
        if self.per_user_tokens_per_s < 0 or not self.ttft_s > 0 or self.prompt_tokens < 1:
            raise ValueError(
                "LatencyTarget needs per_user_tokens_per_s >= 0, ttft_s > 0 and prompt_tokens >= 1, got "
                f"{self.per_user_tokens_per_s}, {self.ttft_s}, {self.prompt_tokens}"
            )


@dataclass(frozen=True)
class Prediction:
    step_s: float  # one decode (or verify) step of the whole batch, drafting excluded
    per_user_tokens_per_s: float
    aggregate_tokens_per_s: float
    ttft_s: float


@dataclass(frozen=True)
class FastModeConfig:
    """The chosen engine options and what the cost model predicts for them."""

    max_num_seqs: int
    weight_format: WeightFormat
    speculation: Speculation
    predicted: Prediction
    meets_target: bool

    def engine_options(self) -> dict[str, Any]:
        """The ``LLM(...)`` keywords of this choice."""
        options = {"max_num_seqs": self.max_num_seqs, **self.weight_format.engine_options}
        return options | self.speculation.engine_options

    def describe(self) -> str:
        p = self.predicted
        verdict = "meets the target" if self.meets_target else "MISSES the target (the fastest there is)"
        return (
            f"{self.weight_format.name}, speculation {self.speculation.name}, batch cap {self.max_num_seqs}: "
            f"{p.per_user_tokens_per_s:.1f} tok/s per user, {p.aggregate_tokens_per_s:.1f} tok/s in all, "
            f"TTFT {p.ttft_s * 1e3:.0f} ms; {verdict}"
        )


def predict(fmt: WeightFormat, speculation: Speculation, batch: int, prompt_tokens: int) -> Prediction:
    """What ``batch`` sequences decoding together with ``speculation`` on ``fmt`` get (module docstring)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    # BEGIN SOLUTION Lab 7: a step computes batch * verify_rows rows; each user gains tau tokens per step plus
    #  drafting; aggregate = batch * per-user; TTFT = prefill + one step
    # HINT: Two traps. A verify pass computes every sequence's root and drafts, batch * verify_rows rows,
    #  not batch rows. And a pass gains tau tokens per user, not one: drafts pay only if tau outgrows their
    #  cost.
    # HINT: fmt.step_s(rows) gives the step and speculation.draft_seconds(batch) the drafting before it; the
    #  module's docstring puts them together, one formula per figure of the Prediction.
    step = fmt.step_s(batch * speculation.verify_rows)
    per_user = speculation.tau / (step + speculation.draft_seconds(batch))
    ttft = prompt_tokens / fmt.prefill_tokens_per_s + step
    return Prediction(step, per_user, batch * per_user, ttft)
    # END SOLUTION


def choose_fast_mode(target: LatencyTarget, profile: MachineProfile) -> FastModeConfig:
    """The cheapest configuration that meets ``target`` on ``profile``'s machine (the module's docstring)."""
    # BEGIN SOLUTION Lab 7: predict every format x profile.drafters(format) x batch cap;
    #  of those meeting both targets keep the highest aggregate (ties: faster per user);
    #  if none meets, the fastest per user
    # HINT: The trap is the fast mode for everyone: the fastest configuration per user is rarely the cheapest
    #  one that is fast enough. Among those that meet the target, compare aggregate throughput, which is
    #  what sets the price per token; and check TTFT too, not just tokens/s.
    # HINT: Build one FastModeConfig per candidate from predict(fmt, speculation, batch,
    #  target.prompt_tokens); Python's max with a key of (aggregate, per-user) picks the cheapest, and of
    #  equals the faster.
    candidates = []
    for fmt in profile.formats:
        for speculation in profile.drafters(fmt):
            for batch in profile.batch_caps:
                p = predict(fmt, speculation, batch, target.prompt_tokens)
                meets = p.per_user_tokens_per_s >= target.per_user_tokens_per_s and p.ttft_s <= target.ttft_s
                candidates.append(FastModeConfig(batch, fmt, speculation, p, meets))
    meeting = [c for c in candidates if c.meets_target]
    if meeting:
        return max(
            meeting, key=lambda c: (c.predicted.aggregate_tokens_per_s, c.predicted.per_user_tokens_per_s)
        )
    return max(
        candidates, key=lambda c: (c.predicted.per_user_tokens_per_s, c.predicted.aggregate_tokens_per_s)
    )
    # END SOLUTION
