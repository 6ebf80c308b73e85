"""``python -m solutions bench throughput``:
offline throughput of continuous batching, side by side in one run.

One workload (N requests, prompt lengths 16-512 and output lengths 16-256, drawn with a seed; prompts are
windows of real text; EOS ignored so every request produces exactly its length) runs through:

- our engine (continuous batching, chunked prefill, paged KV cache);
- the same engine with ``max_num_seqs=1`` (one request at a time);
- Hugging Face ``generate`` with padded static batches (left-padded; each batch runs until its longest
  request is done, so only the requested tokens count as useful output);
- our engine again, sampling (temperature 0.8, top-p 0.95) instead of greedy: what drawing tokens costs.

Beside them, the machine's compute ceiling measured in the same run: the model's own matrix products at a
large batch, in FLOP/s, turned into the tokens/s a forward pass could reach if it did nothing else.

``--peer vllm`` then alternates ``--rounds`` passes of the workload through our engine and through vLLM
for CPU (its own venv: ``FASTMODE_VLLM_PYTHON``, see ``bench/vllm_peer.py``) fed the identical token ids,
prefix caching off in both, and prints each round's tokens/s and the ratio's median and range. ``--dtype``
picks the weights' type of our engine and the peer (float32 by default; bfloat16).

``--split`` then runs the workload once more with every part of every step timed (``bench/step_split.py``'s
``batched_split``) and prints where the wall time went: by kind of step (prompt chunks only, mixed, decodes
only), and within each kind matrix products, attention, elementwise chains, the sampler and the rest (Python,
scheduling, building the step's inputs).
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from ...bench.decode import load_hf_model
from ...bench.step_split import SPLIT, STEP_KINDS, batched_split
from ...bench.throughput import (
    Throughput,
    Workload,
    compute_ceiling_tokens_per_s,
    make_workload,
    run_engine,
    run_hf_static,
    workload_params,
)
from ...bench.vllm_peer import VllmPeer
from ...llm import LLM
from . import bench_parser


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.splitlines()[0])
    add = parser.add_argument
    add("--num-requests", type=int, default=24)
    add("--max-num-seqs", type=int, default=24)
    add("--hf-batch", type=int, default=8, help="Hugging Face static batch size")
    add("--seed", type=int, default=0)
    add("--max-tokens", type=int, default=None, help="cap every request's output at this many tokens")
    add("--no-hf", action="store_true", help="skip the Hugging Face baseline")
    add("--split", action="store_true", help="then time every part of every step, by kind of step")
    add("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights' type (default float32)")
    add("--peer", choices=["vllm"], default=None, help="alternate rounds against vLLM for CPU (its own venv)")
    add("--rounds", type=int, default=3, help="alternated rounds against the peer (default 3)")
    add("--peer-only", action="store_true", help="with --peer: only our engine against the peer")
    add(
        "--workload", default="text", choices=["text", "nano"],
        help="text: windows of real text, prompts 16-512, outputs 16-256 (default); nano: nano-vllm's shape "
        "scaled down (random ids, prompts 100-768, outputs 32-128; give --num-requests 128)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.peer_only and not args.peer:
        parser.error("--peer-only needs --peer vllm")
    engine_args = dict(device="cpu", dtype=args.dtype, max_model_len=1024)

    llm = LLM(max_num_seqs=args.max_num_seqs, **engine_args)
    if args.workload == "nano":  # nano-vllm's benchmark, scaled to minutes on 2 cores: random ids below 10k
        workload = make_workload(None, args.num_requests, (100, 768), (32, 128), seed=args.seed)
    else:
        workload = make_workload(llm.tokenizer, args.num_requests, seed=args.seed)
    if args.max_tokens is not None:
        if args.max_tokens < 1:
            parser.error(f"--max-tokens must be at least 1, got {args.max_tokens}")
        workload = Workload(workload.prompts, [min(n, args.max_tokens) for n in workload.output_lens])
    print(f"workload: {args.workload}, {args.num_requests} requests, {workload.num_prompt_tokens} prompt "
          f"tokens, {workload.num_output_tokens} output tokens (seed {args.seed})")  # fmt: skip
    ours = None if args.peer_only else compare_rows(llm, workload, args, engine_args)
    gc.collect()  # the table's other engines (reference cycles) go before the next one is built
    if args.peer:
        compare_with_vllm(workload, args, engine_args)
    if args.split:
        timed = LLM(max_num_seqs=args.max_num_seqs, **engine_args)
        print_split(batched_split(timed, workload.prompts, workload_params(workload)), ours)
    return 0


def compare_rows(llm: LLM, workload, args, engine_args: dict) -> Throughput:
    """The table: our engine, one request at a time, HF static batches, sampled; the compute ceiling and the
    goals. Returns our engine's row."""
    results = [run_engine(llm, workload)]
    one = LLM(max_num_seqs=1, **engine_args)
    results.append(run_engine(one, workload, "same engine, max_num_seqs=1"))
    if not args.no_hf:
        hf = load_hf_model()
        results.append(run_hf_static(hf, workload, args.hf_batch, pad_id=llm.tokenizer.eos_token_id or 0))
    # The price of sampling: the same batch drawing every token from its top-p set instead of taking the
    # argmax. A fresh engine: the first one's prefix cache holds every prompt by now.
    fresh = LLM(max_num_seqs=args.max_num_seqs, **engine_args)
    results.append(
        run_engine(fresh, workload, "same engine, sampled T 0.8 top-p 0.95", temperature=0.8, top_p=0.95)
    )
    flops, ceiling = compute_ceiling_tokens_per_s(llm.engine.model)
    ours = results[0]
    print(
        f"machine: {torch.get_num_threads()} CPU threads, torch {torch.__version__}, {args.dtype} weights\n"
        f"compute ceiling: the model's matmuls at batch 512 run at {flops / 1e9:.1f} GFLOP/s = {ceiling:.0f} "
        f"tokens/s\n{'':<40}{'wall s':>8}{'out tok/s':>11}{'total tok/s':>13}{'ours is':>9}"
    )
    for r in results:
        figures = f"{r.wall_s:>8.1f}{r.output_tokens_per_s:>11.1f}{r.total_tokens_per_s:>13.1f}"
        print(f"{r.name:<40}{figures}{ours.output_tokens_per_s / r.output_tokens_per_s:>8.1f}x")
    speedup = lambda i: ours.output_tokens_per_s / results[i].output_tokens_per_s
    print(f"goals:\n  >= 8x one-at-a-time:       {speedup(1):.1f}x")
    if not args.no_hf:
        print(f"  >= 4x HF static batching:  {speedup(2):.1f}x")
    share = ours.total_tokens_per_s / ceiling
    print(f"  >= 50% of compute ceiling: {share:.0%} (total tokens/s over the ceiling)")
    return ours


