"""An OpenAI-compatible HTTP server on the engine: ``python -m solutions serve``.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON, or server-sent
events with ``"stream": true``), ``GET /health``, ``GET /metrics``. Every handler turns one API call into
engine requests, submits them to the one ``EngineLoop`` and reads their outputs back; it never steps the
engine. Errors leave as OpenAI error objects: 400 bad input, 401 wrong key, 404 unknown model, 500 a fault
inside this request (the engine goes on serving the rest).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from ..engine.outputs import CompletionOutput, RequestOutput
from ..llm import LLM
from ..model.loader import bundled_model_path
from .engine_loop import EngineLoop, RequestStream
from .metrics import ServerMetrics
from .protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    SamplingFields,
    chat_logprobs,
    completion_logprobs,
    error_body,
    new_id,
    now,
    usage,
)

log = logging.getLogger(__name__)


@dataclass
class ServerState:
    loop: EngineLoop
    model_name: str
    max_model_len: int
    api_key: str | None = None


def build_app(state: ServerState) -> FastAPI:
    """The FastAPI application; ``state.loop`` must be started before the first request."""
    app = FastAPI(title="Fast Mode", description="OpenAI-compatible server for the Fast Mode engine")
    app.state.server = state

    if state.api_key is not None:
        app.add_middleware(RequireAPIKey, api_key=state.api_key)

    @app.exception_handler(RequestValidationError)
    async def bad_body(_request: Request, error: RequestValidationError) -> JSONResponse:
        return _error(400, _describe_validation(error))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return _error(error.status_code, str(error.detail), kind)

    @app.exception_handler(APIError)
    async def api_error(_request: Request, error: APIError) -> JSONResponse:
        return _error(error.status, error.message, error.type, error.param)

    @app.exception_handler(Exception)
    async def internal_error(_request: Request, error: Exception) -> JSONResponse:
        log.exception("request failed")
        return _error(500, f"internal error while serving this request: {error!r}", "internal_server_error")

    @app.get("/health")
    async def health() -> Response:
        if not state.loop.alive:
            return _error(503, "the engine loop has stopped", "internal_server_error")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        body = state.loop.metrics.exposition() if state.loop.metrics else b""
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = ModelCard(id=state.model_name, max_model_len=state.max_model_len)
        return {"object": "list", "data": [card.model_dump()]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        _check_model(state, body)
        prompts = _bad_input(body.prompts)
        return await _serve(state, request, body, prompts, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        _check_model(state, body)
        conversation = _bad_input(body.conversation)
        tokenizer = state.loop.engine.tokenizer
        prompt = _bad_input(lambda: tokenizer.apply_chat_template(conversation))
        return await _serve(state, request, body, [prompt], chat=True)

    return app


class RequireAPIKey:
    """ASGI middleware: a ``/v1`` call without ``Authorization: Bearer <api_key>`` gets a 401 error object.

    Plain ASGI rather than ``@app.middleware("http")``: Starlette's ``BaseHTTPMiddleware`` relays every
    chunk of a streamed response through an extra task and memory stream, a cost paid per token."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
            if not secrets.compare_digest(given, self.expected):
                why = "no API key was given" if not given else "the API key is wrong"
                reply = _error(
                    401, f"{why}: send the header 'Authorization: Bearer <key>'", "authentication_error"
                )
                await reply(scope, receive, send)
                return
        await self.app(scope, receive, send)


# --- one API call: submit its engine requests, then answer as JSON or as a stream ---------------------------
async def _serve(state: ServerState, request: Request, body: SamplingFields, prompts: list, chat: bool):
    params = _bad_input(
        lambda: body.sampling_params(default_max_tokens=16 if not chat else state.max_model_len)
    )
    call_id = new_id("chatcmpl" if chat else "cmpl")
    n = params.n
    streams: list[tuple[int, RequestStream]] = []
    close_all = lambda: [stream.close() for _, stream in streams]
    try:
        # One engine request per prompt; it samples the prompt's n choices (choice j seeded seed + j).
        for i, prompt in enumerate(prompts):
            # A streamed answer reads only what each step added; a whole answer, only the finished output.
            kind = "delta" if body.stream else "final"
            stream = await _bad_input_async(state.loop.submit(prompt, params, f"{call_id}-{i}", kind))
            streams.append((i * n, stream))
    except BaseException:
        close_all()
        raise
    updates = _choice_updates(_merge(streams), n)
    num_choices = len(prompts) * n
    tokenizer = state.loop.engine.tokenizer
    shape = _Shape(chat, params.logprobs, getattr(body, "echo", False), tokenizer.decode)
    if body.stream:
        chunks = (_chat_chunks if chat else _completion_chunks)(
            updates, call_id, state.model_name, num_choices, body.include_usage, shape
        )
        return StreamingResponse(_sse(chunks, close_all), media_type="text/event-stream")
    try:
        return await _unless_disconnected(
            _collect(updates, call_id, state.model_name, num_choices, shape), request
        )
    finally:
        close_all()


