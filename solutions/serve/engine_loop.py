"""One thread owns the engine and steps it; every connection only submits requests and reads their outputs.

Continuous batching across connections needs exactly one place that calls ``Engine.step()``: requests
that arrive while a step runs join the next one. Handlers (on the asyncio event loop) talk to the engine
thread through an inbox of commands; the thread hands each step's snapshots to the event loop in one
batch (one ``call_soon_threadsafe``, so one wake-up of the loop per step, not one per request), which
files each snapshot in its request's ``Mailbox``. No engine state is ever touched from two threads.

A reader that falls behind (its client reads slower than the engine steps) finds several snapshots of
its request waiting; it takes them as one, whose deltas hold all the new text (vLLM streams the same
way: one server-sent event may carry several tokens), so a slow reader costs one chunk per wake-up,
not one per step.

The engine thread also builds the engine. torch's CPU thread pool (OpenMP) belongs to the thread that
first runs an op, so building the engine on the thread that steps it keeps one pool, as in an offline
``LLM.generate``. Built elsewhere, the process would hold two pools, and libgomp, managing more threads than
cores, shortens how long its workers spin between parallel regions: the server's steps would then run
under other rules than the offline ones it is compared with (faster on a crowded machine, slower on a
quiet one).

Invariants: every engine call happens on the engine thread; a request's mailbox receives its snapshots
in order, ending with a finished one or an exception; a request whose reader goes away is aborted, which
frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..engine.engine import Engine
from ..engine.outputs import CompletionOutput, OutputKind, RequestOutput
from ..sampling_params import SamplingParams
from .metrics import ServerMetrics

log = logging.getLogger(__name__)


class Mailbox:
    """One request's snapshots on their way to its reader; used on the event loop's thread only.

    ``put`` files an item (a ``RequestOutput``, an exception, or None for "closed by the reader") and
    wakes the reader; ``take`` waits for at least one item and returns every item waiting, in order.
    """

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None

    def put(self, item: RequestOutput | BaseException | None) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list[RequestOutput | BaseException | None]:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items = list(self._items)
        self._items.clear()
        return items


@dataclass
class _Add:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    mailbox: Mailbox
    accepted: asyncio.Future
    loop: asyncio.AbstractEventLoop
    output_kind: OutputKind


@dataclass
class _Abort:
    request_id: str


class EngineLoop:
    """``stream = await loop.submit(prompt, params, request_id, output_kind)``, then ``async for output in
    stream``.

    ``start()`` launches the engine thread, which builds the engine with ``make_engine()``, and returns it
    once built; ``stop()`` ends the thread (aborting whatever is in flight).
    """

    def __init__(self, make_engine: Callable[[], Engine], metrics: ServerMetrics | None = None):
        self._make_engine = make_engine
        self.engine: Engine | None = None  # set by the engine thread before start() returns
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        self.metrics = metrics
        self._inbox: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._live: dict[str, _Add] = {}  # requests in the engine, by id (engine thread only)
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._stopping = False

    def start(self) -> Engine:
        """Start the engine thread; return its engine once built, or raise what building it raised."""
        self._thread.start()
        self._built.wait()
        if self._build_error is not None:
            raise self._build_error
        return self.engine

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(None)
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    async def submit(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        output_kind: OutputKind = "cumulative",
    ) -> RequestStream:
        """Queue one request; returns once the engine has accepted it, with the stream of its outputs (of
        ``output_kind``: ``outputs.OutputKind``).

        Raises what ``Engine.add_request`` raised (ValueError for a bad prompt, so the caller can answer 400
        before any output exists). Cancelled while waiting, it aborts the request.
        """
        if not self.alive:
            raise RuntimeError("the engine loop is not running")
        loop = asyncio.get_running_loop()
        command = _Add(request_id, prompt, params, Mailbox(), loop.create_future(), loop, output_kind)
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
        try:
            self.engine = engine = self._make_engine()
        except BaseException as error:  # noqa: BLE001 - start() re-raises it on the caller's thread
            self._build_error, self._stopping = error, True
            return
        finally:
            self._built.set()
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
            self.engine.add_request(
                command.prompt, command.params, command.request_id, output_kind=command.output_kind
            )
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
            for request_id in self._live:
                self.engine.abort(request_id)
            self._deliver([(command, failed) for command in self._live.values()])
            self._live.clear()
            return
        deliveries = []
        for output in outputs:
            command = self._live.get(output.request_id)
            if command is None:
                continue  # aborted while the step ran
            if output.finished:
                del self._live[output.request_id]
                if self.metrics is not None:
                    self.metrics.record_finished(output)
            deliveries.append((command, output))
        self._deliver(deliveries)
        if self.metrics is not None:
            self.metrics.record_step(outputs)
        self._record_stats()

    @staticmethod
    def _deliver(deliveries: list[tuple[_Add, RequestOutput | BaseException]]) -> None:
        """Hand a step's items to the event loop(s) of their readers: one wake-up per loop, not per item."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Mailbox, RequestOutput | BaseException]]] = {}
        for command, item in deliveries:
            by_loop.setdefault(command.loop, []).append((command.mailbox, item))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_file, items)

    def _record_stats(self) -> None:
        if self.metrics is not None:
            self.metrics.record_stats(self.engine.stats())

    def _shutdown(self) -> None:
        stopped = RuntimeError("the server is shutting down")
        for request_id in self._live:
            self.engine.abort(request_id)
        self._deliver([(command, stopped) for command in self._live.values()])
        self._live.clear()


