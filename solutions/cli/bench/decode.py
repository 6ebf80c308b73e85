"""``python -m solutions bench decode``: batch-1 greedy decode speed, ours vs Hugging Face ``generate``
on the same weights, beside the roofline, measured side by side in one run.

Decode speed is (time for N tokens - time for 1 token) / (N - 1) for both engines, so prefill and
start-up costs cancel and both are measured the same way. Repeats alternate between the engines
(this machine is noisy) and the median is reported. The step is then taken apart (``step_split``: timers
around the matrix products, attention, the elementwise chains and the sampler; the rest is Python and other
work) and set against its goals. ``--fused-ops`` compares the CPU layer ops (plain, fused ahead of time,
``torch.compile``); ``--attention`` times one decode query's paged attention against the bytes it reads.
"""

from __future__ import annotations

import argparse

import torch

from ...bench import step_split
from ...bench.cpu_attention import attention_table
from ...bench.decode import (
    LLAMA_CPP_MISSING,
    PROMPT,
    decode_speeds,
    llama_cpp_runner,
    modules_run,
    prefill_seconds,
)
from ...bench.hf_peer import hf_generate, load_hf_model
from ...bench.layer_ops import decision_lines, step_ab_lines, torch_compile_lines
from ...bench.machine import machine_name
from ...bench.roofline import decode_bytes_per_token, measure_read_bandwidth
from ...bench.step_split import attention_flops, gemm_flops, linear_flops, linear_seconds
from ...kernels.cpu_linear import PATHS, summary
from ...llm import LLM
from ...model.cpu_layer_ops import cpu_layer_ops
from ...model.llama import LlamaModel
from ...paths import DATA_DIR
from ...sampling_params import SamplingParams
from . import bench_parser


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
    args = parser.parse_args(argv)
    if args.attention:
        return _attention_only(args)
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
    print(f"read bandwidth (sum of a 1 GiB buffer): {bandwidth / 1e9:.1f} GB/s")
    print(
        f"weight bytes read per decode token ({args.dtype}): "
        f"{weight_bytes / 1e6:.1f} MB -> roofline {roofline:.1f} tokens/s"
    )
    print(f"batch-1 greedy decode, {args.tokens} tokens, median of {args.repeats}, engines alternating:")
    print(f"{'engine':<30}{'tokens/s':>10}{'ms/token':>10}{'of roofline':>13}{'vs HF':>8}")
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
