"""Backend selection for prefill attention: compiled Triton on CUDA, plain torch on CPU unless asked.

``"auto"`` reads ``$FASTMODE_ATTENTION`` at call time, then falls back to "triton" on CUDA and "torch" on
CPU; "triton" on CPU runs the very same kernel through the interpreter (``TRITON_INTERPRET=1``, which
``import solutions`` sets on a machine without a GPU). ``$FASTMODE_ATTENTION`` is read here only.
"""

from __future__ import annotations

import os

import torch

from .attention import gqa_attention
from .flash_attention import flash_attention


def resolve_backend(name: str, device: torch.device) -> str:
    """The concrete backend ("torch" or "triton") that ``name`` means on ``device``."""
    if name == "auto":
        name = os.environ.get("FASTMODE_ATTENTION", "auto")
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if name not in ("torch", "triton"):
        raise ValueError(f"attention backend must be 'auto', 'torch' or 'triton', got {name!r}")
    return name


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, backend: str = "auto"
) -> torch.Tensor:
    """Attention for q ``[B, Hq, Lq, D]`` over k/v ``[B, Hkv, Lk, D]`` on the chosen backend."""
    if resolve_backend(backend, q.device) == "triton":
        return flash_attention(q, k, v, causal=causal)
    return gqa_attention(q, k, v, causal=causal)
