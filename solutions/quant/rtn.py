"""Round-to-nearest group quantization with zero points: the baseline AWQ improves on.

Each row of a weight ``[N, K]`` is cut into groups of ``group_size`` consecutive input channels.
A group with range ``[lo, hi]`` (after optional clipping to ``[-max_val, max_val]``) gets

    scale = (hi - lo) / (2**w_bit - 1)        zero = round(-lo / scale)
    q = clamp(round(w / scale) + zero, 0, 2**w_bit - 1)        w ~ (q - zero) * scale

so ``lo`` and ``hi`` are represented to within half a step and 0.0 maps to an integer code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_BITS = (2, 3, 4)


@dataclass
class GroupQuantized:
    """Integer codes ``q`` uint8 ``[N, K]``; ``scales`` float32 and ``zeros`` uint8,
    both ``[N, K // group_size]``."""

    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    w_bit: int
    group_size: int

    def dequantize(self) -> torch.Tensor:
        """float32 ``[N, K]``: ``(q - zero) * scale`` per group."""
        n, k = self.q.shape
        grouped = self.q.view(n, -1, self.group_size).float() - self.zeros.float()[..., None]
        return (grouped * self.scales[..., None]).view(n, k)


def check_quant_args(in_features: int, w_bit: int, group_size: int, name: str = "weight") -> None:
    """Raise a ValueError naming the problem if ``w_bit`` / ``group_size`` cannot quantize ``in_features``."""
    if w_bit not in SUPPORTED_BITS:
        raise ValueError(
            f"w_bit must be one of {SUPPORTED_BITS} (codes are stored in 4-bit fields), got {w_bit}"
        )
    if group_size < 8 or group_size % 8:
        raise ValueError(f"group_size must be a positive multiple of 8, got {group_size}")
    if in_features % group_size:
        fits = [g for g in (32, 64, 128, 192, 256) if in_features % g == 0]
        raise ValueError(
            f"group_size {group_size} does not divide the {in_features} input features of {name} "
            f"({in_features} = {in_features / group_size:g} x {group_size}); group sizes that fit: {fits}"
        )


def quantize(
    weight: torch.Tensor, w_bit: int, group_size: int, max_val: torch.Tensor | None = None
) -> GroupQuantized:
    """Quantize ``weight`` ``[N, K]`` group-wise;
    ``max_val`` ``[N, K // group_size]`` clips each group first."""
    n, k = weight.shape
    check_quant_args(k, w_bit, group_size)
    w = weight.float().reshape(n, k // group_size, group_size)
    if max_val is not None:
        w = torch.maximum(torch.minimum(w, max_val[..., None]), -max_val[..., None])
    q_max = 2**w_bit - 1
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((hi - lo) / q_max).clamp(min=1e-8)  # a constant group still gets a usable step
    zeros = (-lo / scales).round().clamp(0, q_max)
    q = (w / scales[..., None]).round().add(zeros[..., None]).clamp(0, q_max)
    return GroupQuantized(q.view(n, k).to(torch.uint8), scales, zeros.to(torch.uint8), w_bit, group_size)


def fake_quantize(
    weight: torch.Tensor, w_bit: int, group_size: int, max_val: torch.Tensor | None = None
) -> torch.Tensor:
    """``weight`` rounded to the quantization grid and back, in ``weight``'s dtype (for error searches)."""
    return quantize(weight, w_bit, group_size, max_val).dequantize().to(weight.dtype)
