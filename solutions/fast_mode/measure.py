"""The planner's figures, measured on this machine with the engine itself (Lab 7's inputs).

- ``measure_weight_format``: bytes a decode step reads (the tensors of its matrix products), how fast those
  products stream them (``step_split.linear_seconds``), the rest of a batch-1 step, what each extra row adds
  (the slope of TPOT from batch 1 to ``batch``, ``batching.measure_batch_speed``), and the prefill rate.
- ``measure_drafting``: the EAGLE head's drafting time per step and teacher-forced tau on held-back greedy
  answers (``speculative.acceptance``), no target pass involved.

Each figure comes from a short run: on a shared machine repeat the call and compare, as the notebook does.
"""

from __future__ import annotations

import json
import random
import statistics

from torch import nn

from ..bench.batching import BatchSpeed, measure_batch_speed
from ..bench.step_split import linear_seconds, step_linears
from ..llm import LLM
from ..sampling_params import SamplingParams
from ..speculative.acceptance import Acceptance, greedy_answers, teacher_forced_acceptance
from ..speculative.drafter import EagleDrafter
from ..speculative.eagle import SPEC_DIR, load_head
from .planner import WeightFormat


def step_weight_bytes(model: nn.Module) -> int:
    """Bytes of every tensor (parameters and buffers: packed INT4 codes, scales) of the matrix products a
    decode step runs, LM head included; the norms' weights and the one embedding row a step reads are not."""
    total = 0
    for linear in step_linears(model):
        total += sum(t.numel() * t.element_size() for t in (*linear.parameters(), *linear.buffers()))
    return total


def measure_prefill_seconds(llm: LLM, prompt_tokens: int, repeats: int = 3, seed: int = 0) -> float:
    """Median TTFT of one lone ``prompt_tokens``-token prompt (random token ids, a new one each time, so the
    prefix cache never serves it), after one warm-up."""
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens}")
    rng = random.Random(seed)
    vocab = llm.engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    times = []
    for _ in range(repeats + 1):
        prompt = [rng.randrange(vocab) for _ in range(prompt_tokens)]
        times.append(llm.generate(prompt, params, use_tqdm=False)[0].metrics.ttft)
    return statistics.median(times[1:])


def measure_weight_format(
    llm: LLM,
    name: str,
    batch: int = 8,
    new_tokens: int = 16,
    prompt_tokens: int = 256,
    sweep: dict[int, BatchSpeed] | None = None,
) -> WeightFormat:
    """Measure ``llm``'s engine as a ``WeightFormat`` (its max_num_seqs must allow ``batch``).

    ``row_s`` is the slope of the median TPOT between batch 1 and ``batch`` (never below 0: on a noisy machine
    the two can come out in the wrong order). ``sweep``, a batch sweep already measured on this engine
    (``measure_batch_speed`` by batch size), gives them instead: its batch 1 and its largest batch.
    ``prefill_tokens_per_s`` counts the prompt's tokens over the part of a lone prompt's TTFT beyond one
    decode step, so that the planner's TTFT (prefill + one step) equals the measured one at batch 1."""
    if sweep is not None:
        if 1 not in sweep or len(sweep) < 2:
            raise ValueError(f"a sweep needs batch 1 and a larger batch, got batches {sorted(sweep)}")
        batch = max(sweep)
    if batch < 2:
        raise ValueError(f"batch must be >= 2 to measure what a row adds, got {batch}")
    if llm.engine.config.device != "cpu":
        raise ValueError(
            "measure_weight_format times a CPU engine (the linears' timing does not synchronise a GPU); "
            "on a GPU, `python -m solutions bench gpu` measures the steps"
        )
    model = llm.engine.model
    weight_bytes = step_weight_bytes(model)
    linears_s = linear_seconds(model, rows=1)
    one = sweep[1] if sweep else measure_batch_speed(llm, 1, new_tokens)
    many = sweep[batch] if sweep else measure_batch_speed(llm, batch, new_tokens)
    ttft = measure_prefill_seconds(llm, prompt_tokens)
    if ttft <= one.tpot_s:
        raise ValueError(
            f"a {prompt_tokens}-token prompt's TTFT ({ttft * 1e3:.1f} ms) came out no longer than a decode "
            f"step ({one.tpot_s * 1e3:.1f} ms): use a longer prompt_tokens"
        )
    config = llm.engine.config
    options = {"dtype": config.dtype} | ({"quantization": config.quantization} if config.quantization else {})
    return WeightFormat(
        name=name,
        engine_options=options,
        weight_bytes=weight_bytes,
        linear_bandwidth=weight_bytes / linears_s,
        step_overhead_s=max(0.0, one.tpot_s - linears_s),
        row_s=max(0.0, (many.tpot_s - one.tpot_s) / (batch - 1)),
        prefill_tokens_per_s=prompt_tokens / (ttft - one.tpot_s),
    )


def measure_drafting(
    model: nn.Module, depth: int, tree_nodes: int = 0, tree_top_k: int = 4, answers: int = 2
) -> Acceptance:
    """``speculative.acceptance.Acceptance`` (teacher-forced tau, ``draft_seconds`` per step) of the shipped
    EAGLE head drafting a chain of ``depth`` (``tree_nodes == 0``) or a tree of ``tree_nodes`` nodes ``depth``
    deep, on the first ``answers`` held-back greedy answers (``data/spec/heldout_responses.jsonl``)."""
    if depth < 1 or tree_nodes < 0 or answers < 1:
        raise ValueError(
            f"need depth >= 1, tree_nodes >= 0 and answers >= 1, got {depth}, {tree_nodes}, {answers}"
        )
    lines = (SPEC_DIR / "heldout_responses.jsonl").read_text().splitlines()[:answers]
    scored = greedy_answers(model, [json.loads(line) for line in lines])
    drafter = EagleDrafter(
        load_head(model), depth, tree_depth=depth if tree_nodes else 0, tree_top_k=tree_top_k
    )
    return teacher_forced_acceptance(drafter, scored, tree_nodes)
