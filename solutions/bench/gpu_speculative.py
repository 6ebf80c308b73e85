"""``bench gpu``'s speculative rows: plain, n-gram and EAGLE chain decoding at batch 1, bundled model."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from ..llm import LLM
from ..model import loader
from ..sampling_params import SamplingParams
from ..speculative.eagle import SPEC_DIR
from .gpu_report import Section, SectionSkipped
from .gpu_setup import CPU_KV_CACHE_BYTES, Sizes
from .timing import device_sync


def step_breakdown(llm: LLM, prompt: list[int], params: SamplingParams, sync: Callable[[], None]) -> dict:
    """One request decoded alone, each step after its prefill split by part with the device synchronised at
    every boundary (so the parts add up to the step, and the step is slower than unsynchronised): ms a step
    drafting (the speculator's ``propose``), in the forward (``runner.execute``) and in the rest (scheduling,
    verifying, sampling, outputs); and the share of forwards replayed from a decode graph."""
    engine = llm.engine
    spent = {"draft": 0.0, "forward": 0.0, "step": 0.0}
    counts = {"steps": 0, "forwards": 0, "replayed": 0}

    def timed(part: str, fn: Callable) -> Callable:
        def run(*args, **kwargs):
            sync()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            sync()
            spent[part] += time.perf_counter() - start
            return out

        return run

    def counted(key: str, fn: Callable) -> Callable:
        def run(*args, **kwargs):
            counts[key] += 1
            return fn(*args, **kwargs)

        return run

    runner, spec = engine.runner, engine.speculator
    execute, replay = runner.execute, runner.graphs.replay if runner.graphs is not None else None
    propose = spec.propose if spec is not None else None
    runner.execute = counted("forwards", timed("forward", execute))
    if replay is not None:
        runner.graphs.replay = counted("replayed", replay)
    if propose is not None:
        spec.propose = timed("draft", propose)
    try:
        engine.add_request(prompt, params)
        engine.step()  # the prefill, left out: the parts are the decode steps'
        spent.update(dict.fromkeys(spent, 0.0))
        counts.update(dict.fromkeys(counts, 0))
        while engine.has_unfinished_requests():
            sync()
            start = time.perf_counter()
            engine.step()
            sync()
            spent["step"] += time.perf_counter() - start
            counts["steps"] += 1
    finally:
        runner.execute = execute
        if replay is not None:
            runner.graphs.replay = replay
        if propose is not None:
            spec.propose = propose
    per_step = {part: 1e3 * seconds / max(1, counts["steps"]) for part, seconds in spent.items()}
    return {
        "steps": counts["steps"],
        "step_ms": per_step["step"],
        "draft_ms": per_step["draft"],
        "forward_ms": per_step["forward"],
        "other_ms": per_step["step"] - per_step["draft"] - per_step["forward"],
        "graph_share": counts["replayed"] / max(1, counts["forwards"]),
    }


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
