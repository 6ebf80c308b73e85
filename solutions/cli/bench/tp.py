"""``python -m solutions bench tp``: tensor parallelism measured on this machine, and predicted for H200s.

Measured: decode tokens/s of one batch at N ranks beside N = 1, for the tiny random Llama at N = 1, 2 and the
bundled SmolLM2-135M at N = 1, 3 (its 9 query and 3 KV heads split only by 3), each rank a process on this
machine (gloo over 127.0.0.1 on a CPU). Beside each: what a decode token costs in communication (bytes
all-reduced: the embedding's and two per layer) and in weights (bytes each rank reads), and the collectives
per step.

Predicted: batch-1 decode of a model on N H200s, the bandwidth model of ``bench/tp.py`` (each step reads
``W / N`` bytes of weights from HBM and runs ``2L + 1`` all-reduces of ``hidden`` values, each a ring over
NVLink or PCIe, then gathers the logits), with the latency of one small collective assumed (``--latency-us``)
and printed as such.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ...bench.machine import machine_name
from ...bench.model_shapes import SHAPES, ModelShape, write_random_checkpoint
from ...bench.tp import (
    H200_HBM_BYTES_S,
    NVLINK_BYTES_S,
    PCIE_BYTES_S,
    Measured,
    predicted_tokens_per_s,
    tensor_parallel_sizes,
    traffic,
)
from ...llm import LLM
from ...sampling_params import SamplingParams
from . import bench_parser


def measure(
    label: str, model: str | None, shape: ModelShape, world_size: int, args: argparse.Namespace
) -> Measured:
    """Median decode tokens/s over ``args.repeats`` runs of ``args.batch`` prompts x ``args.max_tokens``
    tokens, after one warm-up run; the engine at ``world_size`` ranks on this CPU."""

    llm = LLM(
        model=model, device="cpu", dtype="float32", tensor_parallel_size=world_size, skip_tokenizer_init=True,
        max_num_seqs=args.batch, max_model_len=args.prompt_tokens + args.max_tokens + 1,
        kv_cache_memory=64 << 20, num_threads=args.num_threads,
    )  # fmt: skip
    try:
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, shape.vocab_size, (args.prompt_tokens,), generator=gen).tolist()]
        prompts *= args.batch
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        rates, steps = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            rates.append(sum(len(o.outputs[0].token_ids) for o in outs) / seconds)
            steps.append(seconds / args.max_tokens)
    finally:
        llm.shutdown()
    return Measured(label, world_size, statistics.median(rates), 1e3 * statistics.median(steps),
                    traffic(shape, world_size, 4))  # fmt: skip


def print_measured(rows: list[Measured], machine: str, args: argparse.Namespace) -> None:
    print(
        f"\nMeasured on {machine}: {args.batch} prompts of {args.prompt_tokens} tokens, {args.max_tokens} "
        "greedy\ntokens each, float32, every rank a process (gloo over 127.0.0.1); medians of "
        f"{args.repeats} runs.\n"
    )
    header = (
        f"{'model':<26}{'ranks':>6}{'tokens/s':>10}{'vs 1 rank':>11}{'ms/step':>9}{'collectives':>13}"
        f"{'all-reduced B/token':>21}{'weights B/rank/token':>22}"
    )
    print(header)
    print("-" * len(header))
    base = {r.model: r.tokens_per_s for r in rows if r.world_size == 1}
    for r in rows:
        t = r.traffic
        print(
            f"{r.model:<26}{r.world_size:>6}{r.tokens_per_s:>10.1f}{r.tokens_per_s / base[r.model]:>10.2f}x"
            f"{r.ms_per_step:>9.1f}{t.collectives:>13}{t.all_reduce_bytes:>21,}{t.weight_bytes:>22,}"
        )


def print_predicted(shapes: list[ModelShape], nvlink_latency_s: float, pcie_latency_s: float) -> None:
    print(
        f"\nPredicted batch-1 decode on H200s, bfloat16 (HBM {H200_HBM_BYTES_S / 1e12:.1f} TB/s; NVLink "
        f"{NVLINK_BYTES_S / 1e9:.0f} GB/s and PCIe Gen5 x16 {PCIE_BYTES_S / 1e9:.0f} GB/s each way; assumed "
        f"{nvlink_latency_s * 1e6:.0f} us (NVLink) and {pcie_latency_s * 1e6:.0f} us (PCIe) per "
        "collective):\n"
    )
    header = (
        f"{'model':<26}{'GPUs':>5}{'weights MB/GPU':>16}{'all-reduced KB/token':>22}{'NVLink tok/s':>14}"
        f"{'vs 1 GPU':>10}{'PCIe tok/s':>12}{'vs 1 GPU':>10}"
    )
    print(header)
    print("-" * len(header))
    for shape in shapes:
        single = predicted_tokens_per_s(shape, 1, NVLINK_BYTES_S, 0.0)
        for n in tensor_parallel_sizes(shape):
            t = traffic(shape, n, 2)
            nvlink = predicted_tokens_per_s(shape, n, NVLINK_BYTES_S, nvlink_latency_s)
            pcie = predicted_tokens_per_s(shape, n, PCIE_BYTES_S, pcie_latency_s)
            print(
                f"{shape.name:<26}{n:>5}{t.weight_bytes / 1e6:>16.1f}{t.all_reduce_bytes / 1e3:>22.1f}"
                f"{nvlink:>14.0f}{nvlink / single:>9.2f}x{pcie:>12.0f}{pcie / single:>9.2f}x"
            )


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.split("\n")[0])
    add = parser.add_argument
    add("--batch", type=int, default=4, help="prompts decoded together (default: 4)")
    add("--prompt-tokens", type=int, default=16, help="tokens per prompt (default: 16)")
    add("--max-tokens", type=int, default=32, help="tokens generated per prompt (default: 32)")
    add("--repeats", type=int, default=3, help="timed runs per engine (default: 3)")
    add(
        "--num-threads", type=int, default=None,
        help="torch threads per rank (default: torch's choice on rank 0, 1 on each worker)",
    )  # fmt: skip
    add(
        "--latency-us", type=float, nargs=2, default=(10.0, 30.0), metavar=("NVLINK", "PCIE"),
        help="assumed cost of one small collective, microseconds (default: 10 30)",
    )  # fmt: skip
    add("--predict-only", action="store_true", help="print the H200 prediction, measure nothing")
    args = parser.parse_args(argv)
    bundled = SHAPES["smollm2-135m"]  # the bundled model's shape (its config.json)
    if not args.predict_only:
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            tiny_shape = SHAPES["tiny"]
            tiny = write_random_checkpoint(tiny_shape, Path(tmp) / "tiny")
            for n in (1, 2):
                rows.append(measure("tiny (random)", str(tiny), tiny_shape, n, args))
            for n in (1, 3):
                rows.append(measure(bundled.name, None, bundled, n, args))
        print_measured(rows, machine_name("cpu"), args)
    nvlink_latency, pcie_latency = (us * 1e-6 for us in args.latency_us)
    print_predicted([bundled, SHAPES["llama-3.1-8b"]], nvlink_latency, pcie_latency)
    return 0
