"""``bench gpu``'s speculative rows: plain, n-gram and EAGLE chain decoding at batch 1, bundled model."""

from __future__ import annotations

import json
import time

from ..llm import LLM
from ..model import loader
from ..sampling_params import SamplingParams
from ..speculative.eagle import SPEC_DIR
from .gpu_report import Section, SectionSkipped
from .gpu_setup import CPU_KV_CACHE_BYTES, Sizes
from .step_split import step_breakdown
from .timing import device_sync


def measure_speculative(device: str, sizes: Sizes, section: Section) -> None:
    """Plain (the engine's default), n-gram and EAGLE chain decoding of held-back prompts, bundled model."""
    try:
        loader.bundled_model_path()
    except FileNotFoundError as missing:
        raise SectionSkipped(
            f"the EAGLE and n-gram rows need the bundled model ({loader.INSTALL_HINT})"
        ) from missing
    held_back = [json.loads(line)["prompt"] for line in (SPEC_DIR / "heldout.jsonl").read_text().splitlines()]
    methods = {
        "plain": {},
        "n-gram k=3": dict(speculative="ngram", num_speculative_tokens=3),
        "EAGLE chain k=3": dict(speculative="eagle", num_speculative_tokens=3),
    }
    engines = {
        name: LLM(
            device=device, max_num_seqs=1, max_model_len=1024, kv_cache_memory=CPU_KV_CACHE_BYTES, **opts
        )
        for name, opts in methods.items()
    }
    sync, tokenizer = device_sync(device), engines["plain"].tokenizer
    params = SamplingParams(temperature=0, max_tokens=sizes.spec_tokens, ignore_eos=True)
    totals = {
        name: {"seconds": 0.0, "tokens": 0, "passes": 0, "verified": 0, "differ": 0} for name in methods
    }
    for llm in engines.values():
        llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    for text in held_back[: sizes.spec_prompts]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        outputs = {}
        for name, llm in engines.items():
            sync()
            start = time.perf_counter()
            out = llm.generate(prompt, params, use_tqdm=False)[0]
            sync()
            t = totals[name]
            t["seconds"] += time.perf_counter() - start
            t["tokens"] += len(out.outputs[0].token_ids)
            t["passes"] += out.metrics.num_verify_passes
            t["verified"] += out.metrics.num_verified_tokens
            outputs[name] = out.outputs[0].token_ids
        for name in methods:
            totals[name]["differ"] += outputs[name] != outputs["plain"]
    plain = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    section.out.update(
        model=f"bundled {loader.BUNDLED_FILE}, {engines['plain'].engine.config.dtype}",
        prompts=min(sizes.spec_prompts, len(held_back)),
        max_tokens=sizes.spec_tokens,
    )
    section.out["rows"] = [
        {
            "method": name,
            "enforce_eager": engines[name].engine.config.enforce_eager,
            "tok_s": t["tokens"] / t["seconds"],
            "speedup": t["tokens"] / t["seconds"] / plain,
            "tau": t["verified"] / t["passes"] if t["passes"] else 1.0,
            "outputs_differing": t["differ"],
        }
        for name, t in totals.items()
    ]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": held_back[0]}])
    section.out["breakdown"] = [
        {"method": name, **step_breakdown(llm, prompt, params, sync)} for name, llm in engines.items()
    ]
