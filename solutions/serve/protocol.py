"""The OpenAI wire format: request bodies (validated by pydantic), their mapping to ``SamplingParams``, and
the JSON the server sends back (responses, stream chunks, error objects).

Only the fields the engine honours are declared; unknown fields are ignored, as OpenAI's own server does.
``top_k`` and ``ignore_eos`` are vLLM's extra fields (the openai client sends them through ``extra_body``).
Log-probabilities (engine/logprobs.py): chat ``logprobs: bool`` + ``top_logprobs: 0..20``; completions
``logprobs: 0..20`` (OpenAI's limit is 5, vLLM's 20) + ``echo`` (the prompt's own logprobs, its first None).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from ..engine.logprobs import Logprob
from ..sampling_params import SamplingParams, check_num_logprobs


class APIError(Exception):
    """An error the client caused or should see: becomes an OpenAI error object with this HTTP status."""

    def __init__(
        self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param


def error_body(status: int, message: str, type: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": status}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions, with OpenAI's defaults."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extra sampling fields
    top_k: int | None = None
    ignore_eos: bool = False

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        """The engine's ``SamplingParams``; it raises ValueError naming any bad value."""
        max_tokens = self.output_limit()
        return SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            max_tokens=default_max_tokens if max_tokens is None else max_tokens,
            stop=[] if self.stop is None else self.stop,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            **self.logprob_params(),
        )

    def logprob_params(self) -> dict[str, int | None]:
        """``SamplingParams``' ``logprobs`` / ``prompt_logprobs`` for this request (ValueError naming the
        field when out of range)."""
        return {}

    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: one prompt (text or token ids) or a list of them."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, strict=True)
    echo: bool = Field(False, strict=True)

    def logprob_params(self) -> dict[str, int | None]:
        check_num_logprobs("logprobs", self.logprobs)
        return {"logprobs": self.logprobs, "prompt_logprobs": self.logprobs if self.echo else None}

    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]
        if not prompt:
            raise ValueError(
                "prompt is empty: give a string, a list of token ids, or a non-empty list of them"
            )
        return list(prompt)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]]

    def text(self) -> str:
        """The content as text; a list of parts must hold only ``{"type": "text", "text": ...}`` parts."""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"only text content parts are supported, got {part.get('type')!r}")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``: a conversation rendered with the model's chat template."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = Field(False, strict=True)
    top_logprobs: int | None = Field(None, strict=True)

    def logprob_params(self) -> dict[str, int | None]:
        check_num_logprobs("top_logprobs", self.top_logprobs)
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        return {"logprobs": (self.top_logprobs or 0) if self.logprobs else None}

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def conversation(self) -> list[dict[str, str]]:
        if not self.messages:
            raise ValueError("messages is empty: a chat completion needs at least one message")
        return [{"role": m.role, "content": m.text()} for m in self.messages]


def _token(logprob: Logprob, token_id: int) -> str:
    return logprob.decoded_token if logprob.decoded_token is not None else str(token_id)


def _top(entry: dict[int, Logprob], num: int) -> list[tuple[int, Logprob]]:
    """The top ``num`` alternatives of one entry, most likely first (the sampled token if among them)."""
    return sorted(((t, lp) for t, lp in entry.items() if lp.rank <= num), key=lambda item: item[1].rank)


def chat_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], num: int) -> dict[str, Any]:
    """OpenAI chat's ``choice.logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``, the top
    ``num`` in each."""

    def one(token_id: int, lp: Logprob) -> dict[str, Any]:
        text = _token(lp, token_id)
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {**one(t, entry[t]), "top_logprobs": [one(a, lp) for a, lp in _top(entry, num)]}
            for t, entry in zip(token_ids, entries, strict=True)
        ]
    }


def completion_logprobs(
    token_ids: list[int],
    entries: list[dict[int, Logprob] | None],
    num: int,
    first_token: str = "",
    offset: int = 0,
) -> dict[str, Any]:
    """OpenAI completions' ``choice.logprobs``: parallel lists ``tokens``, ``token_logprobs``,
    ``top_logprobs`` (the top ``num``, ``{token: logprob}``) and ``text_offset`` (from ``offset``); an entry
    None (an echoed
    prompt's first token, named ``first_token``) has null logprobs."""
    tokens, values, tops, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = first_token if entry is None else _token(entry[token_id], token_id)
        tokens.append(text)
        values.append(None if entry is None else entry[token_id].logprob)
        tops.append(None if entry is None else {_token(lp, a): lp.logprob for a, lp in _top(entry, num)})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "fastmode"
    max_model_len: int
