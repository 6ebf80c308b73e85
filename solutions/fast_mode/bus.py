"""The "bus" behind fast modes, simulated: the engine's own scheduler on a virtual clock.

Requests arrive as a Poisson process. Each step the engine's ``Scheduler`` (Lesson 3) plans which requests
run how many tokens, with a real ``KVCacheManager`` (Lesson 2) holding their blocks, exactly as in the engine;
no model runs. The clock advances by what that step would cost on a machine described by a ``WeightFormat``
(``planner``): one step of its decode rows (at least one: a step always streams the weights) plus the prefill
chunk's tokens at the measured prefill rate. So a sweep of arrival rates and batch caps takes milliseconds,
and the notebook checks one point against a measured run of the real engine.

A low batch cap is the bus that leaves without waiting for more passengers: each step is short, so each user
streams fast, but when requests arrive faster than a small batch serves them they queue, and TTFT grows.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from ..bench.online import poisson_arrival_offsets
from ..bench.timing import percentile
from ..cache.kv_cache_manager import KVCacheManager
from ..engine.request import Request, RequestGroup
from ..engine.scheduler import Scheduler
from ..kernels.blocks import cdiv
from ..sampling_params import SamplingParams
from .planner import WeightFormat


@dataclass(frozen=True)
class BusRide:
    """What the users of one simulated run saw (seconds; speeds in output tokens/s)."""

    arrival_rate: float
    max_num_seqs: int
    ttft_p50_s: float
    ttft_p99_s: float
    per_user_tokens_per_s: (
        float  # median over requests of 1 / TPOT: the speed a user watches the text stream at
    )
    aggregate_tokens_per_s: (
        float  # every output token over the time from the first arrival to the last finish
    )
    mean_decode_batch: float  # decode rows per step, over the steps that decoded


def simulate_bus(
    fmt: WeightFormat,
    arrival_rate: float,
    max_num_seqs: int,
    num_requests: int = 48,
    prompt_tokens: int = 128,
    output_tokens: int = 64,
    max_num_batched_tokens: int = 512,
    block_size: int = 16,
    seed: int = 0,
) -> BusRide:
    """Serve ``num_requests`` requests (random prompts of ``prompt_tokens``, exactly ``output_tokens`` each)
    that arrive at ``arrival_rate`` per second (``inf``: all at once), at most ``max_num_seqs`` in a step.
    The KV cache holds every running request at full length, so nothing is preempted: the queue is the only
    wait."""
    if num_requests < 1 or prompt_tokens < 1 or output_tokens < 2:
        raise ValueError(
            f"need num_requests >= 1, prompt_tokens >= 1 and output_tokens >= 2 (TPOT needs two tokens), got "
            f"{num_requests}, {prompt_tokens}, {output_tokens}"
        )
    if not arrival_rate > 0:
        raise ValueError(f"arrival_rate must be > 0 requests/s (inf: all at once), got {arrival_rate}")
    max_len = prompt_tokens + output_tokens
    kv = KVCacheManager(1 + max_num_seqs * cdiv(max_len, block_size), block_size)
    scheduler = Scheduler(kv, max_num_seqs, max_num_batched_tokens, max_len)
    rng = random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    arrivals = poisson_arrival_offsets(num_requests, arrival_rate, seed)
    requests = []
    for i, arrival in enumerate(arrivals):
        group = RequestGroup(
            f"bus-{i}", None, [rng.randrange(1 << 15) for _ in range(prompt_tokens)], params, arrival
        )
        requests.append(Request(group.request_id, group, 0, detokenizer=None))
        group.requests.append(requests[-1])
    first_token: dict[str, float] = {}
    finish: dict[str, float] = {}
    decode_batches: list[int] = []
    clock, admitted = 0.0, 0
    while len(finish) < num_requests:
        while admitted < num_requests and arrivals[admitted] <= clock:
            scheduler.add(requests[admitted])
            admitted += 1
        if not scheduler.has_unfinished():
            clock = arrivals[admitted]
            continue
        plan = scheduler.schedule()
        decodes = sum(
            1
            for r in plan.scheduled
            if plan.num_scheduled_tokens[r.request_id] == 1 and r.num_computed == r.num_tokens - 1
        )
        if decodes:
            decode_batches.append(decodes)
        clock += fmt.step_s(max(decodes, 1)) + (plan.total_tokens - decodes) / fmt.prefill_tokens_per_s
        for r in plan.scheduled:
            r.num_computed += plan.num_scheduled_tokens[r.request_id]
            if r.num_computed < r.num_tokens:
                continue  # a prompt chunk that has not reached the prompt's end
            r.output_token_ids.append(0)
            first_token.setdefault(r.request_id, clock)
            if len(r.output_token_ids) == output_tokens:
                scheduler.finish(r)
                finish[r.request_id] = clock
            else:
                kv.cache_full_blocks(r)
    ttft = [first_token[r.request_id] - arrival for r, arrival in zip(requests, arrivals)]
    speed = [(output_tokens - 1) / (finish[r.request_id] - first_token[r.request_id]) for r in requests]
    return BusRide(
        arrival_rate=arrival_rate,
        max_num_seqs=max_num_seqs,
        ttft_p50_s=percentile(ttft, 50),
        ttft_p99_s=percentile(ttft, 99),
        per_user_tokens_per_s=statistics.median(speed),
        aggregate_tokens_per_s=num_requests * output_tokens / (max(finish.values()) - arrivals[0]),
        mean_decode_batch=statistics.fmean(decode_batches),
    )
