"""``python -m solutions bench spec``: batch-1 greedy decode, plain vs n-gram vs EAGLE chain vs EAGLE tree.

Every method decodes the same held-back prompts (``data/spec/heldout.jsonl``: the EAGLE head never trained
on them), interleaved prompt by prompt so that a noisy shared machine slows all methods alike. Greedy
outputs must match plain decoding token for token; the table gives tokens/s, the speed-up over plain and
τ (tokens per target pass), with the goals beside them.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

GOALS = {"tau_tree": 3.0, "speedup": 2.0}


def _machine() -> str:
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    cpu = torch.cuda.get_device_name() if torch.cuda.is_available() else (names[0] if names else platform.machine())
    return f"{cpu}, {torch.get_num_threads()} threads"


def _llama_cpp_line() -> str:
    """The AWQ-vs-llama.cpp goal needs the llama_cpp package on this machine; say so when it is absent."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:
        return "llama.cpp comparison (goal: AWQ batch-1 >= 1.5x llama.cpp Q4_1): not run, llama_cpp is not installed"
    return "llama.cpp comparison (goal: AWQ batch-1 >= 1.5x llama.cpp Q4_1): llama_cpp is installed but not wired here"


def main(argv: list[str] | None = None) -> int:
    from ..engine.sampling_params import SamplingParams
    from ..llm import LLM
    from ..spec.eagle import DATA_DIR

    parser = argparse.ArgumentParser(prog="python -m solutions bench spec", description=__doc__.split("\n")[0])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--prompts", type=int, default=6, help="held-back prompts to use (of 12)")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3, help="chain length")
    parser.add_argument("--tree-nodes", type=int, default=8)
    parser.add_argument("--tree-depth", type=int, default=4)
    parser.add_argument("--tree-top-k", type=int, default=4, help="nodes expanded per depth")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in (DATA_DIR / "heldout.jsonl").read_text().splitlines()]
    rows = [rows[i] for i in sorted(range(len(rows)), key=lambda i: (i % 4, i))][: args.prompts]  # mix the kinds
    k = args.num_speculative_tokens
    methods = {
        "plain": {},
        f"n-gram k={k}": dict(speculative="ngram", num_speculative_tokens=k),
        f"EAGLE chain k={k}": dict(speculative="eagle", num_speculative_tokens=k),
        f"EAGLE tree {args.tree_nodes}": dict(
            speculative="eagle",
            num_speculative_tokens=args.tree_depth,
            speculative_tree_nodes=args.tree_nodes,
            speculative_tree_top_k=args.tree_top_k,
        ),
    }
    engines = {
        name: LLM(device=args.device, max_num_seqs=1, max_model_len=1024, kv_cache_memory=64 << 20, **opts)
        for name, opts in methods.items()
    }
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    passes = dict.fromkeys(methods, 0)
    verified = dict.fromkeys(methods, 0)
    mismatches = 0
    print(f"{_machine()}: {len(rows)} held-back prompts x {args.max_tokens} tokens, batch 1, greedy")
    for row in rows:
        outputs = {}
        for name, llm in engines.items():
            prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}])
            start = time.perf_counter()
            out = llm.generate(prompt, params)[0]
            seconds[name] += time.perf_counter() - start
            outputs[name] = out.outputs[0].token_ids
            tokens[name] += len(out.outputs[0].token_ids)
            passes[name] += out.metrics.num_verify_passes
            verified[name] += out.metrics.num_verified_tokens
        mismatches += sum(ids != outputs["plain"] for ids in outputs.values())
    plain_speed = tokens["plain"] / seconds["plain"]
    print(f"{'method':18s} | {'tokens/s':>8s} | {'speed-up':>8s} | {'tau':>5s}")
    for name in methods:
        speed = tokens[name] / seconds[name]
        tau = verified[name] / passes[name] if passes[name] else 1.0
        print(f"{name:18s} | {speed:8.1f} | {speed / plain_speed:7.2f}x | {tau:5.2f}")
    print(f"goals: tau >= {GOALS['tau_tree']} with trees (EAGLE-2 reports 4.5-5 on 7B chat models); "
          f">= {GOALS['speedup']}x plain decode at batch 1")  # fmt: skip
    print(f"tree: depth {args.tree_depth}, top-{args.tree_top_k} expanded per depth, {args.tree_nodes} nodes kept")
    print(_llama_cpp_line())
    print("outputs identical to plain decoding" if not mismatches else f"{mismatches} outputs DIFFER from plain")
    return 1 if mismatches else 0
