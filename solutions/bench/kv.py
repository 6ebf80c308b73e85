"""``python -m solutions bench kv``: where KV memory goes, paged vs contiguous, and what a cached prefix saves.

1. Memory, for one request mix (no model needed): a contiguous cache reserves ``max_model_len`` rows
   per running sequence for its whole life; a paged cache holds ``ceil(tokens / block_size)`` blocks,
   growing as the sequence does. Over every decode step of every request we add up the rows reserved
   and the rows holding a token (waste = 1 - used / reserved), and count the sequences a fixed budget
   holds at once at their final lengths.
2. TTFT on the bundled model: requests that share a ~1k-token system prompt, with the prefix cached
   (a hit computes only the question) and without prefix caching, measured side by side in one run.
3. On CUDA, the paged decode kernel's GB/s against measured copy bandwidth (batch 64, context 2k),
   from ``paged_attention.decode_kernel_bandwidth`` (the kernels' benchmark).

The figures print beside their goals: waste < 4%, >= 3x concurrent sequences, >= 5x faster TTFT.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..kernels.blocks import cdiv

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
    """``num_requests`` (prompt, output) lengths: log-normal, ShareGPT's means, prompt + output <= max_model_len."""
    if max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {max_model_len}")
    rng = random.Random(seed)
    mu = lambda mean: math.log(mean) - LENGTH_SIGMA**2 / 2  # a log-normal's mean is exp(mu + sigma^2 / 2)
    shapes = []
    for _ in range(num_requests):
        prompt = min(
            max_model_len - 1, max(1, round(rng.lognormvariate(mu(SHAREGPT_MEAN_PROMPT), LENGTH_SIGMA)))
        )
        output = min(
            max_model_len - prompt, max(1, round(rng.lognormvariate(mu(SHAREGPT_MEAN_OUTPUT), LENGTH_SIGMA)))
        )
        shapes.append(RequestShape(prompt, output))
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
    """Rows x decode steps, summed over every step of every request."""

    reserved: int
    used: int

    @property
    def used_fraction(self) -> float:
        return self.used / self.reserved

    @property
    def waste(self) -> float:
        return 1 - self.used_fraction


def memory_use(mix: Sequence[RequestShape], reserve: Reservation) -> MemoryUse:
    """After each decode step ``t = 1 .. output_len`` a request holds ``prompt_len + t`` tokens' K/V."""
    reserved = used = 0
    for shape in mix:
        for length in range(shape.prompt_len + 1, shape.total_len + 1):
            reserved += reserve(length, shape)
            used += length
    return MemoryUse(reserved, used)


def max_concurrent(mix: Sequence[RequestShape], budget_rows: int, reserve: Reservation) -> int:
    """How many of the mix's sequences, taken in order, fit in ``budget_rows`` at once at their final lengths."""
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
    """TTFTs (seconds) of requests whose long prefix was cached, and of the same requests with a fresh prefix."""

    prefix_len: int
    cached: list[float]
    uncached: list[float]
    hit_tokens: list[int]  # prefix-cache hits of the cached requests, as the KV-cache manager counted them

    @property
    def speedup(self) -> float:
        return statistics.median(self.uncached) / statistics.median(self.cached)


def measure_prefix_ttft(llm, prefix_len: int = 1024, rounds: int = 5) -> PrefixTTFT:
    """Alternate requests = (shared prefix + a question) and (fresh prefix + a question), one at a time.

    The shared prefix is ``prefix_len`` tokens of a long text, cached by one warm-up request. A fresh
    prefix is the same text with a different first token, so its chained block keys all differ and
    nothing of it is found: both kinds compute the same number of tokens when nothing is cached.
    Needs an engine with prefix caching on (the default).
    """
    from ..engine.sampling_params import SamplingParams

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


