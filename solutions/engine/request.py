"""One request's life inside the engine: its tokens, its cache slot, its detokenized text, its stop test."""

from __future__ import annotations

import enum
import time
from collections.abc import Collection

import torch

from .outputs import CompletionOutput, RequestMetrics, RequestOutput
from .sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """Invariant: ``num_computed`` tokens of ``all_token_ids`` are in the KV cache; the rest await a step."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params = params
        self.status = Status.WAITING
        self.slot: int | None = None
        self.num_computed = 0
        self.text = ""
        self._emitted_text = 0
        self._emitted_tokens = 0
        self.finish_reason: str | None = None
        self.metrics = RequestMetrics(arrival_time=time.perf_counter(), num_prompt_tokens=len(prompt_token_ids))
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append_token(self, token_id: int, text: str, eos_token_ids: Collection[int], max_model_len: int) -> None:
        """Record a sampled token and its newly decoded full text, then apply the stop rules.

        A stop token (any of the model's ``eos_token_ids`` unless ``ignore_eos``, or of the request's
        ``stop_token_ids``) stays in ``output_token_ids`` but its text is left out.
        """
        now = time.perf_counter()
        if not self.output_token_ids:
            self.metrics.first_token_time = now
        self.output_token_ids.append(token_id)
        self.metrics.num_output_tokens = len(self.output_token_ids)
        params = self.params
        if (token_id in eos_token_ids and not params.ignore_eos) or token_id in params.stop_token_ids:
            text, self.finish_reason = self.text, "stop"
        for stop in params.stop:
            # Only the newest characters can complete a stop string.
            found = text.find(stop, max(0, len(self.text) - len(stop)))
            if found != -1:
                text, self.finish_reason = text[:found], "stop"
                break
        self.text = text
        if self.finish_reason is None and (
            len(self.output_token_ids) >= params.max_tokens or self.num_tokens >= max_model_len
        ):
            self.finish_reason = "length"
        if self.finish_reason is not None:
            self.status = Status.FINISHED
            self.metrics.finished_time = now

    def output(self) -> RequestOutput:
        """A snapshot with everything generated so far; deltas cover what is new since the last snapshot."""
        # Hold back a trailing partial UTF-8 character (decoded as U+FFFD) until its bytes complete.
        stable = len(self.text) if self.finished or not self.text.endswith("\ufffd") else len(self.text) - 1
        delta_text = self.text[self._emitted_text : stable]
        delta_tokens = self.output_token_ids[self._emitted_tokens :]
        self._emitted_text, self._emitted_tokens = max(stable, self._emitted_text), len(self.output_token_ids)
        completion = CompletionOutput(
            index=0,
            text=self.text,
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            delta_text=delta_text,
            delta_token_ids=delta_tokens,
        )
        return RequestOutput(
            self.request_id, self.prompt, self.prompt_token_ids, [completion], self.finished, self.metrics
        )
