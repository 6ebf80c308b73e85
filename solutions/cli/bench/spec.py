"""``python -m solutions bench spec``: batch-1 greedy decode, plain vs n-gram vs EAGLE vs Medusa drafts.

Every method decodes the same held-back prompts (``data/spec/heldout.jsonl``: the EAGLE head never trained
on them), interleaved prompt by prompt so that a noisy shared machine slows all methods alike. Greedy
outputs must match plain decoding token for token; the table gives tokens/s, the speed-up over plain and
τ (tokens per target pass), with the goals beside them. Two more rows run the AWQ INT4 engine (Lesson 6),
plain and with the EAGLE tree, against llama.cpp on the bundled Q4_1 GGUF when ``llama_cpp`` is installed
(an optional peer: its outputs come from other weights, so they are timed, not compared).

``--offline`` instead scores EAGLE and Medusa chains and trees of several sizes teacher-forced on the
held-back greedy answers (``speculative.acceptance``): the τ each could reach, the share of positions
accepting at least 1, 2, 3, 4 drafts (for a Medusa chain: how far its heads 1, 2, 3, 4 carry), and its
drafting time, with no target pass per step.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ...bench.decode import llama_cpp_generator
from ...bench.machine import machine_name
from ...llm import LLM
from ...sampling_params import SamplingParams
from ...speculative.acceptance import greedy_answers, teacher_forced_acceptance
from ...speculative.drafter import EagleDrafter
from ...speculative.eagle import HEAD_PATH, SPEC_DIR, load_head
from ...speculative.medusa import MedusaDrafter, load_heads

GOALS = {"tau_tree": 3.0, "speedup": 2.0, "vs_llama_cpp": 1.5}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions bench spec", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--prompts", type=int, default=6, help="held-back prompts to use (of 12)")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3, help="chain length")
    parser.add_argument("--tree-nodes", type=int, default=8)
    parser.add_argument("--tree-depth", type=int, default=4)
    parser.add_argument("--tree-top-k", type=int, default=4, help="nodes expanded per depth")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--offline",
        action="store_true",
        help="instead: teacher-forced tau of EAGLE and Medusa chains and trees on the "
        "held-back greedy answers",
    )
    parser.add_argument("--eagle-head", default=None, help="an EAGLE head file other than the shipped one")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in (SPEC_DIR / "heldout.jsonl").read_text().splitlines()]
    mixed = sorted(range(len(rows)), key=lambda i: (i % 4, i))[: args.prompts]  # mix the kinds
    if args.offline:
        return offline(mixed, args.eagle_head)
    rows = [rows[i] for i in mixed]
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
        f"Medusa chain k={k}": dict(speculative="medusa", num_speculative_tokens=k),
        f"Medusa tree {args.tree_nodes}": dict(
            speculative="medusa",
            num_speculative_tokens=args.tree_depth,
            speculative_tree_nodes=args.tree_nodes,
            speculative_tree_top_k=args.tree_top_k,
        ),
    }
    tree = methods[f"EAGLE tree {args.tree_nodes}"]
    methods |= {
        "plain, AWQ INT4": dict(quantization="awq"),
        "EAGLE tree, AWQ INT4": dict(quantization="awq", **tree),
    }
    head = {"eagle_head": args.eagle_head} if args.eagle_head else {}
    engines = {
        name: LLM(
            device=args.device,
            max_num_seqs=1,
            max_model_len=1024,
            kv_cache_memory=64 << 20,
            **opts,
            **(head if opts.get("speculative") == "eagle" else {}),
        )
        for name, opts in methods.items()
    }
    llama_cpp = llama_cpp_generator(torch.get_num_threads())
    if llama_cpp is not None:
        methods["llama.cpp Q4_1 (peer)"] = {}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    seconds = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    passes = dict.fromkeys(methods, 0)
    verified = dict.fromkeys(methods, 0)
    differ: dict[str, int] = {}  # method -> prompts whose output is not its plain engine's
    print(f"{machine_name()}: {len(rows)} held-back prompts x {args.max_tokens} tokens, batch 1, greedy")
    for row in rows:
        outputs = {}
        prompt = engines["plain"].tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}])
        for name, llm in engines.items():
            start = time.perf_counter()
            out = llm.generate(prompt, params)[0]
            seconds[name] += time.perf_counter() - start
            outputs[name] = out.outputs[0].token_ids
            tokens[name] += len(out.outputs[0].token_ids)
            passes[name] += out.metrics.num_verify_passes
            verified[name] += out.metrics.num_verified_tokens
        if llama_cpp is not None:
            prompt_ids = engines["plain"].tokenizer.encode(prompt)
            start = time.perf_counter()
            tokens["llama.cpp Q4_1 (peer)"] += len(llama_cpp(prompt_ids, args.max_tokens))
            seconds["llama.cpp Q4_1 (peer)"] += time.perf_counter() - start
        for name, ids in outputs.items():
            if ids != outputs["plain, AWQ INT4" if "AWQ" in name else "plain"]:
                differ[name] = differ.get(name, 0) + 1
    plain_speed = tokens["plain"] / seconds["plain"]
    print(f"{'method':20s} | {'tokens/s':>8s} | {'speed-up':>8s} | {'tau':>5s}")
    for name in methods:
        speed = tokens[name] / seconds[name]
        tau = verified[name] / passes[name] if passes[name] else 1.0
        print(f"{name:20s} | {speed:8.1f} | {speed / plain_speed:7.2f}x | {tau:5.2f}")
    print(f"goals: tau >= {GOALS['tau_tree']} with trees (EAGLE-2 reports 4.5-5 on 7B chat models); "
          f">= {GOALS['speedup']}x plain decode at batch 1")  # fmt: skip
    print(
        f"trees: depth {args.tree_depth}, top-{args.tree_top_k} expanded per depth, "
        f"{args.tree_nodes} nodes kept; Medusa paper (Cai et al. 2024, Vicuna 7B-33B on a GPU): "
        "Medusa-1 ~2.2x, Medusa-2 2.3-3.6x"
    )
    goal = f"goal: AWQ batch-1 >= {GOALS['vs_llama_cpp']}x llama.cpp Q4_1"
    if llama_cpp is None:
        print(
            f"llama.cpp comparison ({goal}): not run, llama_cpp is not installed "
            "(pip install llama-cpp-python)"
        )
    else:
        peer = tokens["llama.cpp Q4_1 (peer)"] / seconds["llama.cpp Q4_1 (peer)"]
        best = max((name for name in methods if "AWQ" in name), key=lambda name: tokens[name] / seconds[name])
        print(f"{best} vs llama.cpp Q4_1: {tokens[best] / seconds[best] / peer:.2f}x ({goal})")
    if not differ:
        print("outputs identical to plain decoding (AWQ rows: to plain AWQ)")
    for name, count in differ.items():
        print(f"{name}: {count} of {len(rows)} outputs DIFFER from its plain engine's")
        if "AWQ" in name:  # expected: not a failure of the method, a property of reduced-precision kernels
            print(
                "  (bfloat16 activations: a verify pass computes each position among several rows, "
                "plain decoding one row at a time; the rounding differs, so a near-tie can flip. "
                "The tests hold AWQ + EAGLE to plain AWQ token for token with float32 activations.)"
            )
    return 1 if any("AWQ" not in name for name in differ) else 0


OFFLINE_DRAFTERS = {  # name: (chain length or tree depth, tree top-k, tree nodes; 0 nodes: a chain)
    "EAGLE chain k=1": (1, 1, 0),
    "EAGLE chain k=3": (3, 1, 0),
    "EAGLE chain k=4": (4, 1, 0),
    "EAGLE chain k=5": (5, 1, 0),
    "EAGLE tree 8 (4 deep, top-4)": (4, 4, 8),
    "EAGLE tree 16 (5 deep, top-6)": (5, 6, 16),
    "EAGLE tree 32 (6 deep, top-8)": (6, 8, 32),
    "EAGLE tree 64 (8 deep, top-10)": (8, 10, 64),
    "Medusa chain k=4": (4, 1, 0),  # its 4 heads: depth d is head d
    "Medusa tree 8 (4 deep, top-4)": (4, 4, 8),
    "Medusa tree 16 (4 deep, top-6)": (4, 6, 16),
    "Medusa tree 32 (4 deep, top-8)": (4, 8, 32),
}


def offline(indices: list[int], head_path: str | None = None) -> int:
    """Teacher-forced τ (``speculative.acceptance``) of the EAGLE head at ``head_path`` (default: the shipped
    one) and the shipped Medusa heads on the held-back prompts' greedy answers, at the same positions: what
    larger trees could give before any verify pass is paid for. float32, no target pass per step."""
    lines = (SPEC_DIR / "heldout_responses.jsonl").read_text().splitlines()
    model = LLM(device="cpu", dtype="float32", max_model_len=1024).engine.model
    answers = greedy_answers(model, [json.loads(lines[i]) for i in indices])
    head = load_head(model, head_path or HEAD_PATH)
    heads = load_heads(model)
    positions = sum(len(ids) - 1 - start for ids, start, _ in answers)
    print(
        f"{machine_name()}: teacher-forced on {len(answers)} held-back greedy answers, {positions} positions"
    )
    print(f"{'drafter':32s} | {'tau':>5s} | P(accepted >= 1, 2, 3, 4) | draft ms/step")
    for name, (depth, top_k, nodes) in OFFLINE_DRAFTERS.items():
        kind, owner = (MedusaDrafter, heads) if name.startswith("Medusa") else (EagleDrafter, head)
        drafter = kind(owner, depth, tree_depth=depth if nodes else 0, tree_top_k=top_k)
        result = teacher_forced_acceptance(drafter, answers, nodes)
        shares = "  ".join(f"{result.at_least(d):.2f}" for d in range(1, 5))
        print(f"{name:32s} | {result.tau:5.2f} | {shares:>25s} | {result.draft_seconds * 1e3:8.1f}")
    print(
        f"goal: tau >= {GOALS['tau_tree']} with trees (the engine's tau can differ where a verify "
        "pass breaks a near-tie)"
    )
    return 0
