"""``python -m solutions bench spec``: batch-1 greedy decode, plain vs n-gram, EAGLE, Medusa, per dtype.

Every method decodes the same held-back prompts (``data/spec/heldout.jsonl``: the EAGLE head never trained
on them), interleaved prompt by prompt and in several rounds, so that a noisy shared machine slows all methods
alike; each figure is the median over rounds with the rounds' spread. Greedy outputs must match the plain
engine of the same dtype (``--dtypes``: float32, bfloat16, AWQ INT4) token for token. Each row takes the
speed-up apart (``bench/spec_costs.py``): ``S = tau / (1 + k c + v)`` with ``c`` one draft pass and ``v`` the
verify pass's extra cost, both over one plain step, and ``tau`` the tokens per verify pass. ``bench gpu``'s
speculative rows (``cli/bench/gpu.py``) are plain, n-gram and EAGLE chains, timed by ``time_methods``.

``--offline`` instead scores EAGLE and Medusa chains and trees of several sizes teacher-forced on the
held-back greedy answers (``speculative.acceptance``): the τ each could reach, the share of positions
accepting at least 1, 2, 3, 4 drafts (for a Medusa chain: how far its heads 1, 2, 3, 4 carry), and its
drafting time, with no target pass per step. ``--offline --draft-vocab 1024,...,full`` scores the EAGLE
head's chain and tree over draft vocabularies of several sizes (its most frequent training tokens).
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable

import torch

from ...bench.machine import machine_name
from ...bench.spec_costs import MethodCosts, run_rounds, split_against
from ...bench.verify_rows import verify_engine, verify_step_ms
from ...kernels.batch_invariant import batch_invariant
from ...llm import LLM
from ...sampling_params import SamplingParams
from ...speculative.acceptance import greedy_answers, teacher_forced_acceptance
from ...speculative.drafter import EagleDrafter
from ...speculative.eagle import HEAD_PATH, SPEC_DIR, load_head
from ...speculative.medusa import MedusaDrafter, load_heads
from ...speculative.tree_choice import TreeOption, choose_tree, interpolate
from . import bench_parser

GOALS = {"tau_tree": 3.0, "speedup": 2.0, "speedup_int4": 1.6}
PEER = "llama.cpp Q4_1 (peer)"


def chain_methods(k: int) -> dict[str, dict]:
    """The engine options of plain decoding and of the n-gram and EAGLE chains of ``k`` drafts."""
    return {
        "plain": {},
        f"n-gram k={k}": dict(speculative="ngram", num_speculative_tokens=k),
        f"EAGLE chain k={k}": dict(speculative="eagle", num_speculative_tokens=k),
    }


def batch_one_engines(methods: dict[str, dict], device: str, kv_cache_memory: int) -> dict[str, LLM]:
    """An engine per method (its options over the shared ones): one sequence at a time, 1024 tokens long."""
    return {
        name: LLM(device=device, max_num_seqs=1, max_model_len=1024, kv_cache_memory=kv_cache_memory, **opts)
        for name, opts in methods.items()
    }


def time_methods(
    engines: dict[str, LLM],
    prompts: list[str],
    params: SamplingParams,
    sync: Callable[[], None] = lambda: None,
    peer: Callable[[list[int], int], list[int]] | None = None,
) -> dict[str, dict]:
    """Each prompt through every engine in turn (and ``peer``, llama.cpp, last): per method, its seconds,
    tokens, target passes and tokens verified, and ``differ``, the prompts whose output is not that of its
    plain engine (``plain, AWQ INT4`` for an AWQ method, else ``plain``; the peer is not compared)."""
    names = [*engines, *([PEER] if peer else [])]
    totals = {name: {"seconds": 0.0, "tokens": 0, "passes": 0, "verified": 0, "differ": 0} for name in names}
    for prompt in prompts:
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
        if peer is not None:
            prompt_ids = engines["plain"].tokenizer.encode(prompt)
            start = time.perf_counter()
            totals[PEER]["tokens"] += len(peer(prompt_ids, params.max_tokens))
            totals[PEER]["seconds"] += time.perf_counter() - start
        for name, ids in outputs.items():
            totals[name]["differ"] += ids != outputs["plain, AWQ INT4" if "AWQ" in name else "plain"]
    for t in totals.values():
        t["tok_s"] = t["tokens"] / t["seconds"]
        t["tau"] = t["verified"] / t["passes"] if t["passes"] else 1.0
    return totals


def held_back_prompts() -> list[str]:
    return [json.loads(line)["prompt"] for line in (SPEC_DIR / "heldout.jsonl").read_text().splitlines()]


def chat(llm: LLM, text: str) -> str:
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}])


DTYPE_ENGINES = {  # --dtypes: the engine options of each one's plain row (its methods add theirs)
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "awq": {"quantization": "awq"},
}


def dtype_methods(dtype: str, k: int, tree: dict, medusa: bool) -> dict[str, dict]:
    """Plain decoding and the speculative methods ``bench spec`` runs on one dtype's engine."""
    base = DTYPE_ENGINES[dtype]
    methods = {
        f"plain, {dtype}": base,
        f"EAGLE chain k={k}, {dtype}": base | dict(speculative="eagle", num_speculative_tokens=k),
        f"EAGLE tree {tree['speculative_tree_nodes']}, {dtype}": base | dict(speculative="eagle", **tree),
    }
    if dtype == "float32":
        methods[f"n-gram k={k}, {dtype}"] = base | dict(speculative="ngram", num_speculative_tokens=k)
        if medusa:
            methods[f"Medusa chain k={k}, {dtype}"] = base | dict(
                speculative="medusa", num_speculative_tokens=k
            )
            methods[f"Medusa tree {tree['speculative_tree_nodes']}, {dtype}"] = base | dict(
                speculative="medusa", **tree
            )
    return methods


