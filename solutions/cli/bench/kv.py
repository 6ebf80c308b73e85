"""``python -m solutions bench kv``: where KV memory goes, paged vs contiguous,
and what a cached prefix saves.

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
import statistics

import torch

from ...bench.kv import GOAL_CONCURRENCY, GOAL_TTFT, GOAL_WASTE, measure_prefix_ttft, memory_table
from ...bench.machine import machine_name
from ...bench.paged_attention import decode_kernel_bandwidth
from ...llm import LLM
from . import bench_parser


def _print_ttft(args: argparse.Namespace) -> float:
    llm = LLM(device=args.device, max_model_len=args.prefix_len + 64, kv_cache_memory=args.kv_cache_memory)
    result = measure_prefix_ttft(llm, args.prefix_len, args.rounds)
    cached, uncached = statistics.median(result.cached), statistics.median(result.uncached)
    print(
        f"\nTTFT, {args.prefix_len}-token shared prefix + a question, one request at a time, "
        f"medians of {args.rounds} ({llm.engine.config.device}, {llm.engine.config.dtype}):\n"
        f"  prefix not cached: {1e3 * uncached:8.1f} ms\n"
        f"  prefix cached:     {1e3 * cached:8.1f} ms   "
        f"({statistics.median(result.hit_tokens)} tokens reused)"
    )
    return result.speedup


def _print_memory(args: argparse.Namespace) -> tuple[float, float]:
    table = memory_table(args.requests, args.max_model_len, args.block_size, args.budget_seqs, args.seed)
    mix = table["mix"]
    mean = lambda values: sum(values) / len(values)
    print(
        f"request mix: {len(mix)} requests, mean prompt {mean([s.prompt_len for s in mix]):.0f} "
        f"and output {mean([s.output_len for s in mix]):.0f} tokens (log-normal, ShareGPT's means), "
        f"max_model_len {args.max_model_len}\n"
        f"budget: {table['budget_rows']} KV rows ({args.budget_seqs} sequences of max_model_len)\n"
        f"{'KV cache':48} {'holds tokens':>12} {'waste':>7} {'concurrent':>10}"
    )
    for name, use in table["use"].items():
        print(f"{name:48} {use.used_fraction:12.1%} {use.waste:7.1%} {table['concurrent'][name]:10d}")
    names = list(table["use"])
    waste = table["use"][names[-1]].waste
    ratio = table["concurrent"][names[-1]] / table["concurrent"][names[0]]
    return waste, ratio


def _gpu_kernel_line() -> str:
    """The paged decode kernel's GB/s at batch 64, context 2k, against copy bandwidth (CUDA only)."""
    if not torch.cuda.is_available():
        return "paged decode kernel GB/s vs copy bandwidth: needs CUDA (this machine has none)"
    r = decode_kernel_bandwidth(batch=64, context=2048)
    return (
        f"paged decode kernel, batch 64, context 2048, {r['dtype']}: "
        f"{r['gbps']:.0f} GB/s = {r['fraction']:.0%} of copy bandwidth {r['copy_gbps']:.0f} GB/s "
        f"(goal >= {r['goal']:.0%}) on {r['device']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.splitlines()[0])
    add = parser.add_argument
    add("--requests", type=int, default=1000, help="requests in the mix")
    add("--max-model-len", type=int, default=2048)
    add("--block-size", type=int, default=16)
    add("--budget-seqs", type=int, default=32, help="budget, in sequences of max_model_len")
    add("--seed", type=int, default=0)
    add("--no-ttft", action="store_true", help="skip the model (memory figures only)")
    add("--prefix-len", type=int, default=1024, help="shared prefix tokens for the TTFT figure")
    add("--rounds", type=int, default=5, help="cached and uncached requests measured, alternating")
    add("--device", default="auto")
    add("--kv-cache-memory", type=int, default=512 << 20, help="KV cache bytes for the TTFT run")
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
            f"TTFT with the {args.prefix_len}-token prefix cached: "
            f"{speedup:.1f}x faster (goal >= {GOAL_TTFT:.0f}x)"
        )
    goals.append(_gpu_kernel_line())
    print("\n".join(["", "goals:"] + [f"  {line}" for line in goals]))
    return 0
