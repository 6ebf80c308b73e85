"""AWQ (Lin et al., MLSys 2024): scale the input channels that activations say matter, then clip.

A linear ``y = x W^T`` is unchanged if input channel ``j`` of ``W`` is multiplied by ``s_j`` and of
``x`` divided by it. Quantizing ``W diag(s)`` instead of ``W`` gives channels with large activations
(large ``s_j``) finer steps relative to their weights, at the cost of coarser steps elsewhere in the
group. AWQ sets ``s = mean|x|^alpha``, searches ``alpha`` on a grid by the output error on
calibration activations, and folds ``1/s`` into whatever produced ``x`` (an RMSNorm weight, or the
rows of the previous linear), so inference pays nothing for it. Then a clipping search shrinks each
output channel's range where that lowers the output error further.

As in llm-awq, the error for ``qkv_proj`` is measured on the attention block's output and for
``gate_up_proj`` on the MLP's. Differences from it, on purpose: the clip ratio is chosen per output channel
(llm-awq: per group), which keeps the cached file small. ``o_proj`` gets no scale: with grouped-query
attention its input channels come from shared V heads, so a free per-channel scale cannot be folded
into V (llm-awq skips it too). The tied LM head gets no scale either, since folding one would change
the embedding lookups; it is clipped.

``quant/calibrate.py`` runs the searches over a whole model (``python -m solutions calibrate-awq`` writes the
file that ``LLM(quantization="awq")`` reads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..paths import DATA_DIR
from .rtn import check_quant_args, fake_quantize

CLIP_GRID, CLIP_MAX_SHRINK = 20, 0.5


@dataclass
class ScaleSearch:
    """The chosen per-input-channel ``scales`` ``[K]`` and ``alpha``;
    ``errors[i]`` is the output MSE at ``alphas[i]``."""

    scales: torch.Tensor
    alpha: float
    alphas: list[float]
    errors: list[float]


def search_scale(
    weight: torch.Tensor,
    x: torch.Tensor,
    w_bit: int,
    group_size: int,
    n_grid: int = 20,
    block: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> ScaleSearch:
    """Grid-search ``alpha`` in ``[0, 1)`` for ``s = mean|x|^alpha`` minimising
    ``mean((x W^T - x (Q(W s)/s)^T)^2)``.

    ``weight`` ``[N, K]``; ``x`` ``[T, K]`` calibration inputs of that linear. ``block``, if given, maps
    the linear's output to the output of the block it feeds, and the error is measured there. ``alpha = 0``
    is plain round-to-nearest (``s = 1``), so the chosen error is never above RTN's on ``x``. Scales are
    normalised by ``sqrt(max * min)`` so they straddle 1 (the product, not the ratio, is what matters).
    """
    check_quant_args(weight.shape[1], w_bit, group_size)
    weight, x = weight.float(), x.float()
    # BEGIN SOLUTION Lab 6: try each alpha of the grid: scale W's input channels by mean|x|**alpha, quantize,
    #  unscale; keep the alpha whose error after block is lowest
    # HINT: The grid is alpha = i / n_grid for i in range(n_grid), so alpha = 0 (s = 1) is plain RTN.
    #  s = x.abs().mean(0) ** alpha, clamped to >= 1e-4, divided by sqrt(s.max() * s.min()); the quantized
    #  weight is fake_quantize(W * s) / s.
    # HINT: The error is the mean of (block(x @ W_q.T) - block(x @ W.T))**2, with block the identity
    #  when None. Record each alpha and its error in grid order, and return
    #  ScaleSearch(best scales, best alpha, alphas, errors).
    block = block or (lambda y: y)
    x_mean = x.abs().mean(dim=0)
    target = block(x @ weight.T)
    alphas, errors = [], []
    best: tuple[float, float, torch.Tensor] | None = None
    for i in range(n_grid):
        alpha = i / n_grid
        scales = x_mean.pow(alpha).clamp(min=1e-4)
        scales = scales / (scales.max() * scales.min()).sqrt()
        w_q = fake_quantize(weight * scales, w_bit, group_size) / scales
        error = (block(x @ w_q.T) - target).pow(2).mean().item()
        alphas.append(alpha)
        errors.append(error)
        if best is None or error < best[0]:
            best = (error, alpha, scales)
    return ScaleSearch(best[2], best[1], alphas, errors)
    # END SOLUTION


def clip_ratios(n_grid: int = CLIP_GRID, max_shrink: float = CLIP_MAX_SHRINK) -> torch.Tensor:
    """The clip grid: ``ratio[i] = 1 - max_shrink * i / n_grid`` (index 0 means no clipping)."""
    return 1 - max_shrink * torch.arange(n_grid) / n_grid


def clip_max_val(weight: torch.Tensor, group_size: int, ratio: torch.Tensor) -> torch.Tensor:
    """Per-group clip bound ``[N, K // group_size]``: ``ratio`` ``[N]`` times each group's largest ``|w|``."""
    n, k = weight.shape
    return weight.float().abs().view(n, k // group_size, group_size).amax(dim=-1) * ratio[:, None]


def search_clip(weight: torch.Tensor, x: torch.Tensor, w_bit: int, group_size: int) -> torch.Tensor:
    """Index into ``clip_ratios()`` per output channel ``[N]`` (uint8) minimising that
    channel's output MSE on ``x``."""
    check_quant_args(weight.shape[1], w_bit, group_size)
    weight, x = weight.float(), x.float()
    target = x @ weight.T
    ratios = clip_ratios()
    best_error = torch.full((weight.shape[0],), float("inf"))
    best_index = torch.zeros(weight.shape[0], dtype=torch.uint8)
    for i, ratio in enumerate(ratios):
        max_val = clip_max_val(weight, group_size, ratio.expand(weight.shape[0]))
        error = (x @ fake_quantize(weight, w_bit, group_size, max_val).T - target).pow(2).mean(dim=0)
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best_index[better] = i
    return best_index


def awq_params_path(model_name: str, w_bit: int, group_size: int) -> Path:
    """Where the AWQ scales of ``model_name`` (the weights file's stem) at this bit
    width and group size are cached."""
    return DATA_DIR / "awq" / f"{model_name}.w{w_bit}g{group_size}.safetensors"


def load_awq_params(model_name: str, w_bit: int, group_size: int) -> dict[str, torch.Tensor]:
    """The cached ``{linear name}.scales`` (float16 ``[K]``) and
    ``{linear name}.clip`` (uint8 ``[N]``) tensors."""
    path = awq_params_path(model_name, w_bit, group_size)
    if not path.exists():
        raise FileNotFoundError(
            f"no AWQ scales for {model_name} at w_bit={w_bit}, group_size={group_size} ({path} is missing). "
            f"Compute them (a few minutes on CPU) with:\n"
            f"    python -m solutions calibrate-awq --w-bit {w_bit} --group-size {group_size}"
        )
    return load_file(str(path))
