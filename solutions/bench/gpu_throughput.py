"""``bench gpu``'s throughput section: nano-vllm's offline workload through this engine and through Hugging
Face ``generate`` in padded static batches."""

from __future__ import annotations

import random
import time

import torch

from ..kernels.blocks import cdiv
from ..sampling_params import SamplingParams
from .decode_steps import device_sync, random_prompts
from .gpu_report import Section
from .gpu_setup import ShapeModels, Sizes, label
from .hf_peer import hf_generate, left_padded


def nano_vllm_workload(sizes: Sizes, vocab_size: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """(prompts, output lengths): random token ids below min(10,000, vocab), lengths uniform in the ranges."""
    rng = random.Random(seed)
    top = min(10_000, vocab_size)
    prompts = [
        [rng.randrange(top) for _ in range(rng.randint(*sizes.prompt_lens))] for _ in range(sizes.requests)
    ]
    return prompts, [rng.randint(*sizes.output_lens) for _ in range(sizes.requests)]


def measure_throughput(models: ShapeModels, section: Section) -> None:
    s, device, sync = models.sizes, models.device, device_sync(models.device)
    prompts, output_lens = nano_vllm_workload(s, models.shape.vocab_size)
    lo_in, hi_in = s.prompt_lens
    lo_out, hi_out = s.output_lens
    section.out["workload"] = {
        "description": f"nano-vllm's workload: random token ids, prompt lengths uniform in [{lo_in}, "
        f"{hi_in}], output lengths uniform in [{lo_out}, {hi_out}] (seed 0), greedy, EOS ignored",
        "requests": len(prompts),
        "prompt_tokens": sum(map(len, prompts)),
        "output_tokens": sum(output_lens),
    }
    rows = section.out["rows"] = []
    models.release("eager")  # room for HF's static batches
    llm = models.llm("graphs")
    warm_up = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate(random_prompts(2, 16, models.shape.vocab_size, seed=7), warm_up, use_tqdm=False)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in output_lens]
    sync()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    wall = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    if produced != sum(output_lens):
        raise RuntimeError(f"the engine produced {produced} tokens, the workload asks for {sum(output_lens)}")
    rows.append(
        {
            "engine": "graphs",
            "label": label("graphs", device) + f", max_num_seqs={models.max_num_seqs}",
            "requests": len(prompts),
            "output_tokens": produced,
            "wall_s": wall,
            "output_tok_s": produced / wall,
        }
    )
    hf = models.hf()
    warm_ids = torch.ones(2, 4, dtype=torch.long, device=device)
    hf_generate(hf, warm_ids, 2)
    sync()
    done, useful, wall, last = 0, 0, 0.0, 0.0
    while done < len(prompts) and (done == 0 or section.seconds_left() > 1.5 * last):
        batch, wanted = prompts[done : done + s.hf_batch], output_lens[done : done + s.hf_batch]
        ids, mask = left_padded(batch, device=device)
        start = time.perf_counter()
        hf_generate(hf, ids, max(wanted), mask)  # the batch holds every slot until its longest is done
        sync()
        last = time.perf_counter() - start
        done, useful, wall = done + len(batch), useful + sum(wanted), wall + last
    batches = cdiv(len(prompts), s.hf_batch)
    rows.append(
        {
            "engine": "hf",
            "label": f"HF generate, static batches of {s.hf_batch} in arrival order (left-padded, "
            f"unsorted): the first {cdiv(done, s.hf_batch)} of {batches}",
            "requests": done,
            "output_tokens": useful,
            "wall_s": wall,
            "output_tok_s": useful / wall,
        }
    )
    section.out["ratio_vs_hf"] = rows[0]["output_tok_s"] / rows[1]["output_tok_s"]
