"""What ``python -m solutions bench throughput`` measures with (``cli/bench/throughput.py``; notebooks 03 and
07 use the same): a seeded workload (prompt lengths 16-512 and output lengths 16-256, prompts cut from real
text, EOS ignored so every request produces exactly its length), its throughput through an engine or through
Hugging Face ``generate`` in padded static batches, and the machine's compute ceiling: the model's own matrix
products at a large batch, turned into the tokens/s a forward pass could reach if it did nothing else."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..llm import LLM
from ..model.tokenizer import TextTokenizer
from ..sampling_params import SamplingParams
from .decode import hf_generate, left_padded
from .step_split import linear_flops, linear_seconds

if TYPE_CHECKING:
    from transformers import PreTrainedModel

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
    tokenizer: TextTokenizer | None,
    num_requests: int,
    prompt_lens: tuple[int, int] = (16, 512),
    output_lens: tuple[int, int] = (16, 256),
    seed: int = 0,
    vocab_size: int = 10_000,
) -> Workload:
    """Random lengths, uniform in each range; each prompt is a window of real text of its length or, without a
    ``tokenizer``, random token ids below ``vocab_size`` (nano-vllm's benchmark draws them below 10,000)."""
    rng = random.Random(seed)
    text_ids = None if tokenizer is None else tokenizer.encode(TEXT.read_text())
    prompts, outs = [], []
    for _ in range(num_requests):
        length = rng.randint(*prompt_lens)
        if text_ids is None:
            prompts.append([rng.randrange(vocab_size) for _ in range(length)])
        else:
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
    requests: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.wall_s


def workload_params(workload: Workload, **sampling) -> list[SamplingParams]:
    """Each request's parameters: exactly its output length (EOS ignored), greedy unless ``sampling`` gives
    other ``SamplingParams`` fields (request ``i`` is then seeded ``i``)."""
    return [
        SamplingParams(
            max_tokens=n, ignore_eos=True, **({"seed": i, **sampling} if sampling else {"temperature": 0})
        )
        for i, n in enumerate(workload.output_lens)
    ]


def run_engine(
    llm: LLM,
    workload: Workload,
    name: str = "fast-mode engine",
    sync: Callable[[], None] = lambda: None,
    **sampling,
) -> Throughput:
    """``workload`` through ``llm.generate`` with ``workload_params(workload, **sampling)``; ``sync`` waits
    for the device at both ends of the timing."""
    params = workload_params(workload, **sampling)
    sync()
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, use_tqdm=False)
    sync()
    wall = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    if produced != workload.num_output_tokens:
        raise RuntimeError(
            f"the engine produced {produced} tokens, the workload asks for {workload.num_output_tokens}"
        )
    return Throughput(name, wall, workload.num_prompt_tokens, produced, len(outputs))


def run_hf_static(
    model: PreTrainedModel,
    workload: Workload,
    batch_size: int,
    pad_id: int,
    sync: Callable[[], None] = lambda: None,
    seconds_left: Callable[[], float] | None = None,
) -> Throughput:
    """Padded static batches in arrival order: a batch holds its slots until its longest request is done, so
    only the requested tokens count. With ``seconds_left``, batches stop (after the first) when the next one
    would not fit in the time left; the figures are then those of the batches run."""
    done = prompt_tokens = useful = 0
    wall = last = 0.0
    while done < len(workload.prompts) and (seconds_left is None or done == 0 or seconds_left() > 1.5 * last):
        prompts = workload.prompts[done : done + batch_size]
        wanted = workload.output_lens[done : done + batch_size]
        ids, mask = left_padded(prompts, pad_id, next(model.parameters()).device)
        sync()
        start = time.perf_counter()
        hf_generate(model, ids, max(wanted), mask, pad_id)
        sync()
        last = time.perf_counter() - start
        done += len(prompts)
        prompt_tokens += int(mask.sum())
        useful += sum(wanted)
        wall += last
    return Throughput(f"HF generate, static batches of {batch_size}", wall, prompt_tokens, useful, done)


def compute_ceiling_tokens_per_s(model: torch.nn.Module, batch: int = 512) -> tuple[float, float]:
    """(FLOP/s, tokens/s): every linear of a forward pass, the LM head included, at ``batch`` rows
    (``step_split.linear_seconds``: through the modules themselves, so on CPU each takes the path measured
    fastest for a prompt's rows), a token's matmul FLOPs divided by the time they take."""
    seconds = linear_seconds(model, rows=batch, repeats=3, head_rows=batch)
    return linear_flops(model, batch, head_rows=batch) / seconds, batch / seconds
