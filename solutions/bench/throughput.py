"""``python -m solutions bench throughput``: offline throughput of continuous batching, side by side in one run.

One workload (N requests, prompt lengths 16-512 and output lengths 16-256, drawn with a seed; prompts are
windows of real text; EOS ignored so every request produces exactly its length) runs through:

- our engine (continuous batching, chunked prefill, paged KV cache);
- the same engine with ``max_num_seqs=1`` (one request at a time);
- Hugging Face ``generate`` with padded static batches (left-padded; each batch runs until its longest
  request is done, so only the requested tokens count as useful output);
- our engine again, sampling (temperature 0.8, top-p 0.95) instead of greedy: what drawing tokens costs.

Beside them, the machine's compute ceiling measured in the same run: the model's own matrix products at a
large batch, in FLOP/s, turned into the tokens/s a forward pass could reach if it did nothing else.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

TEXT = Path(__file__).resolve().parents[2] / "data" / "text" / "kjv_genesis_1-15.txt"


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(
    tokenizer, num_requests: int, prompt_lens=(16, 512), output_lens=(16, 256), seed: int = 0
) -> Workload:
    """Random lengths, uniform in each range; each prompt is a window of real text of its length."""
    rng = random.Random(seed)
    text_ids = tokenizer.encode(TEXT.read_text())
    prompts, outs = [], []
    for _ in range(num_requests):
        length = rng.randint(*prompt_lens)
        start = rng.randrange(len(text_ids) - length)
        prompts.append(text_ids[start : start + length])
        outs.append(rng.randint(*output_lens))
    return Workload(prompts, outs)


@dataclass(frozen=True)
class Throughput:
    name: str
    wall_s: float
    prompt_tokens: int
    output_tokens: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.wall_s


def run_engine(llm, workload: Workload, name: str = "fast-mode engine", **sampling) -> Throughput:
    """Greedy unless ``sampling`` gives other ``SamplingParams`` fields (request ``i`` is then seeded ``i``)."""
    from ..engine.sampling_params import SamplingParams

    params = [
        SamplingParams(
            max_tokens=n, ignore_eos=True, **({"seed": i, **sampling} if sampling else {"temperature": 0})
        )
        for i, n in enumerate(workload.output_lens)
    ]
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert produced == workload.num_output_tokens, "every request must produce exactly its output length"
    return Throughput(name, wall, workload.num_prompt_tokens, produced)


def run_hf_static(model, workload: Workload, batch_size: int, pad_id: int) -> Throughput:
    """Padded static batches in arrival order: a batch holds its slots until its longest request is done."""
    start = time.perf_counter()
    for first in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[first : first + batch_size]
        longest_out = max(workload.output_lens[first : first + batch_size])
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=longest_out,
                min_new_tokens=longest_out,
                do_sample=False,
                pad_token_id=pad_id,
            )
    wall = time.perf_counter() - start
    return Throughput(f"HF generate, static batches of {batch_size}", wall, workload.num_prompt_tokens,
                      workload.num_output_tokens)  # fmt: skip


def compute_ceiling_tokens_per_s(model, batch: int = 512, repeats: int = 3) -> tuple[float, float]:
    """(FLOP/s, tokens/s): time the model's matrix shapes at ``batch`` rows (one of each distinct linear, weighted
    by how often a forward pass uses it) and divide a token's matmul FLOPs by the time they take. Each linear runs
    through the module itself, so on CPU it takes the path measured fastest for a prompt's rows (``CpuLinear``)."""
    linears: dict[tuple[int, int], tuple[int, torch.nn.Module]] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            key = (module.out_features, module.in_features)
            count, _ = linears.get(key, (0, module))
            linears[key] = (count + 1, module)
    seconds, flops = 0.0, 0.0
    with torch.inference_mode():
        for (out_features, in_features), (count, module) in linears.items():
            x = torch.randn(batch, in_features, dtype=module.weight.dtype, device=module.weight.device)
            module(x)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                module(x)
                times.append(time.perf_counter() - start)
            seconds += count * statistics.median(times)
            flops += count * 2 * batch * in_features * out_features
    return flops / seconds, batch / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions bench throughput", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--num-requests", type=int, default=24)
    parser.add_argument("--max-num-seqs", type=int, default=24)
    parser.add_argument("--hf-batch", type=int, default=8, help="Hugging Face static batch size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face baseline")
    args = parser.parse_args(argv)

    from ..llm import LLM
    from ..model.loader import bundled_model_path

    llm = LLM(device="cpu", dtype="float32", max_num_seqs=args.max_num_seqs, max_model_len=1024)
    workload = make_workload(llm.tokenizer, args.num_requests, seed=args.seed)
    print(f"workload: {args.num_requests} requests, {workload.num_prompt_tokens} prompt tokens, "
          f"{workload.num_output_tokens} output tokens (seed {args.seed})")  # fmt: skip
    results = [run_engine(llm, workload)]
    one = LLM(device="cpu", dtype="float32", max_num_seqs=1, max_model_len=1024)
    results.append(run_engine(one, workload, "same engine, max_num_seqs=1"))
    if not args.no_hf:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.set_verbosity_error()
        path = bundled_model_path()
        hf = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
        results.append(run_hf_static(hf, workload, args.hf_batch, pad_id=llm.tokenizer.eos_token_id or 0))
    # The price of sampling: the same batch drawing every token from its top-p set instead of taking the argmax.
    # A fresh engine: the first one's prefix cache holds every prompt by now.
    fresh = LLM(device="cpu", dtype="float32", max_num_seqs=args.max_num_seqs, max_model_len=1024)
    results.append(
        run_engine(fresh, workload, "same engine, sampled T 0.8 top-p 0.95", temperature=0.8, top_p=0.95)
    )
    flops, ceiling = compute_ceiling_tokens_per_s(llm.engine.model)
    ours = results[0]
    print(f"machine: {torch.get_num_threads()} CPU threads, torch {torch.__version__}, float32 weights")
    print(
        f"compute ceiling: the model's matmuls at batch 512 run at {flops / 1e9:.1f} GFLOP/s = {ceiling:.0f} tokens/s"
    )
    print(f"{'':<40}{'wall s':>8}{'out tok/s':>11}{'total tok/s':>13}{'ours is':>9}")
    for r in results:
        ratio = ours.output_tokens_per_s / r.output_tokens_per_s
        print(
            f"{r.name:<40}{r.wall_s:>8.1f}{r.output_tokens_per_s:>11.1f}{r.total_tokens_per_s:>13.1f}{ratio:>8.1f}x"
        )
    print("goals:")
    print(f"  >= 8x one-at-a-time:       {ours.output_tokens_per_s / results[1].output_tokens_per_s:.1f}x")
    if not args.no_hf:
        print(
            f"  >= 4x HF static batching:  {ours.output_tokens_per_s / results[2].output_tokens_per_s:.1f}x"
        )
    print(
        f"  >= 50% of compute ceiling: {ours.total_tokens_per_s / ceiling:.0%} (total tokens/s over the ceiling)"
    )
    return 0
