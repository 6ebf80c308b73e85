"""The engine's own work in a decode step, with the model taken out.

On a GPU a decode step is host work (scheduling, the persistent input batch, launching the graph and the
sampler, reading the sampled ids, stop checks, outputs) followed by device work; with the forward replayed
from a CUDA graph, the host part is what keeps the GPU idle between steps. Here the decode graph is a
``StoredLogits``: captured like a graph, its replay returns the logits of its capture at no cost, so a
timed step is the host part alone, on any machine. The model is the toy shape (its small vocabulary keeps
the sampler's argmax, device work on a GPU, out of the figures).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..engine.cuda_graphs import RecordedCall
from ..engine.outputs import OutputKind
from ..llm import LLM
from ..sampling_params import SamplingParams
from .model_shapes import ModelShape

PROMPT_TOKENS = 3


class StoredLogits(RecordedCall):
    """A decode "graph" whose replay returns the logits its capture computed: a step without the model."""

    def replay(self) -> tuple[torch.Tensor, ...]:
        return self.outputs


def measure_host_steps(
    folder: Path, shape: ModelShape, batch: int, output_kind: OutputKind, marks: list[int], steps: int
) -> list[float]:
    """``batch`` greedy requests of the model in ``folder`` (of ``shape``) decoding from a ``StoredLogits``
    graph; at each of ``marks`` (tokens out, ascending) the mean host time of the next ``steps`` steps, in
    microseconds."""
    longest = marks[-1] + steps + 1
    max_model_len = PROMPT_TOKENS + longest + 1
    token_bytes = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * 4  # K and V, float32
    llm = LLM(
        model=str(folder), device="cpu", dtype="float32", skip_tokenizer_init=True, max_num_seqs=batch,
        max_model_len=max_model_len, max_num_batched_tokens=max(512, batch * PROMPT_TOKENS),
        kv_cache_memory=(batch + 1) * (max_model_len + 16) * token_bytes,
    )  # fmt: skip
    engine = llm.engine
    engine.runner.capture_decode_graphs(batch, StoredLogits)
    params = SamplingParams(temperature=0, max_tokens=longest, ignore_eos=True)
    prompts = [[1 + i % 100, 2, 3] for i in range(batch)]
    ids = engine.add_requests(prompts, [params] * batch, output_kind=output_kind)
    engine.step()  # the prefill: one token out
    results, done = [], 1
    for mark in marks:
        while done < mark:
            engine.step()
            done += 1
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        results.append(1e6 * (time.perf_counter() - start) / steps)
        done += steps
    engine.abort(ids)
    return results
