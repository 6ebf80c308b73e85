"""The engine loop: admit requests, and each ``step()`` schedule, run the model, sample, and emit outputs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ..config import EngineConfig
from ..model.llama import LlamaModel
from ..model.loader import load_weights
from .outputs import RequestOutput
from .request import Request
from .runner import ModelRunner
from .sampler import sample
from .sampling_params import SamplingParams
from .scheduler import StaticBatchScheduler


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        weights = load_weights(config.model, load_tokenizer=not config.skip_tokenizer_init)
        self.model_config = weights.config
        self.tokenizer = None if config.skip_tokenizer_init else weights.tokenizer
        self.eos_token_id = weights.config.eos_token_id if self.tokenizer is None else self.tokenizer.eos_token_id
        self.model = LlamaModel.from_state_dict(weights.config, weights.state_dict, config.device, config.torch_dtype)
        if config.quantization:
            from ..quant.model import quantize_named_model  # here, so `python -m solutions.quant.awq` imports it once

            quantize_named_model(self.model, weights.source.stem, config.quantization, config.w_bit, config.group_size)
        self.max_model_len = min(config.max_model_len, weights.config.max_position_embeddings)
        self.runner = ModelRunner(self.model, config.max_num_seqs, self.max_model_len, config.attention_backend)
        self.scheduler = StaticBatchScheduler(config.max_num_seqs)
        self._ids = itertools.count()
        self.requests: dict[str, Request] = {}  # unfinished requests by id

    def add_requests(
        self, prompts: list[str | list[int]], params: list[SamplingParams], request_ids: list[str | None] | None = None
    ) -> list[Request]:
        """Validate every prompt, then queue them all: a bad prompt raises before any is queued."""
        ids = request_ids or [None] * len(prompts)
        requests = [self._new_request(*args) for args in zip(prompts, params, ids, strict=True)]
        for request in requests:
            self.requests[request.request_id] = request
            self.scheduler.add(request)
        return requests

    def add_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None) -> str:
        """Queue one request; returns its id (``request_id`` if given: it must not be in use)."""
        return self.add_requests([prompt], [params], [request_id])[0].request_id

    def abort(self, request_ids: str | list[str]) -> None:
        """Drop unfinished requests (a stream closed early, a client gone) and free their cache slots."""
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            request = self.requests.pop(request_id, None)
            if request is not None and not request.finished:
                self.scheduler.abort(request)

    def _new_request(self, prompt: str | list[int], params: SamplingParams, request_id: str | None) -> Request:
        """Validate one prompt (text or token ids). Raises ValueError naming what is wrong."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer (skip_tokenizer_init=True): give prompts as token ids")
            if not prompt:
                raise ValueError("prompt is empty: give at least one character or token id")
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
            vocab = self.model_config.vocab_size
            if not token_ids:
                raise ValueError("prompt token id list is empty")
            bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt is {len(token_ids)} tokens, but the context limit (max_model_len) is "
                f"{self.max_model_len} and one token must be left to generate"
            )
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if request_id is None:
            request_id = str(next(self._ids))
        elif request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        return Request(request_id, text, token_ids, params)

    def stats(self) -> EngineStats:
        """What a metrics endpoint reports: queue lengths and KV cache use, right now."""
        scheduler = self.scheduler
        total = self.config.max_num_seqs
        return EngineStats(
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            kv_blocks_used=total - len(scheduler.free_slots),
            kv_blocks_total=total,
        )

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return a snapshot of every request that advanced in it."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        logits = self.runner.run(batch.requests)
        tokens = sample(logits, [r.params for r in batch.requests], [r.generator for r in batch.requests])
        outputs = []
        for request, token in zip(batch.requests, tokens):
            text = self.tokenizer.decode(request.output_token_ids + [token]) if self.tokenizer else ""
            request.append_token(token, text, self.eos_token_id, self.max_model_len)
            if request.finished:
                self.scheduler.finish(request)
                del self.requests[request.request_id]
            outputs.append(request.output())
        return outputs