def _print_ttft(args) -> float:
    from ..llm import LLM

    llm = LLM(device=args.device, max_model_len=args.prefix_len + 64, kv_cache_memory=args.kv_cache_memory)
    result = measure_prefix_ttft(llm, args.prefix_len, args.rounds)
    cached, uncached = statistics.median(result.cached), statistics.median(result.uncached)
    print(
        f"\nTTFT, {args.prefix_len}-token shared prefix + a question, one request at a time, medians of {args.rounds} "
        f"({llm.engine.config.device}, {llm.engine.config.dtype}):"
    )
    print(f"  prefix not cached: {1e3 * uncached:8.1f} ms")
    print(
        f"  prefix cached:     {1e3 * cached:8.1f} ms   ({statistics.median(result.hit_tokens)} tokens reused)"
    )
    return result.speedup


def machine_name() -> str:
    """The GPU's name, or the CPU's model name and core count."""
    import os

    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if "model name" in line
            ),
            "unknown CPU",
        )
        if Path("/proc/cpuinfo").exists()
        else "unknown CPU"
    )
    return f"{model}, {os.cpu_count()} cores"


def _print_memory(args) -> tuple[float, float]:
    table = memory_table(args.requests, args.max_model_len, args.block_size, args.budget_seqs, args.seed)
    mix = table["mix"]
    mean = lambda values: sum(values) / len(values)
    print(
        f"request mix: {len(mix)} requests, mean prompt {mean([s.prompt_len for s in mix]):.0f} and output "
        f"{mean([s.output_len for s in mix]):.0f} tokens (log-normal, ShareGPT's means), max_model_len {args.max_model_len}"
    )
    print(f"budget: {table['budget_rows']} KV rows ({args.budget_seqs} sequences of max_model_len)")
    print(f"{'KV cache':48} {'holds tokens':>12} {'waste':>7} {'concurrent':>10}")
    for name, use in table["use"].items():
        print(f"{name:48} {use.used_fraction:12.1%} {use.waste:7.1%} {table['concurrent'][name]:10d}")
    names = list(table["use"])
    waste = table["use"][names[-1]].waste
    ratio = table["concurrent"][names[-1]] / table["concurrent"][names[0]]
    return waste, ratio


def _gpu_kernel_line() -> str:
    """The paged decode kernel's GB/s at batch 64, context 2k, against copy bandwidth (CUDA only)."""
    import torch

    from .paged_attention import decode_kernel_bandwidth

    if not torch.cuda.is_available():
        return "paged decode kernel GB/s vs copy bandwidth: needs CUDA (this machine has none)"
    r = decode_kernel_bandwidth(batch=64, context=2048)
    return (
        f"paged decode kernel, batch 64, context 2048, {r['dtype']}: {r['gbps']:.0f} GB/s = {r['fraction']:.0%} of "
        f"copy bandwidth {r['copy_gbps']:.0f} GB/s (goal >= {r['goal']:.0%}) on {r['device']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m solutions bench kv", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests in the mix")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--budget-seqs", type=int, default=32, help="budget, in sequences of max_model_len")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-ttft", action="store_true", help="skip the model (memory figures only)")
    parser.add_argument(
        "--prefix-len", type=int, default=1024, help="shared prefix tokens for the TTFT figure"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="cached and uncached requests measured, alternating"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--kv-cache-memory", type=int, default=512 << 20, help="KV cache bytes for the TTFT run"
    )
    args = parser.parse_args(argv)
    print(f"machine: {machine_name()}")
    waste, ratio = _print_memory(args)
    goals = [
        f"paged waste {waste:.1%} (goal < {GOAL_WASTE:.0%})",
        f"paged / contiguous concurrent sequences {ratio:.1f}x (goal >= {GOAL_CONCURRENCY:.0f}x)",
    ]
    if not args.no_ttft:
        speedup = _print_ttft(args)
        goals.append(
            f"TTFT with the {args.prefix_len}-token prefix cached: {speedup:.1f}x faster (goal >= {GOAL_TTFT:.0f}x)"
        )
    goals.append(_gpu_kernel_line())
    print("\n".join(["", "goals:"] + [f"  {line}" for line in goals]))
    return 0
