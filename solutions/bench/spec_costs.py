"""Speculative decoding's speed-up taken apart: ``S = tau / (1 + k c + v)``, each term measured in the engine.

One target step costs ``t1`` (a plain engine's decode step). A speculative step drafts ``k`` tokens (``k``
draft passes, each ``c t1``) and then verifies the root and its drafts in one pass (``(1 + v) t1``), and it
emits ``tau`` tokens. So a speculative engine decodes ``S = tau / (1 + k c + v)`` times as fast as plain:

- ``c``: the drafter's time per step over ``k t1`` (``Speculator.propose``, timed around its call; for a tree
  ``k`` is its depth: one head pass per depth);
- ``v``: the rest of the speculative step (the forward over ``1 + k`` rows or the tree's nodes, the verify's
  bookkeeping, the scheduler) over ``t1``, minus one;
- ``tau``: tokens per verify pass (``RequestOutput.metrics``).

``timed_generate`` runs one request through an engine with timers around each ``Engine.step`` and the
speculator's ``propose`` (a few hundred nanoseconds a call; the engine is left as it was). Its first step is
the prefill (``max_num_seqs=1``, a prompt within one step's token budget), kept apart: the decode steps alone
give ``t1``, ``c`` and ``v``; the whole request gives tokens/s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..llm import LLM
from ..sampling_params import SamplingParams


@dataclass
class RequestTimes:
    """One request through one engine: its whole time, its prefill step, its decode steps and the drafting
    inside them (seconds), its tokens, and its verify passes and the tokens they gave."""

    seconds: float
    prefill_seconds: float
    step_seconds: list[float]
    draft_seconds: float
    tokens: list[int]
    passes: int
    verified: int


@contextmanager
def _step_timers(llm: LLM, steps: list[float], drafting: list[float]) -> Iterator[None]:
    """Timers around ``llm.engine.step`` and its speculator's ``propose`` (instance attributes, removed on
    exit, so the engine's own methods run unchanged)."""
    engine, spec = llm.engine, llm.engine.speculator

    def timed(fn: Callable, into: list[float]) -> Callable:
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                into.append(time.perf_counter() - start)

        return call

    engine.step = timed(type(engine).step.__get__(engine), steps)
    if spec is not None:
        spec.propose = timed(type(spec).propose.__get__(spec), drafting)
    try:
        yield
    finally:
        del engine.step
        if spec is not None:
            del spec.propose


def timed_generate(llm: LLM, prompt: str | list[int], params: SamplingParams) -> RequestTimes:
    """Generate ``prompt`` alone on ``llm`` (an engine of ``max_num_seqs=1``), timing its steps."""
    steps: list[float] = []
    drafting: list[float] = []
    with _step_timers(llm, steps, drafting):
        start = time.perf_counter()
        out = llm.generate(prompt, params, use_tqdm=False)[0]
        seconds = time.perf_counter() - start
    # The first propose runs before the prefill and drafts nothing (no request is decoding yet).
    return RequestTimes(
        seconds,
        steps[0],
        steps[1:],
        sum(drafting[1:]),
        list(out.outputs[0].token_ids),
        out.metrics.num_verify_passes,
        out.metrics.num_verified_tokens,
    )


@dataclass
class MethodCosts:
    """A method's requests, gathered over rounds: per round, its seconds and decode-step seconds."""

    draft_passes: int  # per speculative step: chain length k, or tree depth (0: plain)
    rounds: list[list[RequestTimes]] = field(default_factory=list)

    def add(self, round_index: int, times: RequestTimes) -> None:
        while len(self.rounds) <= round_index:
            self.rounds.append([])
        self.rounds[round_index].append(times)

    def round_seconds(self) -> list[float]:
        return [sum(t.seconds for t in requests) for requests in self.rounds]

    def tokens(self) -> int:
        return sum(len(t.tokens) for t in self.rounds[0])

    def step_mean(self, requests: list[RequestTimes]) -> float:
        steps = [s for t in requests for s in t.step_seconds]
        return sum(steps) / max(1, len(steps))

    def draft_mean(self, requests: list[RequestTimes]) -> float:
        steps = sum(len(t.step_seconds) for t in requests)
        return sum(t.draft_seconds for t in requests) / max(1, steps)

    @property
    def tau(self) -> float:
        passes = sum(t.passes for requests in self.rounds for t in requests)
        verified = sum(t.verified for requests in self.rounds for t in requests)
        return verified / passes if passes else 1.0


@dataclass
class Split:
    """Median over rounds, with the rounds' min and max, of a method against plain decoding."""

    speedup: tuple[float, float, float]  # whole requests (prefill included): plain seconds / method seconds
    c: tuple[float, float, float]
    v: tuple[float, float, float]
    predicted: float  # tau / (1 + k c + v) at the median c and v
    tau: float
    k: int


def _spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def split_against(plain: MethodCosts, method: MethodCosts) -> Split:
    """``method``'s speed-up over ``plain``, ``c`` and ``v`` per round (each round's plain ``t1``)."""
    speedups, cs, vs = [], [], []
    for plain_round, round_ in zip(plain.rounds, method.rounds, strict=True):
        t1 = plain.step_mean(plain_round)
        speedups.append(sum(t.seconds for t in plain_round) / sum(t.seconds for t in round_))
        draft = method.draft_mean(round_)
        cs.append(draft / (max(1, method.draft_passes) * t1))
        vs.append((method.step_mean(round_) - draft) / t1 - 1)
    c, v, k = statistics.median(cs), statistics.median(vs), method.draft_passes
    tau = method.tau
    return Split(_spread(speedups), _spread(cs), _spread(vs), tau / (1 + k * c + v), tau, k)


def run_rounds(
    engines: dict[str, LLM],
    draft_passes: dict[str, int],
    prompts: list,
    params: SamplingParams,
    rounds: int,
    warmup: bool = True,
) -> dict[str, MethodCosts]:
    """Every prompt through every engine, engines alternating prompt by prompt, ``rounds`` times (after one
    warm-up request each)."""
    if warmup:
        for llm in engines.values():
            llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    costs = {name: MethodCosts(draft_passes.get(name, 0)) for name in engines}
    for r in range(rounds):
        for prompt in prompts:
            for name, llm in engines.items():
                costs[name].add(r, timed_generate(llm, prompt, params))
    return costs