def compare_with_vllm(workload, args, engine_args: dict) -> None:
    """``args.rounds`` alternated passes of ``workload``, ours then vLLM's, both without prefix caching:
    each round's output tokens/s, the ratio's median and range, and how many requests began alike."""
    peer = VllmPeer.start(workload, args.dtype, args.max_num_seqs, torch.get_num_threads())
    ours_llm = LLM(max_num_seqs=args.max_num_seqs, enable_prefix_caching=False, **engine_args)
    params = workload_params(workload)
    rows = []
    try:
        for _ in range(args.rounds):
            start = time.perf_counter()
            outputs = ours_llm.generate(workload.prompts, params, use_tqdm=False)
            ours_tok_s = workload.num_output_tokens / (time.perf_counter() - start)
            theirs, their_first = peer.run()
            rows.append((ours_tok_s, theirs.output_tokens_per_s))
    finally:
        peer.stop()
    same = sum(list(o.outputs[0].token_ids[:8]) == t for o, t in zip(outputs, their_first))
    ratios = sorted(o / t for o, t in rows)
    print(f"\nagainst {peer.name}: {args.rounds} alternated rounds, prefix caching off in both, output tok/s")
    for i, (o, t) in enumerate(rows):
        print(f"  round {i + 1}: ours {o:7.1f}   vLLM {t:7.1f}   ours/vLLM {o / t:.2f}x")
    print(
        f"  ours/vLLM: median {statistics.median(ratios):.2f}x, range {ratios[0]:.2f}-{ratios[-1]:.2f}x "
        f"(goal >= 1.2x); first 8 greedy tokens equal on {same} of {len(outputs)} requests"
    )


def print_split(split: dict, untimed: Throughput | None) -> None:
    """Seconds by kind of step and by part, each part's share of its kind, beside the untimed run's wall
    (when the table ran)."""
    total = sum(k.total_s for k in split.values())
    beside = "" if untimed is None else f", untimed {untimed.wall_s:.1f} s"
    parts = [p for p in SPLIT if any(k.seconds.get(p) for k in split.values())]
    print(
        f"\nwhere the wall time goes (every step timed: {total:.1f} s{beside})\n"
        f"{'kind of step':<14}{'steps':>6}{'tokens':>8}{'s':>7}{'ms/step':>9}"
        + "".join(f"{p:>17}" for p in parts)
    )
    for kind in STEP_KINDS:
        k = split[kind]
        if not k.steps:
            continue
        shares = "".join(f"{k.seconds[p]:>10.2f} s {k.seconds[p] / k.total_s:>4.0%}" for p in parts)
        step_ms = 1e3 * k.total_s / k.steps
        print(f"{kind:<14}{k.steps:>6}{k.tokens:>8}{k.total_s:>7.1f}{step_ms:>9.1f}{shares}")
