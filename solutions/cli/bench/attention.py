"""``python -m solutions bench attention``: prefill attention speed, ours vs torch's kernels, in one run.

On CUDA: ``triton.testing.do_bench`` medians of our FlashAttention-2 kernel (autotuned per shape; the
winning tiles are printed), torch SDPA's flash backend and naive attention (scores materialised), B=4, H=16,
D 64 and 128, N 1k-16k, causal and not, bf16 (``--dtypes`` adds fp16); TFLOP/s = 4 * B * H * N^2 * D, halved
when causal, and our kernel's ratio to SDPA beside its goal (at least 0.9x). Naive attention is skipped where
its N x N scores would not fit. On CPU: the torch path (``gqa_attention``) against naive attention at
SmolLM2's shape, plus our kernel through the Triton interpreter on one tiny shape. ``--smoke`` runs the GPU
table's code on tiny shapes on any device (a check of the code, no figures). Ratios are measured side by
side; the table is printed last, with the machine's name.
"""

from __future__ import annotations

import argparse

import torch

from ...bench.attention import GOAL, bench_kernels, cpu_median_ms, naive_attention
from ...bench.machine import machine_name
from ...kernels.attention import gqa_attention
from ...kernels.flash_attention import flash_attention, flops
from . import bench_parser


def bench_cpu(args: argparse.Namespace) -> list[str]:
    """The CPU table: the torch path and naive attention at SmolLM2's shape, the kernel in the interpreter."""
    torch.manual_seed(0)
    rows = ["path                      shape (B,Hq,Hkv,N,D)   causal   median ms   GFLOP/s   vs naive"]
    for n in (256, 1024):
        q = torch.randn(1, 9, n, 64)
        k, v = torch.randn(2, 1, 3, n, 64).unbind(0)
        work = flops(1, 9, n, n, 64, True)
        naive = cpu_median_ms(
            args.repeats, naive_attention, q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), True
        )
        ours = cpu_median_ms(args.repeats, gqa_attention, q, k, v, causal=True)
        for label, ms in (("naive (repeat K/V)", naive), ("torch path (gqa_attention)", ours)):
            rows.append(
                f"{label:26s} (1,9,3,{n},64){'':5s} True {ms:11.2f} {work / ms / 1e6:9.2f} {naive / ms:9.2f}"
            )
    q = torch.randn(1, 3, 32, 64)
    k, v = torch.randn(2, 1, 1, 32, 64).unbind(0)
    interp = cpu_median_ms(3, flash_attention, q, k, v, causal=True)
    rows.append(
        f"{'triton interpreter':26s} (1,3,1,32,64){'':6s} True {interp:11.2f} "
        f"{flops(1, 3, 32, 32, 64, True) / interp / 1e6:9.4f}       -"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__)
    add = parser.add_argument
    add("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    add("--dtypes", nargs="+", default=["bfloat16"], choices=["float16", "bfloat16"])
    add("--repeats", type=int, default=5, help="CPU repeats per measurement")
    add("--smoke", action="store_true", help="the GPU table's code on tiny shapes, any device")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if args.smoke:
        # SDPA's flash backend takes half types on a GPU; the interpreter runs float32.
        rows = bench_kernels([torch.bfloat16 if on_gpu else torch.float32], [32], [24], batch=1, heads=2)
    elif on_gpu:
        rows = bench_kernels(
            [getattr(torch, d) for d in args.dtypes], [64, 128], args.lengths, batch=4, heads=16
        )
    else:
        rows = bench_cpu(args)
    if args.smoke:
        print("\nSmoke run on tiny shapes: it checks this code; its figures mean nothing.")
    print(f"\nAttention forward on {machine_name()} (goal: ours >= {GOAL}x SDPA):")
    print("\n".join(rows))
    return 0
