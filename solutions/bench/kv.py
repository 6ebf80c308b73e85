"""What ``python -m solutions bench kv`` measures with (``cli/bench/kv.py``; notebook 02 uses the same): a
request mix with ShareGPT's mean lengths, the KV rows a contiguous or a paged cache reserves and fills for it,
the sequences a budget holds at once, KV bytes per token, and the TTFT of a request whose long prefix is
cached against one whose is not."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..kernels.blocks import cdiv
from ..llm import LLM
from ..sampling_params import SamplingParams

# The mix: log-normal prompt and output lengths (sigma 1) whose means are ShareGPT's as the PagedAttention
# paper reports them (161 prompt and 338 output tokens on average), capped at max_model_len in total.
SHAREGPT_MEAN_PROMPT, SHAREGPT_MEAN_OUTPUT, LENGTH_SIGMA = 161, 338, 1.0
GOAL_WASTE, GOAL_CONCURRENCY, GOAL_TTFT = 0.04, 3.0, 5.0
SYSTEM_TEXT = Path(__file__).resolve().parents[2] / "data" / "text" / "kjv_luke_1-12.txt"


@dataclass(frozen=True)
class RequestShape:
    prompt_len: int
    output_len: int

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.output_len


def sample_request_mix(num_requests: int, max_model_len: int = 2048, seed: int = 0) -> list[RequestShape]:
    """``num_requests`` (prompt, output) lengths: log-normal, ShareGPT's means,
    prompt + output <= max_model_len."""
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
    rng = random.Random(seed)
    mu = lambda mean: math.log(mean) - LENGTH_SIGMA**2 / 2  # a log-normal's mean is exp(mu + sigma^2 / 2)
    draw = lambda mean, most: min(most, max(1, round(rng.lognormvariate(mu(mean), LENGTH_SIGMA))))
    shapes = []
    for _ in range(num_requests):
        prompt = draw(SHAREGPT_MEAN_PROMPT, max_model_len - 1)
        shapes.append(RequestShape(prompt, draw(SHAREGPT_MEAN_OUTPUT, max_model_len - prompt)))
    return shapes


# A reservation policy: rows a sequence holds when it has ``length`` tokens of a final ``total_len``.
Reservation = Callable[[int, RequestShape], int]


def contiguous_max_len(max_model_len: int) -> Reservation:
    """Today's cache: a slot of ``max_model_len`` rows from admission to finish."""
    return lambda length, shape: max_model_len


def contiguous_exact() -> Reservation:
    """A contiguous slot sized by an oracle that knows the final length (still reserved from the start)."""
    return lambda length, shape: shape.total_len


def paged(block_size: int) -> Reservation:
    """Whole blocks, allocated as the sequence grows: at most ``block_size - 1`` rows unused."""
    return lambda length, shape: cdiv(length, block_size) * block_size


@dataclass(frozen=True)
class MemoryUse:
    """Rows x decode steps, summed over every step of every request: reserved, holding a token (used), the
    share of reserved rows used and the rest (waste)."""

    reserved: int
    used: int
    used_fraction = property(lambda self: self.used / self.reserved)
    waste = property(lambda self: 1 - self.used / self.reserved)


def memory_use(mix: Sequence[RequestShape], reserve: Reservation) -> MemoryUse:
    """After each decode step ``t = 1 .. output_len`` a request holds ``prompt_len + t`` tokens' K/V."""
    reserved = used = 0
    for shape in mix:
        for length in range(shape.prompt_len + 1, shape.total_len + 1):
            reserved += reserve(length, shape)
            used += length
    return MemoryUse(reserved, used)


def max_concurrent(mix: Sequence[RequestShape], budget_rows: int, reserve: Reservation) -> int:
    """How many of the mix's sequences, taken in order, fit in ``budget_rows`` at
    once at their final lengths."""
    held = count = 0
    for shape in mix:
        held += reserve(shape.total_len, shape)
        if held > budget_rows:
            break
        count += 1
    return count


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V, every layer: ``2 * layers * kv_heads * head_dim * bytes``."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def memory_table(num_requests: int, max_model_len: int, block_size: int, budget_seqs: int, seed: int) -> dict:
    """The memory figures of section 1, as a dict (the notebook plots them)."""
    mix = sample_request_mix(num_requests, max_model_len, seed)
    policies = {
        f"contiguous, {max_model_len} rows per sequence": contiguous_max_len(max_model_len),
        "contiguous, exact final length (oracle)": contiguous_exact(),
        f"paged, blocks of {block_size}": paged(block_size),
    }
    budget = budget_seqs * max_model_len
    return {
        "mix": mix,
        "budget_rows": budget,
        "use": {name: memory_use(mix, policy) for name, policy in policies.items()},
        "concurrent": {name: max_concurrent(mix, budget, policy) for name, policy in policies.items()},
    }


@dataclass(frozen=True)
class PrefixTTFT:
    """TTFTs (seconds) of requests whose long prefix was cached, and of the same
    requests with a fresh prefix."""

    prefix_len: int
    cached: list[float]
    uncached: list[float]
    hit_tokens: list[int]  # prefix-cache hits of the cached requests, as the KV-cache manager counted them

    @property
    def speedup(self) -> float:
        return statistics.median(self.uncached) / statistics.median(self.cached)


def measure_prefix_ttft(llm: LLM, prefix_len: int = 1024, rounds: int = 5) -> PrefixTTFT:
    """Alternate requests = (shared prefix + a question) and (fresh prefix + a question), one at a time.

    The shared prefix is ``prefix_len`` tokens of a long text, cached by one warm-up request. A fresh
    prefix is the same text with a different first token, so its chained block keys all differ and
    nothing of it is found: both kinds compute the same number of tokens when nothing is cached.
    Needs an engine with prefix caching on (the default).
    """
    tokenizer, kv = llm.tokenizer, llm.engine.kv
    if not kv.enable_prefix_caching:
        raise ValueError("measure_prefix_ttft needs an engine with enable_prefix_caching=True")
    shared = tokenizer.encode(SYSTEM_TEXT.read_text())[:prefix_len]
    if len(shared) < prefix_len:
        raise ValueError(
            f"{SYSTEM_TEXT.name} has only {len(shared)} tokens, fewer than prefix_len={prefix_len}"
        )
    vocab = llm.engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    question = lambda r: tokenizer.encode(f"\nQuestion {r}: who is speaking in this passage?")
    ttft = lambda prompt: llm.generate(prompt, params)[0].metrics.ttft
    ttft(shared + question(-1))  # warm-up: computes and caches the shared prefix
    cached, uncached, hits = [], [], []
    for r in range(rounds):
        fresh = [(shared[0] + 1 + r) % vocab] + shared[1:]
        uncached.append(ttft(fresh + question(r)))
        before = kv.num_hit_tokens
        cached.append(ttft(shared + question(r)))
        hits.append(kv.num_hit_tokens - before)
    return PrefixTTFT(prefix_len, cached, uncached, hits)
