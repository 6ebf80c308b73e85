"""Backend selection for prefill attention: compiled Triton on CUDA, plain torch on CPU unless asked.

``"auto"`` reads ``$FASTMODE_ATTENTION`` at call time, then falls back to "triton" on CUDA and "torch" on
CPU; "triton" on CPU runs the very same kernel through the interpreter (``TRITON_INTERPRET=1``, which
``import solutions`` sets on a machine without a GPU). ``$FASTMODE_ATTENTION`` is read here only.
"""

from __future__ import annotations

import logging
import os

import torch

from .attention import gqa_attention
from .flash_attention import HEAD_DIMS, flash_attention

log = logging.getLogger("fastmode")


def resolve_backend(name: str, device: torch.device) -> str:
    """The concrete backend ("torch" or "triton") that ``name`` means on ``device``."""
    if name == "auto":
        name = os.environ.get("FASTMODE_ATTENTION", "auto")
    if name == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if name not in ("torch", "triton"):
        raise ValueError(f"attention backend must be 'auto', 'torch' or 'triton', got {name!r}")
    return name


def backend_for_model(name: str, device: torch.device, head_dim: int) -> str:
    """The backend an engine asks for: ``name``, except that "auto" (with ``$FASTMODE_ATTENTION`` unset) on
    CUDA becomes "torch", with a warning, for a head dim the Triton kernels do not tile (``HEAD_DIMS``). A
    backend named outright is kept: the kernels then refuse the head dim, saying so."""
    unset = name == "auto" and os.environ.get("FASTMODE_ATTENTION", "auto") == "auto"
    if unset and device.type == "cuda" and head_dim not in HEAD_DIMS:
        log.warning(
            "the Triton attention kernels take head dims %s; this model's is %d: attention runs on torch's "
            "path, and decode steps without CUDA graphs",
            ", ".join(map(str, HEAD_DIMS)),
            head_dim,
        )
        return "torch"
    return name


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, backend: str = "auto"
) -> torch.Tensor:
    """Attention for q ``[B, Hq, Lq, D]`` over k/v ``[B, Hkv, Lk, D]`` on the chosen backend."""
    if resolve_backend(backend, q.device) == "triton":
        return flash_attention(q, k, v, causal=causal)
    return gqa_attention(q, k, v, causal=causal)
