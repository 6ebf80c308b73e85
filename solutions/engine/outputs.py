"""What a request returns: vLLM's ``RequestOutput`` / ``CompletionOutput``, plus timing metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .logprobs import Logprob

OutputKind = Literal["cumulative", "delta", "final"]
"""What ``Engine.step`` reports of a request (vLLM's ``RequestOutputKind``):

- "cumulative": an output each step that adds tokens, holding everything so far (``text``, ``token_ids``,
  ``metrics.token_times``) and, in ``delta_text`` / ``delta_token_ids``, what the step added;
- "delta": an output each such step holding only what it added: ``text``, ``token_ids`` and
  ``metrics.token_times`` are the new part (equal to the ``delta_*`` fields), so a long stream costs the same
  each step instead of copying a growing output (what a streaming server wants);
- "final": one output, when the request finishes, holding everything.
"""
OUTPUT_KINDS = ("cumulative", "delta", "final")


@dataclass
class RequestMetrics:
    """Wall-clock times (``time.perf_counter`` seconds) of one request,
    and the figures vLLM derives from them.

    queue time = first scheduled - arrival; TTFT = first token - arrival; TPOT = (finish - first token) /
    (output tokens - 1); ITL = the gaps between successive steps that gave the request tokens;
    latency = finish - arrival. ``token_times`` holds the time of each step that added tokens.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    num_preemptions: int = 0
    num_verify_passes: int = 0  # speculative decoding (Lesson 4): passes that verified drafts
    num_verified_tokens: int = 0  # tokens those passes emitted (accepted drafts + the target's own)

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        if self.finished_time is None or self.first_token_time is None or self.num_output_tokens < 2:
            return None
        return (self.finished_time - self.first_token_time) / (self.num_output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the time between successive steps that produced output."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens per second of this request's whole lifetime (its user's speed)."""
        latency = self.latency
        return None if not latency else self.num_output_tokens / latency

    @property
    def mean_acceptance_length(self) -> float | None:
        """tau: tokens per verifying pass (None without speculative decoding)."""
        return self.num_verified_tokens / self.num_verify_passes if self.num_verify_passes else None

    def snapshot(self, first_token_time: int = 0) -> RequestMetrics:
        """A copy that later steps do not change, holding ``token_times[first_token_time:]``."""
        copy = object.__new__(RequestMetrics)  # a shallow copy of the fields, not through __init__: it runs
        copy.__dict__.update(self.__dict__)  # for every streamed request at every step
        copy.token_times = self.token_times[first_token_time:]
        return copy

    def summary(self) -> str:
        parts = [] if self.ttft is None else [f"TTFT {1e3 * self.ttft:.1f} ms"]
        if self.tpot is not None:
            parts.append(f"TPOT {1e3 * self.tpot:.1f} ms")
        parts.append(f"{self.tokens_per_s or 0:.1f} tokens/s over {self.num_output_tokens} tokens")
        if self.mean_acceptance_length is not None:
            parts.append(f"tau {self.mean_acceptance_length:.2f}")
        return " | ".join(parts)


@dataclass
class CompletionOutput:
    """The generated text so far (in the "delta" ``OutputKind``: only its new part); ``delta_text`` /
    ``delta_token_ids`` are what the latest step added. ``logprobs``
    follows ``token_ids`` (delta or whole)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" (EOS, a stop token or string) | "length" | "abort" | None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    # SamplingParams.logprobs: one dict per token of ``token_ids`` (the sampled token and the top N)
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class RequestOutput:
    """One request's completions (``SamplingParams.n`` of them), as of the latest step."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    # SamplingParams.prompt_logprobs: one entry per prompt token, the first None (nothing predicts it)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
