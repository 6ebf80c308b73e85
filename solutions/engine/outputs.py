"""What a request returns: vLLM's ``RequestOutput`` / ``CompletionOutput``, plus timing metrics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Wall-clock times (``time.perf_counter`` seconds) of one request, and the figures derived from them.

    TTFT = first token - arrival; TPOT = (finish - first token) / (output tokens - 1), as vLLM defines it.
    """

    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0

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
    def tokens_per_s(self) -> float | None:
        """Output tokens per second of this request's whole lifetime (its user's speed)."""
        latency = self.latency
        return None if not latency else self.num_output_tokens / latency

    def summary(self) -> str:
        parts = [] if self.ttft is None else [f"TTFT {1e3 * self.ttft:.1f} ms"]
        if self.tpot is not None:
            parts.append(f"TPOT {1e3 * self.tpot:.1f} ms")
        parts.append(f"{self.tokens_per_s or 0:.1f} tokens/s over {self.num_output_tokens} tokens")
        return " | ".join(parts)


@dataclass
class CompletionOutput:
    """The generated text so far; ``delta_text`` / ``delta_token_ids`` are what the latest step added."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" (EOS or a stop string) | "length" | None while running
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