def draft_passes(options: dict) -> int:
    """Draft passes per speculative step: the chain's length, or the tree's depth (0: plain)."""
    return options.get("num_speculative_tokens", 0) if options.get("speculative") else 0


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.split("\n")[0])
    add = parser.add_argument
    add("--max-tokens", type=int, default=128)
    add("--prompts", type=int, default=6, help="held-back prompts to use (of 12)")
    add("--rounds", type=int, default=3, help="alternated rounds over the prompts (median and spread)")
    add("--dtypes", default="float32,awq", help="engines to compare, of float32, bfloat16, awq")
    add("-k", "--num-speculative-tokens", type=int, default=3, help="chain length")
    add("--tree-nodes", type=int, default=8)
    add("--tree-depth", type=int, default=4)
    add("--tree-top-k", type=int, default=4, help="nodes expanded per depth")
    add("--no-medusa", action="store_true", help="leave the Medusa rows out")
    add("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add("--device", default="auto")
    add(
        "--offline",
        action="store_true",
        help="instead: teacher-forced tau of EAGLE and Medusa chains and trees on the held-back "
        "greedy answers",
    )
    add(
        "--draft-vocab",
        default=None,
        help="with --offline: instead, tau and drafting time of the EAGLE head over each draft vocabulary "
        "size (e.g. 1024,2048,4096,8192,full)",
    )
    add(
        "--batch",
        default=None,
        help="instead: plain vs the EAGLE chain with this many requests decoding together (e.g. 1,4,16), "
        "float32: where speculation stops paying (speculative_disable_by_batch_size)",
    )
    add(
        "--choose",
        action="store_true",
        help="instead: pick the EAGLE chain or tree predicted fastest per engine (float32, AWQ) from this "
        "run's plain step, verify-rows ratios and teacher-forced tau and drafting time",
    )
    add("--eagle-head", default=None, help="an EAGLE head file other than the shipped one")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    held_back = held_back_prompts()
    mixed = sorted(range(len(held_back)), key=lambda i: (i % 4, i))[: args.prompts]  # mix the kinds
    if args.offline:
        if args.draft_vocab:
            return offline_vocab(mixed, parse_vocab_sizes(args.draft_vocab), args.eagle_head)
        return offline(mixed, args.eagle_head)
    if args.choose:
        return choose(mixed, args.eagle_head)
    if args.batch:
        return batch_crossover(args, [held_back[i] for i in mixed], [int(b) for b in args.batch.split(",")])
    dtypes = args.dtypes.split(",")
    unknown = set(dtypes) - DTYPE_ENGINES.keys()
    if unknown:
        parser.error(f"--dtypes takes {', '.join(DTYPE_ENGINES)}; got {', '.join(sorted(unknown))}")
    k = args.num_speculative_tokens
    tree = dict(
        num_speculative_tokens=args.tree_depth,
        speculative_tree_nodes=args.tree_nodes,
        speculative_tree_top_k=args.tree_top_k,
    )
    methods: dict[str, dict] = {}
    for dtype in dtypes:
        methods |= dtype_methods(dtype, k, tree, not args.no_medusa)
    if args.eagle_head:
        methods = {
            n: o | {"eagle_head": args.eagle_head} if o.get("speculative") == "eagle" else o
            for n, o in methods.items()
        }
    engines = batch_one_engines(methods, args.device, 64 << 20)
    first = next(iter(engines.values()))
    prompts = [chat(first, held_back[i]) for i in mixed]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(
        f"{machine_name()}: {len(mixed)} held-back prompts x "
        f"{args.max_tokens} tokens, batch 1, greedy, {args.rounds} rounds"
        " (methods alternating prompt by prompt)"
    )
    costs = run_rounds(
        engines, {n: draft_passes(o) for n, o in methods.items()}, prompts, params, args.rounds
    )
    print(SPLIT_HEADER)
    failed = False
    for dtype in dtypes:
        plain_name = f"plain, {dtype}"
        plain = costs[plain_name]
        for name, method in costs.items():
            if not name.endswith(f", {dtype}"):
                continue
            print(split_line(name, plain, method))
            differ = sum(
                a.tokens != b.tokens
                for r in range(args.rounds)
                for a, b in zip(method.rounds[r], plain.rounds[r])
            )
            if differ:
                failed = failed or dtype == "float32" or batch_invariant()
                print(f"  {differ} of {args.rounds * len(prompts)} outputs DIFFER from {plain_name}'s")
                if dtype != "float32" and not batch_invariant():
                    print(f"  ({ROUNDING_NOTE})")
    print(
        "S = tau / (1 + k c + v): c = one draft pass / one plain step (k passes: the chain's length or the "
        "tree's depth), v = the rest of a speculative step / one plain step - 1; 'predicted' is S from the "
        "median c and v (decode steps only; the speed-up column includes prefill)"
    )
    print(
        f"goals: EAGLE >= {GOALS['speedup']}x plain float32, >= {GOALS['speedup_int4']}x plain AWQ INT4; "
        f"tau >= {GOALS['tau_tree']} with trees; outputs identical to plain in every dtype"
    )
    return 1 if failed else 0


def batch_crossover(args, texts: list[str], batches: list[int]) -> int:
    """Aggregate tokens/s of plain decoding and of the EAGLE chain with ``b`` requests decoding together, per
    ``b`` in ``batches``, rounds alternating: the largest ``b`` where speculation still pays is the
    ``speculative_disable_by_batch_size`` to set."""
    k = args.num_speculative_tokens
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(
        f"{machine_name()}: float32, {args.max_tokens} tokens a request, {args.rounds} alternated rounds; "
        f"EAGLE chain k={k} against plain, both with b requests decoding together"
    )
    print(f"{'batch':>5s} | {'plain tok/s':>11s} | {'EAGLE tok/s':>11s} | speed-up [min-max]")
    pays, paying = 0, True
    for batch in sorted(batches):
        options = dict(device=args.device, dtype="float32", max_num_seqs=batch, max_model_len=1024)
        plain = LLM(**options)
        eagle = LLM(**options, speculative="eagle", num_speculative_tokens=k)
        prompts = [chat(plain, texts[i % len(texts)]) for i in range(batch)]
        seconds: dict[str, list[float]] = {"plain": [], "eagle": []}
        for llm in (plain, eagle):  # warm-up
            llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        for _ in range(args.rounds):
            for name, llm in (("plain", plain), ("eagle", eagle)):
                start = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                seconds[name].append(time.perf_counter() - start)
        tokens = batch * args.max_tokens
        ratios = [p / e for p, e in zip(seconds["plain"], seconds["eagle"])]
        mid = statistics.median(ratios)
        paying = paying and min(ratios) > 1  # every round faster, and at every smaller batch too
        pays = batch if paying else pays
        print(
            f"{batch:5d} | {tokens / statistics.median(seconds['plain']):11.1f} | "
            f"{tokens / statistics.median(seconds['eagle']):11.1f} | "
            f"{mid:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
        )
        plain.shutdown()
        eagle.shutdown()
        del plain, eagle, llm
        gc.collect()  # engines hold reference cycles: free this batch's two before the next batch's load
    if pays:
        print(
            f"speculation paid (every round faster) up to batch {pays}: "
            f"speculative_disable_by_batch_size={pays}"
        )
    else:
        print("speculation did not pay in every round at any batch size measured: leave it off here")
    return 0


ROUNDING_NOTE = (
    "bfloat16 roundings: a verify pass computes a token among several rows, plain decoding alone, and a "
    "last-bit difference flips a bfloat16 rounding and then a near-tie; FASTMODE_BATCH_INVARIANT=1 makes "
    "them identical (kernels/batch_invariant.py)"
)
SPLIT_HEADER = (
    f"{'method':28s} | {'tok/s':>6s} | {'speed-up [min-max]':>19s} | {'tau':>4s} | {'c':>5s} | {'v':>5s} | "
    f"{'k':>2s} | predicted"
)


def split_line(name: str, plain: MethodCosts, method: MethodCosts) -> str:
    """One row of the split: tokens/s (median round), speed-up with its spread, tau, c, v, k, predicted S."""
    seconds = statistics.median(method.round_seconds())
    tok_s = method.tokens() / seconds
    if method is plain:
        t1 = statistics.median(plain.step_mean(r) for r in plain.rounds)
        return f"{name:28s} | {tok_s:6.1f} | {'1.00x':>19s} | {1.0:4.2f} | step {t1 * 1e3:.1f} ms"
    split = split_against(plain, method)
    mid, low, high = split.speedup
    return (
        f"{name:28s} | {tok_s:6.1f} | {f'{mid:.2f}x [{low:.2f}-{high:.2f}]':>19s} | {split.tau:4.2f} | "
        f"{split.c[0]:5.3f} | {split.v[0]:5.2f} | {split.k:2d} | {split.predicted:.2f}x"
    )


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


def parse_vocab_sizes(text: str) -> list[int | None]:
    """``1024,4096,full`` -> ``[1024, 4096, None]`` (None: the target's whole vocabulary)."""
    sizes: list[int | None] = []
    for part in text.split(","):
        if part == "full":
            sizes.append(None)
        elif part.isdigit() and int(part) > 0:
            sizes.append(int(part))
        else:
            raise SystemExit(f"--draft-vocab takes sizes > 0 or 'full' separated by commas, got {part!r}")
    return sizes


VOCAB_DRAFTERS = {"EAGLE chain k=3": (3, 1, 0), "EAGLE tree 8 (4 deep, top-4)": (4, 4, 8)}


def offline_vocab(indices: list[int], sizes: list[int | None], head_path: str | None = None) -> int:
    """Teacher-forced τ and drafting time of the EAGLE head's chain and 8-node tree over each draft vocabulary
    size (``EagleHead.use_vocab``): a smaller vocabulary makes each draft pass cheaper (the head's LM-head
    projection is most of it) and loses the drafts whose token falls outside it."""
    lines = (SPEC_DIR / "heldout_responses.jsonl").read_text().splitlines()
    model = LLM(device="cpu", dtype="float32", max_model_len=1024).engine.model
    answers = greedy_answers(model, [json.loads(lines[i]) for i in indices])
    head = load_head(model, head_path or HEAD_PATH)
    ranked = len(head.draft_vocab)
    positions = sum(len(ids) - 1 - start for ids, start, _ in answers)
    print(
        f"{machine_name()}: teacher-forced on {len(answers)} held-back greedy answers, {positions} "
        "positions; "
        f"the head ranks {ranked} tokens by training frequency"
    )
    print(f"{'draft vocabulary':>16s} | {'drafter':28s} | {'tau':>5s} | draft ms/step | tau per draft ms")
    for size in sizes:
        if size is not None and size > ranked:
            print(f"{size:>16d} | (the head ranks only {ranked} tokens: skipped)")
            continue
        head.use_vocab(size)
        for name, (depth, top_k, nodes) in VOCAB_DRAFTERS.items():
            drafter = EagleDrafter(head, depth, tree_depth=depth if nodes else 0, tree_top_k=top_k)
            result = teacher_forced_acceptance(drafter, answers, nodes)
            ms = result.draft_seconds * 1e3
            label = "full" if size is None else str(size)
            print(f"{label:>16s} | {name:28s} | {result.tau:5.2f} | {ms:13.2f} | {(result.tau - 1) / ms:.3f}")
    return 0


def choose(indices: list[int], head_path: str | None = None) -> int:
    """The EAGLE drafter predicted fastest on each engine (``speculative.tree_choice``): tau and drafting time
    teacher-forced (float32 head, ``OFFLINE_DRAFTERS``' EAGLE rows), the plain step and the verify pass's cost
    at each row count measured on that engine (``bench.verify_rows``)."""
    lines = (SPEC_DIR / "heldout_responses.jsonl").read_text().splitlines()
    model = LLM(device="cpu", dtype="float32", max_model_len=1024).engine.model
    answers = greedy_answers(model, [json.loads(lines[i]) for i in indices])
    head = load_head(model, head_path or HEAD_PATH)
    options = []
    for name, (depth, top_k, nodes) in OFFLINE_DRAFTERS.items():
        if name.startswith("EAGLE"):
            drafter = EagleDrafter(head, depth, tree_depth=depth if nodes else 0, tree_top_k=top_k)
            result = teacher_forced_acceptance(drafter, answers, nodes)
            options.append(TreeOption(name, depth, top_k, nodes, result.tau, result.draft_seconds * 1e3))
    row_counts = sorted({1, *(o.rows for o in options)})
    print(f"{machine_name()}: EAGLE drafters teacher-forced on {len(answers)} held-back answers")
    for engine, engine_options in (("float32", {"dtype": "float32"}), ("awq", {"quantization": "awq"})):
        llm = verify_engine(tree=True, device="cpu", **engine_options)
        timings = verify_step_ms(llm, row_counts, steps=8, rounds=3)
        llm.shutdown()
        step_ms = timings[0].median_ms
        ratios = {t.rows: t.median_ms / step_ms for t in timings}
        best, ranked = choose_tree(options, step_ms, interpolate(ratios))
        print(
            f"{engine}: plain step {step_ms:.1f} ms; verify pass / plain step at "
            + ", ".join(f"{r} rows {ratios[r]:.2f}" for r in row_counts)
        )
        print(
            f"  {'drafter':32s} | {'tau':>5s} | {'draft ms':>8s} | {'k c':>5s} | {'1 + v':>5s} | predicted S"
        )
        for option, speedup in ranked:
            print(
                f"  {option.name:32s} | {option.tau:5.2f} | {option.draft_ms:8.2f} | "
                f"{option.draft_ms / step_ms:5.2f} | {ratios[option.rows]:5.2f} | {speedup:.2f}x"
            )
        runner_up = f"; next {ranked[1][0].name} at {ranked[1][1]:.2f}x" if len(ranked) > 1 else ""
        verdict = "pays" if ranked[0][1] > 1 else "loses to plain decoding: leave speculation off here"
        print(f"  chosen: {best.name}, predicted {ranked[0][1]:.2f}x ({verdict}{runner_up})")
    return 0
