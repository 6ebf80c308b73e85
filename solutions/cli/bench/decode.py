"""``python -m solutions bench decode``: batch-1 greedy decode speed, ours vs Hugging Face ``generate``
on the same weights, beside the roofline, measured side by side in one run.

Decode speed is (time for N tokens - time for 1 token) / (N - 1) for both engines, so prefill and
start-up costs cancel and both are measured the same way. Repeats alternate between the engines
(this machine is noisy) and the median is reported. The step is then taken apart (``step_split``: timers
around the matrix products, attention, the elementwise chains and the sampler; the rest is Python and other
work) and set against its goals.

``--fused-ops ENGINE`` sets the CPU ``LayerOps`` candidates side by side, rounds alternating: per chain and
regime (1, 8, 128 rows) the plain chain against the fused one compiled ahead of time, as
``model/cpu_layer_ops.py`` measured them to choose; per chain at one row, the same chain through
``torch.compile`` (the guard evaluation every call pays, why the engine compiles ahead of time instead); and
whole decode steps with ``PLAIN_OPS`` and with the fused set, their greedy tokens compared.

``--attention`` times the CPU paged attention of one decode query against the bytes it reads: one step's
attention over every layer of a model-sized cache (each layer's K/V in its own memory, so nothing stays in a
CPU cache from the previous layer), as the engine runs it (``TorchPagedStep`` built once, one ``attend`` per
layer). A read in place should approach the machine's read bandwidth; a gather pays a copy of the same bytes
first.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import torch

from ...bench import step_split
from ...bench.decode import (
    LLAMA_CPP_MISSING,
    PROMPT,
    decode_speeds,
    hf_generate,
    llama_cpp_runner,
    load_hf_model,
    modules_run,
    prefill_seconds,
)
from ...bench.machine import machine_name
from ...bench.roofline import decode_bytes_per_token, measure_read_bandwidth
from ...bench.step_split import attention_flops, gemm_flops, linear_flops, linear_seconds
from ...bench.timing import alternating_ms
from ...bench.verify_rows import verify_engine, verify_step_ms
from ...engine.outputs import RequestOutput
from ...kernels import paged_torch
from ...kernels.blocks import cdiv
from ...kernels.cpu_linear import PATHS, fastest_rounds, summary
from ...llm import LLM
from ...model.cpu_layer_ops import CHAINS, cpu_layer_ops, model_sizes
from ...model.llama import PLAIN_OPS, LayerOps, LlamaModel
from ...paths import DATA_DIR
from ...sampling_params import SamplingParams
from . import bench_parser

LENGTHS = (128, 512, 2048)  # --attention's contexts
LAYERS, BLOCK_SIZE, KV_HEADS, Q_HEADS, HEAD_DIM = 30, 16, 3, 9, 64  # SmolLM2-135M's attention


def print_linear_paths(model: LlamaModel) -> None:
    """Which path won per weight shape and regime, and the GB/s (GFLOP/s for prefill) each path reached."""
    decisions = getattr(model, "linear_decisions", None)
    if not decisions:
        forced = {m.choices["decode"] for m in model.modules() if hasattr(m, "choices")}
        print(f"linear paths: {', '.join(sorted(forced)) or 'none'} (forced, not measured)")
        return
    print("linear path per weight shape (measured at load, cached per machine):")
    print(f"{'dtype:shape':<18}{'regime':<9}{'winner':<12}each path")
    for line in summary(decisions):
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.splitlines()[0])
    add = parser.add_argument
    add("--tokens", type=int, default=128, help="tokens generated per measurement")
    add("--repeats", type=int, default=3)
    add("--dtype", default="float32", choices=["float32", "bfloat16"])
    add("--prefill-tokens", type=int, default=1000, help="prompt length of the prefill measurement")
    add("--no-hf", action="store_true", help="skip the Hugging Face comparison")
    add("--no-bf16", action="store_true", help="skip the bfloat16-weights row")
    add(
        "--fused-ops",
        choices=["float32", "bfloat16", "awq"],
        help="only compare the CPU layer ops (plain, fused, torch.compile) on this engine",
    )
    add("--attention", action="store_true", help="only time batch-1 attention vs its bytes")
    add(
        "--rows",
        type=_row_counts,
        default=None,
        help="only time a step verifying ROWS tokens (e.g. 1,2,4,8,16) against one row, per dtype",
    )
    add("--tree", action="store_true", help="with --rows: verify the rows as a draft tree (tree mask)")
    args = parser.parse_args(argv)
    if args.attention:
        return _attention_only(args)
    if args.rows:
        return _rows_only(args)
    if args.fused_ops:
        return _fused_ops_only(args)

    dtype = getattr(torch, args.dtype)
    max_len = max(args.tokens, args.prefill_tokens) + 64
    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    # No prefix caching: the prefill measurement repeats one prompt,
    # which would otherwise be served from the cache.
    llm = LLM(
        device="cpu", dtype=args.dtype, max_num_seqs=1, max_model_len=max_len, enable_prefix_caching=False
    )
    runs = {f"fast-mode engine {args.dtype}": lambda n: llm.generate(PROMPT, greedy(n))}
    if llm.engine.model.fused_decode is not None:  # the same engine, its layers run as modules
        runs[f"fast-mode {args.dtype}, modules"] = modules_run(llm, PROMPT, greedy)
    bf16 = None
    if args.dtype == "float32" and not args.no_bf16 and PATHS["onednn"].supports(torch.bfloat16):
        bf16 = LLM(device="cpu", dtype="bfloat16", max_num_seqs=1, max_model_len=max_len)
        runs["fast-mode engine bfloat16"] = lambda n: bf16.generate(PROMPT, greedy(n))
    if not args.no_hf:
        hf_model = load_hf_model(dtype=dtype)
        ids = torch.tensor([llm.tokenizer.encode(PROMPT)])
        runs["HF transformers generate"] = lambda n: hf_generate(hf_model, ids, n, pad_token_id=2)
    peer = llama_cpp_runner(torch.get_num_threads())
    if peer is not None:
        runs["llama.cpp Q4_1 (peer)"] = peer
    speeds = decode_speeds(runs, args.tokens, args.repeats)

    model = llm.engine.model
    bandwidth = measure_read_bandwidth()
    weight_bytes = decode_bytes_per_token(model)
    roofline = bandwidth / weight_bytes
    step_linears_s = linear_seconds(model, rows=1)
    split = step_split.measure_step_split(llm, PROMPT, min(args.tokens, 64), args.repeats)
    text = DATA_DIR / "text" / "kjv_luke_1-12.txt"
    prompt_ids = llm.tokenizer.encode(text.read_text())[: args.prefill_tokens]
    prefill_s = prefill_seconds(llm, prompt_ids, max(1, args.repeats - 1))
    gemm = gemm_flops(model, rows=len(prompt_ids))
    prefill_linear_flops = linear_flops(model, len(prompt_ids))
    prefill_attention_flops = attention_flops(llm.engine.model_config, len(prompt_ids))

    print(f"machine: {machine_name('cpu')}, torch {torch.__version__}")
    print_linear_paths(model)
    print_layer_ops(model)
    print(
        f"read bandwidth (sum of a 1 GiB buffer): {bandwidth / 1e9:.1f} GB/s\n"
        f"weight bytes read per decode token ({args.dtype}): {weight_bytes / 1e6:.1f} MB -> roofline "
        f"{roofline:.1f} tokens/s\n"
        f"batch-1 greedy decode, {args.tokens} tokens, median of {args.repeats}, engines alternating:\n"
        f"{'engine':<30}{'tokens/s':>10}{'ms/token':>10}{'of roofline':>13}{'vs HF':>8}"
    )
    hf_speed = speeds.get("HF transformers generate")
    for name, speed in speeds.items():
        vs_hf = f"{speed / hf_speed:.2f}x" if hf_speed else "-"
        own_roofline = roofline
        if name.endswith("bfloat16") and bf16 is not None:
            own_roofline = bandwidth / decode_bytes_per_token(bf16.engine.model)
        share = f"{speed / own_roofline:>12.0%}" if "llama.cpp" not in name else f"{'-':>12}"
        print(f"{name:<30}{speed:>10.1f}{1e3 / speed:>10.1f}{share} {vs_hf:>7}")
    if peer is None:
        print(LLAMA_CPP_MISSING)
    step_s = 1 / speeds[f"fast-mode engine {args.dtype}"]
    layers = type(model.fused_decode).__name__ if model.fused_decode is not None else "modules"
    print(f"where a decode step goes ({args.dtype}, layers: {layers}; {split.steps} steps timed by part):")
    print("\n".join(step_split.split_lines(split, step_linears_s * 1e3, step_s * 1e3)))
    print(
        f"the linears alone read {weight_bytes / step_linears_s / 1e9:.1f} GB/s; a roofline step is "
        f"{1e3 / roofline:.1f} ms"
    )
    achieved = (prefill_linear_flops + prefill_attention_flops) / prefill_s
    print(
        f"prefill of {len(prompt_ids)} tokens: {prefill_s:.2f} s = {len(prompt_ids) / prefill_s:.0f} "
        f"tokens/s, {achieved / 1e9:.0f} GFLOP/s (linears {prefill_linear_flops / 1e9:.0f} + attention "
        f"{prefill_attention_flops / 1e9:.0f} GFLOP) vs the linears alone at {len(prompt_ids)} rows: "
        f"{gemm / 1e9:.0f} GFLOP/s -> {achieved / gemm:.0%} of measured GEMM FLOP/s"
    )
    ours = speeds[f"fast-mode engine {args.dtype}"]
    goals = [f"step {step_s / step_linears_s:.2f}x its matrix products alone (goal <= 1.25x)"]
    goals.append(f"decode {ours / roofline:.0%} of roofline (goal >= 60%)")
    if hf_speed:
        goals.append(f"{ours / hf_speed:.2f}x HF (goal >= 1.5x)")
    goals.append(f"prefill {achieved / gemm:.0%} of GEMM FLOP/s (goal >= 60%)")
    print("goals: " + "; ".join(goals))
    return 0


def print_layer_ops(model: LlamaModel) -> None:
    """Which layer ops the model runs, and for a measured CPU choice each chain's winner and timings."""
    decisions = getattr(model, "layer_ops_decisions", None)
    print(f"layer ops: {model.ops.name}" + (" (measured at load, cached per machine):" if decisions else ""))
    if decisions:
        print("\n".join(decision_lines(decisions)))


