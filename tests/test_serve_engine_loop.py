"""The server's engine thread against a scripted stand-in engine (no model): which thread builds and steps
the engine, one loop wake-up per step, coalesced snapshots for a reader that fell behind, aborts."""

from __future__ import annotations

import asyncio
import threading

import pytest


class ScriptedEngine:
    """Each request yields the words of its prompt, one per step; records which threads touched it."""

    def __init__(self, outputs_module):
        self.out = outputs_module
        self.threads: set[str] = {threading.current_thread().name}
        self.words: dict[str, list[str]] = {}
        self.done: dict[str, list[str]] = {}
        self.aborted: list[str] = []
        self.step_gate: threading.Semaphore | None = None  # when set, each step waits for a release
        self.hold = False  # True: claims to have no work, so requests are accepted but not stepped

    def add_request(self, prompt, params, request_id, output_kind="cumulative"):
        self.threads.add(threading.current_thread().name)
        if not prompt:
            raise ValueError("prompt is empty")
        self.words[request_id], self.done[request_id] = prompt.split(), []

    def abort(self, request_id):
        self.threads.add(threading.current_thread().name)
        self.aborted.append(request_id)
        self.words.pop(request_id, None)

    def has_unfinished_requests(self):
        return bool(self.words) and not self.hold

    def stats(self):
        return None

    def step(self):
        self.threads.add(threading.current_thread().name)
        if self.step_gate is not None:
            self.step_gate.acquire()
        outputs = []
        for request_id, words in list(self.words.items()):
            word = words.pop(0)
            self.done[request_id].append(word)
            finished = not words
            text = " ".join(self.done[request_id])
            delta = word if len(self.done[request_id]) == 1 else " " + word
            token = len(self.done[request_id])
            completion = self.out.CompletionOutput(
                0, text, list(range(1, token + 1)), "length" if finished else None, None, delta, [token]
            )
            metrics = self.out.RequestMetrics(arrival_time=0.0)
            outputs.append(self.out.RequestOutput(request_id, None, [0], [completion], finished, metrics))
            if finished:
                del self.words[request_id]
        return outputs


@pytest.fixture
def engine_loop(load):
    module = load("serve.engine_loop")
    engines = []

    def make():
        engines.append(ScriptedEngine(load("engine.outputs")))
        return engines[0]

    loop = module.EngineLoop(make)
    engine = loop.start()
    assert engine is engines[0]
    yield loop, engine
    loop.stop()


def _params(load):
    return load("sampling_params").SamplingParams(max_tokens=8)


def test_the_engine_thread_builds_and_alone_touches_the_engine(engine_loop, load):
    loop, engine = engine_loop

    async def run():
        stream = await loop.submit("one two three", _params(load), "a")
        return [output async for output in stream]

    outputs = asyncio.run(run())  # however the snapshots were coalesced, the deltas add up to the text
    assert "".join(o.outputs[0].delta_text for o in outputs) == "one two three" == outputs[-1].outputs[0].text
    assert outputs[-1].finished and not any(o.finished for o in outputs[:-1])
    assert engine.threads == {"engine-loop"}


def test_a_bad_prompt_raises_from_submit_and_the_loop_keeps_serving(engine_loop, load):
    loop, _ = engine_loop

    async def run():
        with pytest.raises(ValueError, match="empty"):
            await loop.submit("", _params(load), "bad")
        stream = await loop.submit("still here", _params(load), "good")
        return [o.outputs[0].text async for o in stream][-1]

    assert asyncio.run(run()) == "still here"


def test_one_loop_wakeup_per_step_and_a_late_reader_gets_one_coalesced_snapshot(engine_loop, load):
    loop, engine = engine_loop
    engine.step_gate = threading.Semaphore(0)

    async def run():
        event_loop = asyncio.get_running_loop()
        wakeups = []
        original = event_loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):
            wakeups.append(callback.__name__)
            return original(callback, *args, **kwargs)

        event_loop.call_soon_threadsafe = counting
        engine.hold = True
        streams = [await loop.submit(f"w{i} x{i} y{i} z{i}", _params(load), f"r{i}") for i in range(3)]
        engine.hold = False
        engine.step_gate.release(3)  # three steps of all three requests run while nobody reads
        loop.abort("no such request")  # a command, to wake the idle engine thread
        while sum(name == "_file" for name in wakeups) < 3:
            await asyncio.sleep(0.01)
        first = await streams[0].__anext__()  # all three snapshots of r0 as one
        engine.step_gate.release(100)
        rest = [[o async for o in stream] for stream in streams]
        return wakeups, first, rest

    wakeups, first, rest = asyncio.run(run())
    assert wakeups.count("_file") == 4  # one per step, whatever the number of requests in it
    assert first.outputs[0].delta_text == "w0 x0 y0" and first.outputs[0].delta_token_ids == [1, 2, 3]
    assert first.outputs[0].text == "w0 x0 y0" and not first.finished
    assert [o.outputs[0].delta_text for o in rest[0]] == [" z0"] and rest[0][-1].finished
    for i in (1, 2):  # the readers that waited longer catch up in one snapshot holding every word
        (only,) = rest[i]
        assert only.finished and only.outputs[0].delta_text == f"w{i} x{i} y{i} z{i}"
        assert (
            only.outputs[0].delta_token_ids == [1, 2, 3, 4] and only.outputs[0].text == f"w{i} x{i} y{i} z{i}"
        )


def test_closing_a_stream_aborts_its_request(engine_loop, load):
    loop, engine = engine_loop
    engine.step_gate = threading.Semaphore(0)

    async def run():
        stream = await loop.submit("a b c d e f", _params(load), "gone")
        engine.step_gate.release(1)
        first = await stream.__anext__()
        stream.close()
        remaining = [o async for o in stream]
        engine.step_gate.release(100)
        while "gone" in engine.words:
            await asyncio.sleep(0.01)
        return first, remaining

    first, remaining = asyncio.run(run())
    assert first.outputs[0].delta_text == "a" and remaining == []
    assert engine.aborted == ["gone"] and engine.threads == {"engine-loop"}


def test_an_engine_that_fails_to_build_fails_start(load):
    module = load("serve.engine_loop")

    def make():
        raise RuntimeError("no model here")

    loop = module.EngineLoop(make)
    with pytest.raises(RuntimeError, match="no model here"):
        loop.start()
    assert not loop.alive


def test_coalescing_delta_outputs_joins_their_text_ids_and_times(load):
    """A late reader of a "delta" stream gets one output whose text, token ids and token times hold both."""
    out, coalesce = load("engine.outputs"), load("serve.engine_loop").coalesce

    def delta(text, ids, times, finished=False):
        completion = out.CompletionOutput(0, text, ids, "length" if finished else None, None, text, ids)
        metrics = out.RequestMetrics(arrival_time=0.0, token_times=times)
        return out.RequestOutput("r", None, [0], [completion], finished, metrics)

    both = coalesce(delta("one", [1], [0.1]), delta(" two", [2, 3], [0.2], finished=True), delta_only=True)
    (completion,) = both.outputs
    assert (completion.text, completion.token_ids) == ("one two", [1, 2, 3])
    assert (completion.delta_text, completion.delta_token_ids) == ("one two", [1, 2, 3])
    assert both.metrics.token_times == [0.1, 0.2] and both.finished
