"""One thread owns the engine and steps it; every connection only submits requests and reads their outputs.

Continuous batching across connections needs exactly one place that calls ``Engine.step()``: requests
that arrive while a step runs join the next one. Handlers (on the asyncio event loop) talk to the engine
thread through an inbox of commands; the thread answers each request through its own ``asyncio.Queue``
(``call_soon_threadsafe``), so no engine state is ever touched from two threads.

Invariants: every engine call happens on the engine thread; a request's queue receives its snapshots in
order, ending with a finished one or an exception; a request whose reader goes away is aborted, which
frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass

from ..engine.engine import Engine
from ..engine.outputs import RequestOutput
from ..engine.sampling_params import SamplingParams
from .metrics import ServerMetrics

log = logging.getLogger(__name__)


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    outputs: asyncio.Queue
    accepted: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class _Abort:
    request_id: str


class EngineLoop:
    """``stream = await loop.submit(prompt, params, request_id)``, then ``async for output in stream``.

    ``start()`` launches the engine thread; ``stop()`` ends it (aborting whatever is in flight).
    """

    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None):
        self.engine = engine
        self.metrics = metrics
        self._inbox: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._live: dict[str, _Add] = {}  # requests in the engine, by id (engine thread only)
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._stopping = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    async def submit(self, prompt: str | list[int], params: SamplingParams, request_id: str) -> RequestStream:
        """Queue one request; returns once the engine has accepted it, with the stream of its outputs.

        Raises what ``Engine.add_request`` raised (ValueError for a bad prompt, so the caller can answer 400
        before any output exists). Cancelled while waiting, it aborts the request.
        """
        if not self.alive:
            raise RuntimeError("the engine loop is not running")
        loop = asyncio.get_running_loop()
        command = _Add(request_id, prompt, params, asyncio.Queue(), loop.create_future(), loop)
        self._inbox.put(command)
        try:
            await command.accepted
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return RequestStream(self, command)

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    # --- the engine thread -------------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                if not engine.has_unfinished_requests():
                    command = self._inbox.get()  # idle: sleep until a command comes
                    if command is None:
                        break
                    self._handle(command)
                if not self._drain_inbox():
                    break
                if engine.has_unfinished_requests():
                    self._step()
        except Exception:
            log.exception("the engine loop died; /health now answers 503")
            raise
        finally:
            self._stopping = True
            self._shutdown()

    def _drain_inbox(self) -> bool:
        """Handle every command that arrived while the last step ran; False once asked to stop."""
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return True
            if command is None:
                return False
            self._handle(command)

    def _handle(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            if self._live.pop(command.request_id, None) is not None:
                self.engine.abort(command.request_id)
            self._record_stats()
            return
        try:
            self.engine.add_request(command.prompt, command.params, command.request_id)
        except Exception as error:  # noqa: BLE001 - the error belongs to this request alone
            command.loop.call_soon_threadsafe(_settle, command.accepted, error)
            return
        self._live[command.request_id] = command
        command.loop.call_soon_threadsafe(_settle, command.accepted, None)
        self._record_stats()

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as error:  # noqa: BLE001
            # A failed step leaves no way to tell which request caused it: fail those in flight, keep serving.
            log.exception("engine step failed; failing the %d requests in flight", len(self._live))
            failed = RuntimeError(f"the engine failed while running this request: {error!r}")
            for request_id, command in list(self._live.items()):
                self.engine.abort(request_id)
                command.loop.call_soon_threadsafe(command.outputs.put_nowait, failed)
            self._live.clear()
            return
        for output in outputs:
            command = self._live.get(output.request_id)
            if command is None:
                continue  # aborted while the step ran
            if output.finished:
                del self._live[output.request_id]
                if self.metrics is not None:
                    self.metrics.record_finished(output)
            command.loop.call_soon_threadsafe(command.outputs.put_nowait, output)
        if self.metrics is not None:
            self.metrics.record_step(outputs)
        self._record_stats()

    def _record_stats(self) -> None:
        if self.metrics is not None:
            self.metrics.record_stats(self.engine.stats())

    def _shutdown(self) -> None:
        stopped = RuntimeError("the server is shutting down")
        for request_id, command in self._live.items():
            self.engine.abort(request_id)
            command.loop.call_soon_threadsafe(command.outputs.put_nowait, stopped)
        self._live.clear()


class RequestStream:
    """``async for output in stream``: one request's snapshots, the last one finished.

    ``close()`` (idempotent) aborts the request if it has not finished and ends the iteration; call it
    whenever the reader stops early, or iterates no more (a client gone).
    """

    def __init__(self, engine_loop: EngineLoop, command: _Add):
        self.request_id = command.request_id
        self._engine_loop = engine_loop
        self._outputs = command.outputs
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._outputs.get()
        if item is None:  # closed by the reader
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine_loop.abort(self.request_id)
            self._outputs.put_nowait(None)  # wakes a reader still waiting


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():  # the handler was cancelled while waiting
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