@dataclass
class _ChoiceUpdate:
    """What one engine snapshot added to one choice of the response."""

    index: int  # the choice's index in the response: prompt * n + sample
    prompt_index: int
    num_prompt_tokens: int
    completion: CompletionOutput  # delta_text / delta_token_ids are the new part
    finished: bool  # True exactly once per choice, on the update that finished it
    output: RequestOutput  # its prompt, and prompt logprobs (echo)


@dataclass
class _Shape:
    """How a call's choices are written: chat or completions, ``num_logprobs`` (``SamplingParams.logprobs``;
    None: no logprobs) and completions' ``echo`` (the prompt first, with its logprobs when asked)."""

    chat: bool
    num_logprobs: int | None
    echo: bool
    decode: Callable[[list[int]], str]

    def prefix(self, update: _ChoiceUpdate) -> str:
        """The echoed prompt text ("" without echo)."""
        output = update.output
        if not self.echo:
            return ""
        return output.prompt if output.prompt is not None else self.decode(output.prompt_token_ids)

    def logprobs(self, update: _ChoiceUpdate, token_ids: list[int], entries: list, first: bool, offset: int):
        """``choice.logprobs`` for these tokens (None when not asked); ``first``: the choice's first piece,
        which carries the echoed prompt's entries."""
        if self.num_logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(token_ids, entries, self.num_logprobs)
        if first and self.echo:
            prompt = update.output.prompt_token_ids
            token_ids, entries = prompt + token_ids, update.output.prompt_logprobs + entries
        first_token = self.decode(token_ids[:1]) if token_ids else ""
        return completion_logprobs(token_ids, entries, self.num_logprobs, first_token, offset)


async def _choice_updates(
    events: AsyncIterator[tuple[int, RequestOutput]], n: int
) -> AsyncIterator[_ChoiceUpdate]:
    """Flatten engine snapshots (each holding one or more completions) into per-choice updates."""
    reported: set[int] = set()
    async for base, output in events:
        for completion in output.outputs:
            index = base + completion.index
            finished = completion.finish_reason is not None and index not in reported
            if finished:
                reported.add(index)
            if completion.delta_token_ids or completion.delta_text or finished:
                yield _ChoiceUpdate(
                    index, index // n, len(output.prompt_token_ids), completion, finished, output
                )


async def _collect(
    updates: AsyncIterator[_ChoiceUpdate], call_id: str, model: str, num_choices: int, shape: _Shape
) -> dict[str, Any]:
    final: dict[int, _ChoiceUpdate] = {}
    prompt_tokens: dict[int, int] = {}
    async for update in updates:
        prompt_tokens[update.prompt_index] = update.num_prompt_tokens
        if update.finished:
            final[update.index] = update
    choices = []
    chat = shape.chat
    for index in range(num_choices):
        update = final[index]
        completion = update.completion
        if chat:
            choice = {"index": index, "message": {"role": "assistant", "content": completion.text}}
        else:
            choice = {"index": index, "text": shape.prefix(update) + completion.text}
        logprobs = shape.logprobs(update, completion.token_ids, completion.logprobs, True, 0)
        choices.append({**choice, "logprobs": logprobs, "finish_reason": completion.finish_reason})
    completion_tokens = sum(len(u.completion.token_ids) for u in final.values())
    return {
        "id": call_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": now(),
        "model": model,
        "choices": choices,
        "usage": usage(sum(prompt_tokens.values()), completion_tokens),
    }


async def _completion_chunks(
    updates, call_id: str, model: str, num_choices: int, include_usage: bool, shape: _Shape
):
    created, prompt_tokens, completion_tokens = now(), {}, 0
    sent: dict[int, int] = {}  # the text length each choice has streamed (its next text_offset)
    async for update in updates:
        completion = update.completion
        prompt_tokens[update.prompt_index] = update.num_prompt_tokens
        completion_tokens += len(completion.delta_token_ids)
        finish_reason = completion.finish_reason if update.finished else None
        first = update.index not in sent
        text = (shape.prefix(update) if first else "") + completion.delta_text
        tokens = completion.delta_token_ids if shape.num_logprobs is not None else []
        if text or finish_reason or tokens:
            offset = sent.get(update.index, 0)
            logprobs = shape.logprobs(update, completion.delta_token_ids, completion.logprobs, first, offset)
            sent[update.index] = offset + len(text)
            choice = {"index": update.index, "text": text, "logprobs": logprobs}
            yield _chunk(
                call_id, "text_completion", created, model, {**choice, "finish_reason": finish_reason}
            )
    if include_usage:
        tokens = usage(sum(prompt_tokens.values()), completion_tokens)
        yield {
            "id": call_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [],
            "usage": tokens,
        }


