"""In-process serving experiments on the engine: Poisson arrivals and static batching.

``run_with_arrivals`` plays a client population: request ``i`` arrives at a Poisson time (rate ``rate`` per
second) and is added to the engine at that moment, while the engine steps whenever it has work. Its metrics
(TTFT, TPOT, ITL, queueing) are then what a user at that load would see. ``run_static`` is the baseline that
continuous batching replaces: a batch is admitted only when the previous one has completely finished.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from ..engine.outputs import RequestOutput
from ..llm import LLM
from ..sampling_params import SamplingParams
from .throughput import Workload
from .timing import percentile


def poisson_arrival_offsets(num_requests: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival times in seconds from the start:
    exponential gaps of mean ``1 / rate`` (``inf`` rate: all at 0)."""
    rng = random.Random(seed)
    t, offsets = 0.0, []
    for _ in range(num_requests):
        offsets.append(t)
        t += 0.0 if rate == float("inf") else rng.expovariate(rate)
    return offsets


def _params(workload: Workload) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]


def run_with_arrivals(
    llm: LLM, workload: Workload, rate: float, seed: int = 0
) -> tuple[list[RequestOutput], float]:
    """Submit each request at its Poisson arrival time and step the engine until all finish.
    Returns the final outputs in submission order and the wall time."""
    engine = llm.engine
    if engine.has_unfinished_requests():
        raise RuntimeError("the engine still has unfinished requests")
    pending = list(
        zip(poisson_arrival_offsets(len(workload.prompts), rate, seed), workload.prompts, _params(workload))
    )
    ids: list[str] = []
    final: dict[str, RequestOutput] = {}
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and pending[0][0] <= now:
            offset, prompt, params = pending.pop(0)
            ids.append(engine.add_request(prompt, params, arrival_time=start + offset))
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0][0] - now))
            continue
        for output in engine.step():
            if output.finished:
                final[output.request_id] = output
    return [final[i] for i in ids], time.perf_counter() - start


def run_static(llm: LLM, workload: Workload, batch_size: int) -> tuple[list[RequestOutput], float]:
    """Static batching on the same engine: every request arrives at the start, but the next ``batch_size``
    start only when the whole previous batch has finished (its finished slots sit idle meanwhile). The
    metrics count each request's wait from the start.
    Returns the outputs in workload order and the wall time."""
    engine = llm.engine
    if engine.has_unfinished_requests():
        raise RuntimeError("the engine still has unfinished requests")
    params = _params(workload)
    outputs: list[RequestOutput] = []
    start = time.perf_counter()
    for first in range(0, len(workload.prompts), batch_size):
        batch = slice(first, first + batch_size)
        ids = [
            engine.add_request(p, s, arrival_time=start)
            for p, s in zip(workload.prompts[batch], params[batch])
        ]
        final: dict[str, RequestOutput] = {}
        while engine.has_unfinished_requests():
            final.update((o.request_id, o) for o in engine.step() if o.finished)
        outputs += [final[i] for i in ids]
    return outputs, time.perf_counter() - start


@dataclass(frozen=True)
class LatencySummary:
    """vLLM's serving metrics over a set of finished requests (seconds; throughput in tokens/s)."""

    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    output_tokens_per_s: float

    @classmethod
    def of(cls, outputs: list[RequestOutput], wall_s: float) -> LatencySummary:
        ttft = [o.metrics.ttft for o in outputs]
        tpot = [o.metrics.tpot for o in outputs if o.metrics.tpot is not None]
        return cls(
            ttft_p50=percentile(ttft, 50),
            ttft_p99=percentile(ttft, 99),
            tpot_p50=percentile(tpot, 50),
            tpot_p99=percentile(tpot, 99),
            output_tokens_per_s=sum(o.metrics.num_output_tokens for o in outputs) / wall_s,
        )