def _row_counts(text: str) -> list[int]:
    try:
        counts = [int(v) for v in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--rows takes row counts >= 1 separated by commas, got {text!r}")
    return counts if counts[0] == 1 else [1, *counts]


ROW_ENGINES = {
    "float32": {"dtype": "float32"},
    "bfloat16": {"dtype": "bfloat16"},
    "awq int4": {"quantization": "awq"},
}
ROWS_GOAL = 1.15  # 8 rows at most this many times one row's step


def _rows_only(args: argparse.Namespace) -> int:
    """A step verifying each row count's tokens (``bench/verify_rows.py``), per dtype, against one row."""
    print(f"machine: {machine_name('cpu')}, torch {torch.__version__}")
    shape = "tree (chain-shaped, tree mask)" if args.tree else "chain"
    print(
        f"one request verifying ROWS - 1 drafts as a {shape} after a 256-token context: ms per step, median "
        f"of {max(args.repeats, 3)} alternated rounds [min-max], and its ratio to one row"
    )
    print(f"{'engine':<10}" + "".join(f"{f'{r} rows':>26}" for r in args.rows))
    ratios = {}
    for name, options in ROW_ENGINES.items():
        llm = verify_engine(tree=args.tree, device="cpu", **options)
        timings = verify_step_ms(llm, args.rows, rounds=max(args.repeats, 3))
        one = timings[0].median_ms
        cells = [
            f"{t.median_ms:6.1f} [{t.low_ms:.0f}-{t.high_ms:.0f}] {t.median_ms / one:4.2f}x" for t in timings
        ]
        print(f"{name:<10}" + "".join(f"{c:>26}" for c in cells))
        ratios[name] = {t.rows: t.median_ms / one for t in timings}
        llm.shutdown()
    if 8 in args.rows:
        verdicts = [
            f"{name} {r[8]:.2f}x ({'met' if r[8] <= ROWS_GOAL else 'not met'})" for name, r in ratios.items()
        ]
        print(f"goal: 8 rows <= {ROWS_GOAL}x one row: " + "; ".join(verdicts))
    return 0


def _attention_only(args: argparse.Namespace) -> int:
    print(f"machine: {machine_name('cpu')}, torch {torch.__version__}")
    print("batch-1 decode attention over 30 layers of SmolLM2-135M's float32 cache (min of rounds):")
    print("\n".join(attention_table(max(args.repeats, 5))))
    return 0


def _fused_ops_only(args: argparse.Namespace) -> int:
    engine = {"quantization": "awq"} if args.fused_ops == "awq" else {"dtype": args.fused_ops}
    llm = LLM(device="cpu", max_num_seqs=1, max_model_len=args.tokens + 64, **engine)
    model = llm.engine.model
    fused = cpu_layer_ops(model)
    print(f"machine: {machine_name('cpu')}, torch {torch.__version__}, engine {args.fused_ops}")
    print(f"CPU layer ops chosen for this model: {fused.name} (per chain and regime, alternating rounds):")
    print("\n".join(decision_lines(model.layer_ops_decisions)))
    if fused.name == "plain":
        return 0
    print("one row, the alternative: torch.compile of each chain (dynamo's guards run on every call):")
    print("\n".join(torch_compile_lines(model, fused)))
    print(f"batch-1 greedy decode, {args.tokens} tokens, median of {args.repeats}, layer ops alternating:")
    print("\n".join(step_ab_lines(llm, fused, PROMPT, args.tokens, args.repeats)))
    return 0


def layouts(num_blocks: int) -> dict[str, tuple[list[int], bool]]:
    """Block tables of ``num_blocks`` blocks for each layout, and whether to let the step read it in place:
    ascending (one view of the cache), descending (one view, the last block's stale rows masked: the order a
    freed sequence's blocks come back in), in two runs (gathered), and ascending but gathered (the path every
    table but an ascending one took before), for the cost of the gather itself."""
    ascending = list(range(1, num_blocks + 1))
    half = num_blocks // 2
    return {
        "ascending": (ascending, True),
        "descending": (ascending[::-1], True),
        "two runs (gathered)": (ascending[:half] + [b + 1 for b in ascending[half:]], True),
        "ascending, gathered": (ascending, False),
    }


def attention_table(repeats: int = 5) -> list[str]:
    """Lines of a table: per context length and layout, microseconds per layer and GB/s of K/V read."""
    lines = [f"{'context':>8}  {'layout':<22}{'us/layer':>10}{'GB/s':>8}"]
    context_run = paged_torch.context_run
    try:
        for length in LENGTHS:
            num_blocks = cdiv(length, BLOCK_SIZE)
            k_cache, v_cache = torch.randn(2, LAYERS, num_blocks + 2, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
            q = torch.randn(1, Q_HEADS, HEAD_DIM)
            steps = {
                name: functools.partial(_step, q, k_cache, v_cache, blocks, length, context_run, in_place)
                for name, (blocks, in_place) in layouts(num_blocks).items()
            }
            best_ms = alternating_ms(steps, repeats, min)  # rounds alternate between the layouts
            kv_bytes = 2 * length * KV_HEADS * HEAD_DIM * k_cache.element_size()
            for name, ms in best_ms.items():
                per_layer = ms / 1e3 / LAYERS
                rate = kv_bytes / per_layer / 1e9
                lines.append(f"{length:>8}  {name:<22}{per_layer * 1e6:>10.1f}{rate:>8.1f}")
    finally:
        paged_torch.context_run = context_run
    return lines


@torch.inference_mode()
def _step(q, k_cache, v_cache, blocks: list[int], length: int, context_run, in_place: bool) -> None:
    """One step's attention over every layer; ``in_place=False`` takes the step's in-place read away."""
    paged_torch.context_run = context_run if in_place else lambda *args: None
    table = torch.tensor([blocks], dtype=torch.int32)
    starts, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([length], dtype=torch.int32)
    step = paged_torch.TorchPagedStep(table, starts, lens, BLOCK_SIZE, length, k_cache.dtype)
    for layer in range(LAYERS):
        step.attend(q, k_cache[layer], v_cache[layer])


def decision_lines(decisions: dict[str, dict]) -> list[str]:
    """One line per chain and regime: the winner and each candidate's microseconds per call."""
    lines = [f"{'dtype:chain:shape':<28}{'regime':<9}{'winner':<10}microseconds per call"]
    for key, entry in decisions.items():
        for regime, pick in entry.items():
            figures = "  ".join(f"{name} {us:7.2f}" for name, us in sorted(pick["us"].items()))
            lines.append(f"{key:<28}{regime:<9}{pick['path']:<10}{figures}")
    return lines


def torch_compile_lines(model: LlamaModel, fused_ops: LayerOps) -> list[str]:
    """Per chain at one row: plain, the engine's fused chain, and ``torch.compile`` of the plain function."""
    dtype, sizes = model.norm.weight.dtype, model_sizes(model)
    lines = [f"{'chain (1 row)':<16}{'plain us':>10}{'engine us':>11}{'torch.compile us':>18}"]
    for name, chain in CHAINS.items():
        args = chain.inputs(1, sizes, dtype, torch.Generator().manual_seed(0))
        if name == "add_rms_norm":
            args = (*args[:3], 1e-5)
        compiled = torch.compile(chain.plain, dynamic=True)
        with torch.inference_mode():
            compiled(*args)  # compiles
            candidates = {"plain": chain.plain, "engine": getattr(fused_ops, name), "compile": compiled}
            best = fastest_rounds({n: [functools.partial(fn, *args)] * 32 for n, fn in candidates.items()}, 7)
        us = {n: t * 1e6 for n, t in best.items()}
        lines.append(f"{name:<16}{us['plain']:>10.2f}{us['engine']:>11.2f}{us['compile']:>18.2f}")
    return lines


def step_ab_lines(llm: LLM, fused_ops: LayerOps, prompt: str, tokens: int, repeats: int) -> list[str]:
    """Decode ms/token of ``llm`` with ``PLAIN_OPS`` and with ``fused_ops``, alternating; and whether the
    greedy tokens agree."""
    model = llm.engine.model
    before = model.ops
    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

    def run_with(ops: LayerOps) -> Callable[[int], list[RequestOutput]]:
        def run(n: int) -> list[RequestOutput]:
            model.use_ops(ops)
            return llm.generate(prompt, greedy(n))

        return run

    runs = {"plain ops": run_with(PLAIN_OPS), f"{fused_ops.name} ops": run_with(fused_ops)}
    try:
        tokens_of = {name: run(tokens)[0].outputs[0].token_ids for name, run in runs.items()}
        speeds = decode_speeds(runs, tokens, repeats)
    finally:
        model.use_ops(before)
    plain_ms = 1e3 / speeds["plain ops"]
    lines = [f"{'layer ops':<20}{'ms/token':>10}{'vs plain':>10}"]
    for name, speed in speeds.items():
        lines.append(f"{name:<20}{1e3 / speed:>10.2f}{plain_ms * speed / 1e3:>9.2f}x")
    same = len(set(map(tuple, tokens_of.values()))) == 1
    lines.append(f"greedy tokens ({tokens}): {'identical' if same else 'DIFFER'}")
    return lines
