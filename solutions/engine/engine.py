"""The engine loop: admit requests, and each ``step()`` schedule, run the model, sample, and emit outputs."""

from __future__ import annotations

import itertools

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


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        weights = load_weights(config.model)
        self.model_config = weights.config
        self.tokenizer = weights.tokenizer
        self.model = LlamaModel.from_state_dict(weights.config, weights.state_dict, config.device, config.torch_dtype)
        if config.quantization:
            from ..quant.model import quantize_named_model  # here, so `python -m solutions.quant.awq` imports it once

            quantize_named_model(self.model, weights.source.stem, config.quantization, config.w_bit, config.group_size)
        self.max_model_len = min(config.max_model_len, weights.config.max_position_embeddings)
        self.runner = ModelRunner(self.model, config.max_num_seqs, self.max_model_len, config.attention_backend)
        self.scheduler = StaticBatchScheduler(config.max_num_seqs)
        self._ids = itertools.count()

    def add_requests(self, prompts: list[str | list[int]], params: list[SamplingParams]) -> list[Request]:
        """Validate every prompt, then queue them all: a bad prompt raises before any is queued."""
        requests = [self._new_request(prompt, p) for prompt, p in zip(prompts, params, strict=True)]
        for request in requests:
            self.scheduler.add(request)
        return requests

    def add_request(self, prompt: str | list[int], params: SamplingParams) -> Request:
        return self.add_requests([prompt], [params])[0]

    def abort(self, requests: list[Request]) -> None:
        """Drop unfinished requests (a stream closed early) and free their cache slots."""
        for request in requests:
            if not request.finished:
                self.scheduler.abort(request)

    def _new_request(self, prompt: str | list[int], params: SamplingParams) -> Request:
        """Validate one prompt (text or token ids). Raises ValueError naming what is wrong."""
        if isinstance(prompt, str):
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
        return Request(str(next(self._ids)), text, token_ids, params)

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
            text = self.tokenizer.decode(request.output_token_ids + [token])
            request.append_token(token, text, self.tokenizer.eos_token_id, self.max_model_len)
            if request.finished:
                self.scheduler.finish(request)
            outputs.append(request.output())
        return outputs
