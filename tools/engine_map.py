"""The reader's map of one engine step: the files a request meets, in order, with their line counts.

README.md's layout section and CONTRIBUTING.md each hold the map between ``<!-- engine map -->`` and
``<!-- /engine map -->``; ``python tools/engine_map.py --write`` rewrites both from ``STAGES`` and today's
line counts, and ``tests/test_engine_step.py`` fails when a block is stale or a file of ``solutions/engine/``
is not on the map.

    python tools/engine_map.py            print the map
    python tools/engine_map.py --write    rewrite it in README.md and CONTRIBUTING.md
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "CONTRIBUTING.md")
BEGIN, END = "<!-- engine map -->", "<!-- /engine map -->"

# (file under solutions/, the stage of a step it holds), in the order a request meets them.
STAGES = (
    ("engine/kv_sizing.py", "at start-up: the KV cache sized to what the steps leave of the device's memory"),
    ("llm.py", "`LLM.generate`: submits the prompts, loops `Engine.step` until every request finishes"),
    ("engine/request.py", "`RequestGroup.create` validates a prompt; a request's tokens, stop rules, state"),
    ("engine/engine.py", "`Engine.step`: schedule, execute, sample / verify, update, outputs"),
    ("engine/speculator.py", "drafts before the step, verifies after it (Lesson 4; `NO_SPECULATION` else)"),
    ("engine/scheduler.py", "which requests run how many tokens: decodes first, chunked prefill, preemption"),
    ("cache/kv_cache_manager.py", "the blocks each request holds, prefix-cache hits, copy-on-write forks"),
    ("engine/runner.py", "one flat forward pass over the step's tokens; the step's one read of sampled ids"),
    ("engine/input_batch.py", "persistent per-request rows, the step's inputs sent in one copy"),
    ("engine/cuda_graphs.py", "decode steps replayed from CUDA graphs, one per batch bucket"),
    ("engine/tp_executor.py", "tensor parallelism, rank 0: starts the workers, sends each step"),
    ("engine/tp_step.py", "what rank 0 tells the other ranks about a step"),
    ("engine/tp_worker.py", "ranks 1 .. N-1: rebuild the step's inputs, run the same forward on their shard"),
    ("model/llama.py", "the model: every layer, attention writing K/V into paged blocks"),
    ("engine/sampling_batch.py", "each request's sampling settings on the device, gathered per sampled row"),
    ("kernels/sampling.py", "the draw: temperature, top-k, top-p, min-p, seeded uniforms"),
    ("engine/logprobs.py", "log-probabilities of sampled and prompt tokens, for the requests that ask"),
    ("engine/detokenizer.py", "incremental text, stop strings held back until ruled out"),
    ("engine/outputs.py", "`RequestOutput`, `CompletionOutput` and each request's metrics"),
)


def line_count(path: str) -> int:
    return len((ROOT / "solutions" / path).read_text().splitlines())


def render() -> str:
    """The map as a markdown table between the markers (no trailing newline)."""
    rows = [BEGIN, "| # | file (`solutions/`) | lines | stage of a step |", "|---|---|--:|---|"]
    for number, (path, stage) in enumerate(STAGES, 1):
        rows.append(f"| {number} | `{path}` | {line_count(path)} | {stage} |")
    return "\n".join([*rows, END])


def block_in(text: str) -> str | None:
    """The map block of a document (markers included), or None when it has none."""
    found = re.search(re.escape(BEGIN) + ".*?" + re.escape(END), text, flags=re.S)
    return found.group(0) if found else None


def write() -> None:
    for name in DOCS:
        path = ROOT / name
        text = path.read_text()
        if block_in(text) is None:
            raise ValueError(f"{name} has no {BEGIN} ... {END} block to rewrite")
        path.write_text(text.replace(block_in(text), render()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the map in README.md, CONTRIBUTING.md")
    if parser.parse_args().write:
        write()
    else:
        print(render())


if __name__ == "__main__":
    main()
