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
import statistics
import time

import torch

from ..kernels.attention import gqa_attention

GOAL = 0.9  # our kernel's TFLOP/s over SDPA's, at least


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The textbook form: the full N x N score matrix goes through memory (K/V already repeated to Hq)."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        n, m = scores.shape[-2:]
        scores = scores.masked_fill(
            torch.ones(n, m, dtype=torch.bool, device=q.device).triu(m - n + 1), float("-inf")
        )
    return torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v


def sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def cpu_median_ms(repeats: int, fn, *args, **kwargs) -> float:
    fn(*args, **kwargs)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def tflops(work: float, fn, *args, **kwargs) -> float:
    """TFLOP/s of ``fn(*args)``: a ``do_bench`` median on CUDA, a wall-clock median elsewhere."""
    if args[0].device.type != "cuda":
        return work / (cpu_median_ms(3, fn, *args, **kwargs) * 1e-3) / 1e12
    import triton.testing

    return work / (triton.testing.do_bench(lambda: fn(*args, **kwargs), warmup=25, rep=100) * 1e-3) / 1e12


def _tiles(config) -> str:
    if config is None:
        return "-"
    return f"{config.kwargs['BLOCK_M']}x{config.kwargs['BLOCK_N']} w{config.num_warps} s{config.num_stages}"


def bench_kernels(
    dtypes: list[torch.dtype], head_dims: list[int], lengths: list[int], batch: int, heads: int
):
    """The GPU table (any device with ``--smoke``): ours vs SDPA flash vs naive, the tuned tiles, the goal."""
    from ..kernels.flash_attention import _flash_fwd_tuned, flash_attention, flops

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = ["dtype     D  causal      N   ours TF/s   sdpa TF/s  naive TF/s  ours/sdpa  goal  tuned tiles"]
    for dtype in dtypes:
        for head_dim in head_dims:
            for causal in (False, True):
                for n in lengths:
                    q, k, v = (
                        torch.randn(batch, heads, n, head_dim, device=device, dtype=dtype) for _ in range(3)
                    )
                    work = flops(batch, heads, n, n, head_dim, causal)
                    ours = tflops(work, flash_attention, q, k, v, causal=causal)
                    tiles = _tiles(_flash_fwd_tuned.last_config if device == "cuda" else None)
                    sdpa = tflops(work, sdpa_flash, q, k, v, causal)
                    # Naive needs B*H*N^2 fp32 scores: skip it past 4k, where they reach gigabytes.
                    naive = tflops(work, naive_attention, q, k, v, causal) if n <= 4096 else float("nan")
                    name = str(dtype).removeprefix("torch.")
                    ratio = ours / sdpa
                    rows.append(
                        f"{name:8s} {head_dim:3d} {causal!s:6s} {n:6d} {ours:11.1f} {sdpa:11.1f} "
                        f"{naive:11.1f} {ratio:10.2f}  {'met' if ratio >= GOAL else 'MISS':4s}  {tiles}"
                    )
                    print(rows[-1], flush=True)
    return rows


def bench_cpu(args) -> list[str]:
    from ..kernels.flash_attention import flash_attention, flops

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
    parser = argparse.ArgumentParser(prog="python -m solutions bench attention", description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16"], choices=["float16", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5, help="CPU repeats per measurement")
    parser.add_argument(
        "--smoke", action="store_true", help="the GPU table's code on tiny shapes, any device"
    )
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
    if on_gpu:
        machine = torch.cuda.get_device_name()
    else:
        import platform

        machine = f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    if args.smoke:
        print("\nSmoke run on tiny shapes: it checks this code; its figures mean nothing.")
    print(f"\nAttention forward on {machine} (goal: ours >= {GOAL}x SDPA):")
    print("\n".join(rows))
    return 0
