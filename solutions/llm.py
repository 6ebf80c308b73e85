"""The offline API, shaped like vLLM's: ``LLM(...).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from tqdm.auto import tqdm

from .config import EngineConfig
from .engine.engine import Engine
from .engine.outputs import OutputKind, RequestOutput
from .sampling_params import SamplingParams

Prompt = str | list[int]
Conversation = list[dict[str, str]]


class LLM:
    """``LLM()`` loads the bundled SmolLM2-135M-Instruct;
    ``model=`` takes a .gguf file or a HF checkpoint folder.

    Every keyword is an ``EngineConfig`` field (device, dtype, max_num_seqs, max_model_len, ...).
    """

    def __init__(self, model: str | None = None, **options):
        self.engine = Engine(EngineConfig(model=model, **options))
        self.tokenizer = self.engine.tokenizer

    def shutdown(self) -> None:
        """End the engine's worker processes (tensor parallelism; nothing to do on one device).
        They also end when the ``LLM`` is garbage collected and when the interpreter exits; the ``LLM``
        cannot generate after this."""
        if self.engine.workers is not None:
            self.engine.workers.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion with continuous batching; outputs come back in prompt order.

        ``use_tqdm`` shows a progress bar over finished requests (default: for more than 8 prompts)."""
        final: dict[str, RequestOutput] = {}
        order: list[str] = []
        stream = self._stream(prompts, sampling_params, order, "final")
        first = next(stream, None)
        show = len(order) > 8 if use_tqdm is None else use_tqdm
        with tqdm(total=len(order), desc="Processed prompts", unit="req", disable=not show) as progress:
            for output in itertools.chain([first] if first else [], stream):
                if output.finished:
                    final[output.request_id] = output
                    progress.update(1)
        return [final[request_id] for request_id in order]

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[RequestOutput]:
        """Yield a snapshot each time a request gains a token; ``outputs[0].delta_text`` is the new text."""
        return self._stream(prompts, sampling_params, [])

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate the assistant's reply to one conversation or a list of them
        (the model's chat template)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self.tokenizer.apply_chat_template(c) for c in conversations]
        return self.generate(prompts, sampling_params)

    def _stream(
        self, prompts, sampling_params, order: list[str], output_kind: OutputKind = "cumulative"
    ) -> Iterator[RequestOutput]:
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise ValueError(
                "no prompts given: pass a string, a list of token ids, or a non-empty list of them"
            )
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            [sampling_params] * len(prompts)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        if self.engine.has_unfinished_requests():
            raise RuntimeError("the engine is still running an earlier batch (an unfinished stream?)")
        engine = self.engine
        request_ids = engine.add_requests(prompts, params, output_kind=output_kind)
        order.extend(request_ids)
        try:
            while engine.has_unfinished_requests():
                yield from engine.step()
        finally:
            engine.abort(request_ids)
