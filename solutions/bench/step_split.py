"""Where a decode step's time goes, and how close prefill runs to the machine's GEMM rate.

- ``linear_seconds``: the model's linear layers alone, run in the order a step runs them, on random
  inputs of ``rows`` rows: at one row that is the time the step spends reading weights; the rest of a
  measured step is everything else (norms, RoPE, attention, the cache, sampling, Python).
- ``gemm_flops``: the same linears at a prompt's worth of rows give the machine's GEMM FLOP/s on the
  model's own shapes, the ceiling a prefill is compared with.
"""

from __future__ import annotations

import time

import torch
from torch import nn


def step_linears(model: nn.Module) -> list[nn.Module]:
    """Every matrix product of a step, in order: each layer's linears, then the LM head (not the embedding)."""
    linears = []
    for layer in model.layers:
        linears += [m for m in layer.modules() if hasattr(m, "in_features") and hasattr(m, "out_features")]
    return [*linears, model.lm_head]


@torch.inference_mode()
def linear_seconds(model: nn.Module, rows: int = 1, repeats: int = 5, head_rows: int | None = None) -> float:
    """Fastest of ``repeats`` runs of every linear of a step on ``rows``-row inputs (``head_rows`` for the LM head)."""
    linears = step_linears(model)
    dtype = model.norm.weight.dtype
    inputs = {}
    for i, linear in enumerate(linears):
        n = head_rows if (head_rows is not None and i == len(linears) - 1) else rows
        inputs.setdefault((n, linear.in_features), torch.randn(n, linear.in_features, dtype=dtype))
    calls = [
        (linear, inputs[(head_rows if head_rows is not None and i == len(linears) - 1 else rows, linear.in_features)])
        for i, linear in enumerate(linears)
    ]
    best = float("inf")
    for _ in range(repeats + 1):  # the first run warms up (and makes any packed layout)
        start = time.perf_counter()
        for linear, x in calls:
            linear(x)
        best = min(best, time.perf_counter() - start)
    return best


def linear_flops(model: nn.Module, rows: int, head_rows: int = 1) -> int:
    """Multiply-adds x 2 of a step's linears with ``rows`` tokens (the LM head sees ``head_rows``)."""
    linears = step_linears(model)
    body = sum(2 * rows * m.in_features * m.out_features for m in linears[:-1])
    return body + 2 * head_rows * model.lm_head.in_features * model.lm_head.out_features


def attention_flops(config, tokens: int) -> int:
    """q k^T and p v of a causal prefill of ``tokens`` tokens (half the square), every layer."""
    return 2 * 2 * config.num_layers * config.num_heads * config.head_dim * tokens * (tokens + 1) // 2


def gemm_flops(model: nn.Module, rows: int, repeats: int = 3) -> float:
    """FLOP/s of the model's linears on ``rows``-row inputs (each layer's shapes; LM head excluded)."""
    seconds = linear_seconds(model, rows, repeats, head_rows=1)
    return linear_flops(model, rows) / seconds
