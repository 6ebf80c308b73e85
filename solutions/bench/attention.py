"""What ``python -m solutions bench attention`` measures with (``cli/bench/attention.py``): naive attention
(the full score matrix through memory), torch SDPA's flash backend, and the GPU table of our FlashAttention-2
kernel against both, timed by ``timing.median_ms``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..kernels.flash_attention import _flash_fwd_tuned, flash_attention, flops
from .paged_attention import tuned_tiles
from .timing import median_ms

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


def cpu_median_ms(repeats: int, fn: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """``median_ms`` of ``fn(*args, **kwargs)`` on the wall clock (the CPU table's and notebooks' form)."""
    return median_ms(lambda: fn(*args, **kwargs), "cpu", repeats)


def tflops(work: float, fn: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """TFLOP/s of ``fn(*args)`` on the first argument's device, timed by ``median_ms``."""
    return work / (median_ms(lambda: fn(*args, **kwargs), args[0].device, 3) * 1e-3) / 1e12


def bench_kernels(
    dtypes: list[torch.dtype], head_dims: list[int], lengths: list[int], batch: int, heads: int
) -> list[str]:
    """The GPU table (any device with ``--smoke``): ours vs SDPA flash vs naive, the tuned tiles, the goal."""
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
                    tiles = tuned_tiles(_flash_fwd_tuned.last_config if device == "cuda" else None)
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