class RequestStream:
    """``async for output in stream``: one request's snapshots, the last one finished.

    Snapshots that piled up while the reader was busy come out as one (``coalesce``). ``close()``
    (idempotent) aborts the request if it has not finished and ends the iteration; call it whenever the
    reader stops early, or iterates no more (a client gone).
    """

    def __init__(self, engine_loop: EngineLoop, command: _Add):
        self.request_id = command.request_id
        self._engine_loop = engine_loop
        self._mailbox = command.mailbox
        self._delta_only = command.output_kind == "delta"
        self._pending: collections.deque = collections.deque()
        self.finished = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        if not self._pending:
            self._pending.extend(await self._mailbox.take())
        item = self._pending.popleft()
        if item is None:  # closed by the reader
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        while self._pending and isinstance(self._pending[0], RequestOutput):
            item = coalesce(item, self._pending.popleft(), self._delta_only)
        self.finished = item.finished
        return item

    def close(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine_loop.abort(self.request_id)
            self._mailbox.put(None)  # wakes a reader still waiting


def coalesce(older: RequestOutput, newer: RequestOutput, delta_only: bool = False) -> RequestOutput:
    """Two consecutive snapshots of one request as one: ``newer``, with each completion's deltas grown to
    hold everything added since ``older``'s predecessor (a completion new in ``newer`` keeps its own). In the
    "delta" output kind (``delta_only``), whose text, token ids and token times are deltas too, so are
    they."""
    before = {c.index: c for c in older.outputs}
    completions = []
    for completion in newer.outputs:
        earlier: CompletionOutput | None = before.get(completion.index)
        if earlier is not None:
            grown = {}
            if delta_only:
                grown = dict(
                    text=earlier.text + completion.text, token_ids=earlier.token_ids + completion.token_ids
                )
            completion = replace(
                completion,
                delta_text=earlier.delta_text + completion.delta_text,
                delta_token_ids=earlier.delta_token_ids + completion.delta_token_ids,
                **grown,
            )
        completions.append(completion)
    metrics = newer.metrics
    if delta_only:
        metrics = replace(metrics, token_times=older.metrics.token_times + metrics.token_times)
    return replace(newer, outputs=completions, metrics=metrics)


def _file(items: list[tuple[Mailbox, RequestOutput | BaseException]]) -> None:
    for mailbox, item in items:
        mailbox.put(item)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():  # the handler was cancelled while waiting
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
