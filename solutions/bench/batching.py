"""The latency/throughput trade-off: run B identical-length requests as one batch and measure both sides.

Per-user speed is what one user sees (their tokens over their request's time); aggregate throughput
is what the server sells (all tokens over the batch's wall time). A "fast mode" buys the first by
giving up the second.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..llm import LLM
from ..sampling_params import SamplingParams


@dataclass(frozen=True)
class BatchSpeed:
    batch_size: int
    new_tokens: int
    wall_s: float
    ttft_s: float  # median over the batch
    tpot_s: float  # median over the batch
    per_user_tokens_per_s: float  # median over the batch of each request's tokens / its latency
    aggregate_tokens_per_s: float  # every output token / wall time


def measure_batch_speed(
    llm: LLM, batch_size: int, new_tokens: int = 32, prompt: str = "Write a short poem about"
) -> BatchSpeed:
    """Generate ``new_tokens`` greedy tokens for ``batch_size`` copies of a prompt in one batch, after a short
    warm-up batch of the same shape: the first call at a new number of rows pays one-time costs (on CPU each
    linear makes its weight layout for that many rows on first use), which are not the engine's speed."""
    if batch_size < 1 or batch_size > llm.engine.config.max_num_seqs:
        raise ValueError(
            f"batch_size must be in [1, max_num_seqs={llm.engine.config.max_num_seqs}], got {batch_size}"
        )
    warm_up = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    llm.generate([prompt] * batch_size, warm_up, use_tqdm=False)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([prompt] * batch_size, params, use_tqdm=False)  # no progress bar in a timed run
    wall = time.perf_counter() - start
    metrics = [o.metrics for o in outputs]
    return BatchSpeed(
        batch_size=batch_size,
        new_tokens=new_tokens,
        wall_s=wall,
        ttft_s=statistics.median(m.ttft for m in metrics),
        tpot_s=statistics.median(m.tpot for m in metrics),
        per_user_tokens_per_s=statistics.median(m.tokens_per_s for m in metrics),
        aggregate_tokens_per_s=sum(m.num_output_tokens for m in metrics) / wall,
    )
