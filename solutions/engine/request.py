"""A request's life inside the engine.

``Request`` is what the scheduler schedules: one token sequence with its KV blocks (owned by the
``KVCacheManager`` under ``request_id``), its sampled tokens, its detokenizer and its stop test.
``RequestGroup`` is what the user submitted: one prompt and ``SamplingParams.n`` completions. With
``n > 1`` the group's first request prefills the prompt alone, its other completions waiting in
``RequestGroup.unforked``; the step that samples its first token draws theirs from the same logits row, and
the update path forks them from it, sharing every prompt block (copy-on-write on the last, partly full one).
``RequestGroup.create`` validates what was submitted, so a bad prompt fails before anything is queued.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import torch

from ..sampling_params import SamplingParams
from .detokenizer import IncrementalDetokenizer, NullDetokenizer
from .outputs import CompletionOutput, OutputKind, RequestMetrics, RequestOutput


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """Invariant: ``num_computed <= num_tokens + num_pending``, and tokens ``[0, num_computed)`` of
    ``all_token_ids`` have their K/V in this request's blocks. ``spec_token_ids`` are draft tokens to verify
    in the next step (Lesson 4); they are not part of ``all_token_ids`` until accepted. ``num_pending``
    counts the tokens drawn on the device that the host has not read yet (overlap scheduling: the step
    after them is planned and launched first); the scheduler plans as if they were known."""

    def __init__(self, request_id: str, group: RequestGroup, index: int, detokenizer: IncrementalDetokenizer):
        self.request_id = request_id
        self.group = group
        self.index = index
        self.params = group.params
        self.prompt_token_ids = group.prompt_token_ids
        self.output_token_ids: list[int] = []
        self.spec_token_ids: list[int] = []
        self.status = Status.WAITING
        self.num_computed = 0
        self.num_pending = 0
        self.detokenizer = detokenizer
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self._emitted_tokens = 0
        self.logprobs: list[dict] | None = None if self.params.logprobs is None else []  # engine/logprobs.py
        self.generator: torch.Generator | None = None
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed + index)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``[start, end)`` of prompt + output + draft tokens, without copying the whole sequence
        (the runner calls this for every scheduled request, every step)."""
        tokens, offset = [], 0
        for part in (self.prompt_token_ids, self.output_token_ids, self.spec_token_ids):
            low, high = max(start - offset, 0), min(end - offset, len(part))
            if low < high:
                tokens += part[low:high]
            offset += len(part)
        return tokens

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append_tokens(self, token_ids: list[int], stop_ids: frozenset[int], max_model_len: int) -> None:
        """Record newly accepted tokens one by one, stopping at the first that ends the request."""
        params = self.params
        for token_id in token_ids:
            self.output_token_ids.append(token_id)
            if token_id in stop_ids:  # a stop token's text is left out, as EOS (a special token) is
                self.finish_reason, self.stop_reason = "stop", token_id
            elif (stop_string := self.detokenizer.add(token_id)) is not None:
                self.finish_reason, self.stop_reason = "stop", stop_string
            elif len(self.output_token_ids) >= params.max_tokens or self.num_tokens >= max_model_len:
                self.finish_reason = "length"
            if self.finish_reason is not None:
                self.status = Status.FINISHED
                return

    def completion(self, delta_only: bool = False) -> CompletionOutput:
        """Everything generated so far (``delta_only``: only what is new); the deltas cover what is new since
        the previous call."""
        delta_tokens = self.output_token_ids[self._emitted_tokens :]
        logprobs = self.logprobs
        if logprobs is not None:
            logprobs = logprobs[self._emitted_tokens :] if delta_only else list(logprobs)
        self._emitted_tokens = len(self.output_token_ids)
        delta_text = self.detokenizer.delta(self.finished)
        return CompletionOutput(
            index=self.index,
            text=delta_text if delta_only else self.detokenizer.text,
            token_ids=list(delta_tokens) if delta_only else list(self.output_token_ids),
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            delta_text=delta_text,
            delta_token_ids=delta_tokens,
            logprobs=logprobs,
        )


class RequestGroup:
    """One submitted prompt and its ``n`` completions; the metrics count every completion's tokens.
    ``stop_token_ids``: the token ids that end a completion
    (the params' own, plus EOS unless ``ignore_eos``). Invariant: ``requests`` (the completions the
    scheduler knows, first one first) + ``unforked`` (built, not yet forked) hold ``n`` requests once
    ``create`` has built them, and ``unforked`` is empty once the first completion has a token."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        now: float,
        stop_token_ids: frozenset[int] = frozenset(),
    ):
        self.request_id = request_id
        self.stop_token_ids = stop_token_ids
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.requests: list[Request] = []
        self.unforked: list[Request] = []
        self.metrics = RequestMetrics(arrival_time=now, num_prompt_tokens=len(prompt_token_ids))
        self.output_kind: OutputKind = "cumulative"  # what ``Engine.step`` reports (outputs.OutputKind)
        self._emitted_times = 0  # token_times already handed out ("delta" kind)
        # engine/logprobs.py: filled by the step that computes each prompt position
        self.prompt_logprobs: list | None = None if params.prompt_logprobs is None else []

    @classmethod
    def create(
        cls,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None,
        now: float,
        new_ids: Iterator[int],
        tokenizer,
        vocab_size: int,
        max_model_len: int,
        eos_token_ids: frozenset[int],
    ) -> RequestGroup:
        """Validate one submission (text or token ids) and build its ``n`` requests: the first to schedule,
        the rest in ``unforked``. ``request_id`` None: the next of ``new_ids``, taken once the submission is
        valid. ``tokenizer``: None when the engine has none (token ids only, no stop strings). Raises
        ValueError (TypeError for params of the wrong type) naming what is wrong."""
        if tokenizer is None and (isinstance(prompt, str) or getattr(params, "stop", None)):
            raise ValueError(
                "this engine has no tokenizer (skip_tokenizer_init=True): "
                "give prompts as token ids, without stop strings"
            )
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: give at least one character or token id")
            text, token_ids = prompt, tokenizer.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
            if not token_ids:
                raise ValueError("prompt token id list is empty")
            bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {vocab_size}); got {bad[:5]}")
        if len(token_ids) >= max_model_len:
            raise ValueError(
                f"prompt is {len(token_ids)} tokens, but the context limit (max_model_len) is "
                f"{max_model_len} and one token must be left to generate"
            )
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if request_id is None:
            request_id = str(next(new_ids))
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eos_token_ids)
        group = cls(request_id, text, token_ids, params, now, stop_ids)
        for index in range(params.n):
            if tokenizer is None:
                detokenizer = NullDetokenizer()
            else:
                detokenizer = IncrementalDetokenizer(tokenizer.backend, group.prompt_token_ids, params.stop)
            name = request_id if index == 0 else f"{request_id}#{index}"
            (group.unforked if index else group.requests).append(Request(name, group, index, detokenizer))
        return group

    @property
    def finished(self) -> bool:
        return not self.unforked and all(r.finished for r in self.requests)

    def output(self, finished: bool) -> RequestOutput:
        """The group's output as of now, in its ``output_kind``; ``finished``: ``self.finished``, which the
        caller has at hand."""
        delta_only = self.output_kind == "delta"
        completions = [r.completion(delta_only) for r in self.requests]
        first_time = self._emitted_times if delta_only else 0
        self._emitted_times = len(self.metrics.token_times)
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            completions,
            finished,
            self.metrics.snapshot(first_time),
            None if self.prompt_logprobs is None else list(self.prompt_logprobs),
        )