async def _chat_chunks(
    updates, call_id: str, model: str, num_choices: int, include_usage: bool, shape: _Shape
):
    created, prompt_tokens, completion_tokens = now(), {}, 0
    kind = "chat.completion.chunk"
    for index in range(num_choices):  # the role comes first, once per choice, as OpenAI sends it
        yield _chunk(call_id, kind, created, model, _delta(index, {"role": "assistant", "content": ""}, None))
    async for update in updates:
        completion = update.completion
        prompt_tokens[update.prompt_index] = update.num_prompt_tokens
        completion_tokens += len(completion.delta_token_ids)
        tokens = completion.delta_token_ids if shape.num_logprobs is not None else []
        if completion.delta_text or tokens:
            logprobs = shape.logprobs(update, tokens, completion.logprobs, False, 0)
            delta = _delta(update.index, {"content": completion.delta_text}, None, logprobs)
            yield _chunk(call_id, kind, created, model, delta)
        if update.finished:
            yield _chunk(call_id, kind, created, model, _delta(update.index, {}, completion.finish_reason))
    if include_usage:
        tokens = usage(sum(prompt_tokens.values()), completion_tokens)
        yield {
            "id": call_id,
            "object": kind,
            "created": created,
            "model": model,
            "choices": [],
            "usage": tokens,
        }


def _delta(
    index: int, delta: dict[str, str], finish_reason: str | None, logprobs: dict | None = None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}


def _chunk(call_id: str, kind: str, created: int, model: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "object": kind, "created": created, "model": model, "choices": [choice]}


async def _sse(chunks: AsyncIterator[dict[str, Any]], close_all: Callable[[], object]) -> AsyncIterator[str]:
    """Server-sent events: one ``data: <json>`` per chunk, then ``data: [DONE]``. A fault mid-stream is sent
    as an error object (the status line has already gone out), which the openai client raises. A client
    that hangs up cancels this generator: ``close_all`` then aborts its engine requests."""
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
    except Exception as error:  # noqa: BLE001 - reported to this client, the server goes on
        log.exception("stream failed")
        body = error_body(500, f"internal error while streaming: {error!r}", "internal_server_error")
        yield f"data: {json.dumps(body)}\n\n"
    finally:
        close_all()
    yield "data: [DONE]\n\n"


async def _merge(streams: list[tuple[int, RequestStream]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several requests' outputs as they come, tagged with their choice index."""
    if len(streams) == 1:
        index, stream = streams[0]
        async for output in stream:
            yield index, output
        return
    merged: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                merged.put_nowait((index, output))
            merged.put_nowait(done)
        except Exception as error:  # noqa: BLE001 - re-raised by the reader below
            merged.put_nowait(error)

    tasks = [asyncio.create_task(pump(index, stream)) for index, stream in streams]
    try:
        remaining = len(tasks)
        while remaining:
            item = await merged.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


async def _unless_disconnected(work: Awaitable[dict[str, Any]], request: Request) -> Any:
    """Run a non-streaming call, but cancel it if the client hangs up first (the caller then aborts)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait([task, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return Response(status_code=499)  # nobody is listening; the status only shows in the access log
    return task.result()


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# --- validation helpers -------------------------------------------------------------------------------------
def _check_model(state: ServerState, body: SamplingFields) -> None:
    if body.model != state.model_name:
        raise APIError(
            404,
            f"the model `{body.model}` does not exist; "
            f"this server serves `{state.model_name}` (see /v1/models)",
            "not_found_error",
            "model",
        )


def _bad_input(make):
    """Call ``make()``; a ValueError or TypeError there is the client's mistake: 400 with its message."""
    try:
        return make()
    except (ValueError, TypeError) as error:
        raise APIError(400, str(error)) from error


async def _bad_input_async(awaitable):
    try:
        return await awaitable
    except (ValueError, TypeError) as error:
        raise APIError(400, str(error)) from error


def _describe_validation(error: RequestValidationError) -> str:
    problems = []
    for item in error.errors():
        if item.get("type") == "json_invalid":
            return f"the request body is not valid JSON: {item.get('ctx', {}).get('error', item.get('msg'))}"
        where = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        problems.append(f"{where or 'body'}: {item.get('msg')}")
    return "invalid request: " + "; ".join(problems)


def _error(
    status: int, message: str, type: str = "invalid_request_error", param: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, type, param), status_code=status)


# --- the process --------------------------------------------------------------------------------------------
def run_server(
    engine_options: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str | None = None,
    log_level: str = "info",
) -> None:
    """Load the model, start the engine loop, serve until interrupted (Ctrl-C), then stop the loop."""
    import uvicorn

    model = engine_options.get("model")
    name = served_model_name or Path(model or bundled_model_path()).stem
    loop = EngineLoop(lambda: LLM(**engine_options).engine, ServerMetrics(name))
    engine = loop.start()  # the engine thread builds the engine (see engine_loop.py)
    max_model_len = min(engine.config.max_model_len, engine.model_config.max_position_embeddings)
    app = build_app(ServerState(loop, name, max_model_len, api_key))
    print(f"Serving {name} at http://{host}:{port}/v1 (max_model_len {max_model_len})", flush=True)
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        loop.stop()
