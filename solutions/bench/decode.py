"""What ``python -m solutions bench decode`` measures with (``cli/bench/decode.py``), shared with the other
decode benchmarks: decode tokens/s as (time for N tokens - time for 1) / (N - 1), engines alternating and the
median kept; the peers the engine is compared with, Hugging Face ``transformers`` (the same weights, loaded
quietly; ``generate`` run for exactly the greedy tokens asked for, EOS ignored; imported only by a run that
uses it: it takes seconds) and llama.cpp (optional); the time to first token of one long prompt."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..llm import LLM
from ..model.loader import bundled_model_path
from ..sampling_params import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PROMPT = "The history of the printing press begins"


@contextmanager
def layers_as_modules(llm: LLM) -> Iterator[None]:
    """Inside, ``llm``'s model runs every step through its layer modules: its ``fused_decode`` (the layers
    without module calls, ``model/cpu_decode_layers.py``) is set aside, to time the engine both ways."""
    model = llm.engine.model
    fused, model.fused_decode = model.fused_decode, None
    try:
        yield
    finally:
        model.fused_decode = fused


def modules_run(llm: LLM, prompt: str, params: Callable[[int], SamplingParams]) -> Callable[[int], object]:
    """A ``decode_speeds`` run: ``llm`` generating ``n`` tokens after ``prompt`` through its layer modules."""

    def run(n: int) -> object:
        with layers_as_modules(llm):
            return llm.generate(prompt, params(n))

    return run


def decode_speeds(
    runs: dict,
    new_tokens: int,
    repeats: int,
    each_repeat: Callable[[dict[str, float]], None] = lambda speeds: None,
) -> dict[str, float]:
    """Median decode tokens/s of each ``runs[name](n)`` (generates n tokens), measured alternately: each
    repeat runs every engine once, so drifts in machine speed hit them all alike. A repeat's figure is
    (t(new_tokens) - t(1)) / (new_tokens - 1), t(1) the fastest of three runs: a pause of the machine in the
    one short run it is subtracted from would otherwise count against the decode steps (on a busy host, enough
    to make a small model's figure negative). ``each_repeat`` gets the medians so far after every repeat
    (a report saves them as they exist)."""
    for run in runs.values():
        run(8)  # warm up
    figures: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            one = min(_seconds(run, 1) for _ in range(3))
            figures[name].append((_seconds(run, new_tokens) - one) / (new_tokens - 1))
        each_repeat({name: 1 / statistics.median(f) for name, f in figures.items()})
    return {name: 1 / statistics.median(f) for name, f in figures.items()}


def _seconds(run: Callable[[int], object], n: int) -> float:
    start = time.perf_counter()
    run(n)
    return time.perf_counter() - start


def llama_cpp_generator(threads: int) -> Callable[[list[int], int], list[int]] | None:
    """llama.cpp on the bundled Q4_1 GGUF (an optional peer), or None if ``llama_cpp`` is not importable:
    ``generate(prompt_ids, n)`` returns its first ``n`` greedy tokens after ``prompt_ids`` (EOS ignored)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llama = Llama(str(bundled_model_path()), n_threads=threads, n_ctx=1024, verbose=False)

    def generate(prompt_ids: list[int], n: int) -> list[int]:
        llama.reset()
        out = []
        for token in llama.generate(prompt_ids, temp=0.0):
            out.append(token)
            if len(out) == n:
                break
        return out

    generate.tokenize = lambda text: llama.tokenize(text.encode())
    return generate


def llama_cpp_runner(threads: int) -> Callable[[int], list[int]] | None:
    """A decode runner (``run(n)``: n tokens after ``PROMPT``) for llama.cpp, or None if not importable."""
    generate = llama_cpp_generator(threads)
    if generate is None:
        return None
    ids = generate.tokenize(PROMPT)
    return lambda n: generate(ids, n)


LLAMA_CPP_MISSING = (
    "llama.cpp peer: llama_cpp not importable (optional: pip install llama-cpp-python, compiles for minutes)"
)


def prefill_seconds(llm: LLM, prompt_ids: list[int], repeats: int) -> float:
    """Median time to first token of one prompt (prefill + one sampled token). ``llm`` must not cache
    prefixes: every repeat has to compute the whole prompt."""
    if llm.engine.config.enable_prefix_caching:
        raise ValueError(
            "prefill_seconds needs an LLM with enable_prefix_caching=False (repeats would hit the cache)"
        )
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate(prompt_ids[:64], params)  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        llm.generate(prompt_ids, params)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def load_hf_model(
    folder: Path | None = None, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> PreTrainedModel:
    """A checkpoint ``folder`` (default: the bundled GGUF) as a ``transformers`` causal LM in eval mode,
    without its loading messages or progress bars."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    if folder is None:
        path = bundled_model_path()
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.to(device).eval()


def left_padded(
    prompts: list[list[int]], pad_id: int = 0, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded static batch as ``generate`` takes it: ``ids`` ``[B, longest]`` with each prompt right-aligned
    after ``pad_id``s, and the ``mask`` that is 1 on the prompts' own tokens."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def hf_generate(
    model: PreTrainedModel,
    ids: torch.Tensor,
    new_tokens: int,
    mask: torch.Tensor | None = None,
    pad_token_id: int = 0,
) -> torch.Tensor:
    """Exactly ``new_tokens`` greedy tokens after each row of ``ids`` ``[B, L]`` (left-padded where ``mask``
    is 0); returns the rows with them appended."""
    with torch.inference_mode():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids) if mask is None else mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad_token_id,
        )
