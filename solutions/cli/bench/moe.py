"""``python -m solutions bench moe``: a MoE layer's experts, grouped vs per-expert loop vs an equal dense FFN.

Three ways to compute one layer for ``T`` tokens, 8 experts, top-2, SwiGLU experts of width ``I``:

- the engine's path: Triton grouped GEMM on CUDA (``fused_moe_triton``), on CPU the torch path
  (tokens sorted by expert, one matmul per expert slice: ``fused_moe_torch``), router included;
- the per-expert loop of Hugging Face's Mixtral (``moe_per_expert_loop``): per expert, find its tokens
  (a host sync), gather, run, scatter;
- a dense SwiGLU FFN of width ``k * I``: the same active parameters and FLOPs per token, no routing.

Goals: on CUDA, the grouped kernel at least 2x the per-expert loop at 8 experts, top-2, 4k tokens, at
every (H, I) of the GPU table; on CPU, the torch path within 1.5x of the dense FFN's time. CPU timings
are medians of repeats that alternate between the three, so a noisy machine slows them alike; ratios are
what to read. The GPU table (``--gpu-only`` skips the CPU one) takes under a minute on an H200, its
first call per shape autotuning the kernel; ``--smoke`` runs toy sizes everywhere, the kernel table
through the Triton interpreter on a CPU (a check that the script works, not a timing).
"""

from __future__ import annotations

import argparse
import functools

import torch

from ...bench.machine import machine_name
from ...bench.moe import GPU_SHAPES, NUM_EXPERTS, TOP_K, kernel_table, make_layer, runners
from ...bench.timing import alternating_ms
from ...model.moe_router import route
from . import bench_parser


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.splitlines()[0])
    add = parser.add_argument
    add("--hidden", type=int, default=1024)
    add("--width", type=int, default=1024, help="each expert's intermediate width I")
    add("--tokens", type=int, nargs="+", default=[1, 16, 256, 2048, 4096])
    add("--repeats", type=int, default=5)
    add("--threads", type=int, default=torch.get_num_threads())
    add("--gpu-tokens", type=int, default=4096)
    add("--gpu-only", action="store_true", help="skip the CPU table")
    add("--smoke", action="store_true", help="toy sizes, the kernel table too (interpreted)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.hidden, args.width, args.tokens, args.repeats, args.gpu_tokens = 32, 32, [1, 16], 1, 16

    if not args.gpu_only:
        print_cpu_table(args)
    if torch.cuda.is_available() or args.smoke:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        shapes = [(32, 48)] if args.smoke else GPU_SHAPES
        print("\n".join(["", *kernel_table(shapes, args.gpu_tokens, device)]))
    else:
        print("GPU part: needs CUDA (grouped Triton kernel vs per-expert loop, bf16, 4k tokens); none here.")
    return 0


def print_cpu_table(args: argparse.Namespace) -> None:
    """Per token count: median ms of each implementation, their ratios, and the experts' weight bytes the
    batch's routing reads over the dense FFN's; then the goal at the first and last token counts."""
    layer = make_layer(args.hidden, args.width, "cpu", torch.float32)
    fns = runners(layer)
    print(f"CPU: {machine_name('cpu')}, torch {torch.__version__}; "
          f"float32, H={args.hidden}, {NUM_EXPERTS} experts of I={args.width}, top-{TOP_K}; "
          f"dense FFN width {TOP_K * args.width}; median of {args.repeats}, alternating")  # fmt: skip
    header = "".join(f"{name + ' ms':>26}" for name in fns)
    print(f"{'tokens':>7}{header}{'torch / dense':>15}{'loop / torch':>14}{'weight bytes / dense':>22}")
    torch_over_dense = []
    for tokens in args.tokens:
        x = torch.randn(tokens, args.hidden, generator=torch.Generator().manual_seed(tokens))
        with torch.inference_mode():
            ms = alternating_ms({name: functools.partial(fn, x) for name, fn in fns.items()}, args.repeats)
        touched = route(x @ layer["router"].t(), TOP_K).experts.unique().numel()
        grouped, loop, dense = ms.values()
        times = "".join(f"{t:>26.3f}" for t in ms.values())
        print(f"{tokens:>7}{times}{grouped / dense:>14.2f}x{loop / grouped:>13.2f}x{touched / TOP_K:>21.1f}x")
        torch_over_dense.append((tokens, grouped / dense))
    print(
        "goal (CPU): the torch path within 1.5x of the dense FFN of the same active size. Where the batch's\n"
        "routing reads all experts (last column 4x) and the layer is memory-bound, no MoE path can meet\n"
        "it; it applies at batch 1 (the same bytes) and at compute-bound token counts (the same FLOPs)."
    )
    for tokens, ratio in (torch_over_dense[0], torch_over_dense[-1]):
        verdict = "met" if ratio <= 1.5 else "not met"
        print(f"goal at {tokens} tokens: torch path / dense = {ratio:.2f}x (goal <= 1.5x): {verdict}")
