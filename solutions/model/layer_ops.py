"""Which ``LayerOps`` a model runs between its matrix products: the plain torch functions of ``llama.py``
(what the labs teach), fused Triton kernels on CUDA, or fused chains on a CPU where they measure faster.

``select_layer_ops(device, model)`` is the one place that chooses; ``FASTMODE_FUSED=0`` keeps ``PLAIN_OPS``
everywhere (to compare, or to rule the fused kernels out). Each device's set is built by its own function, so
a new device path is one more function and one more branch.
"""

from __future__ import annotations

import functools
import os

import torch

from ..kernels import fused_ops
from ..kernels.batch_invariant import batch_invariant
from .cpu_layer_ops import cpu_layer_ops
from .llama import PLAIN_OPS, LayerOps


@functools.cache
def triton_layer_ops() -> LayerOps:
    """The fused Triton kernels (``kernels/fused_ops.py``): a launch per chain, RoPE fused with the KV store.

    Compiled on CUDA; on a CPU they run through the Triton interpreter (tests only).
    """
    return LayerOps(
        "triton",
        fused_ops.add_rms_norm,
        fused_ops.rope,
        fused_ops.silu_mul,
        rope_store_kv=fused_ops.rope_store_kv,
    )


def fused_ops_enabled() -> bool:
    """``$FASTMODE_FUSED``: "1" (the default) lets a device use fused ops, "0" keeps ``PLAIN_OPS``; so does
    ``$FASTMODE_BATCH_INVARIANT=1`` (``kernels/batch_invariant.py``: the fused ops round differently)."""
    value = os.environ.get("FASTMODE_FUSED", "1")
    if value not in ("0", "1"):
        raise ValueError(f"FASTMODE_FUSED must be 0 or 1, got {value!r}")
    return value == "1" and not batch_invariant()


def select_layer_ops(device: str | torch.device, model: torch.nn.Module | None = None) -> LayerOps:
    """The fastest ``LayerOps`` available on ``device`` that agrees with ``PLAIN_OPS`` up to rounding: the
    Triton set on CUDA; on a CPU, given the ``model``, the chains measured faster fused at its shapes
    (``model/cpu_layer_ops.py``); ``PLAIN_OPS`` elsewhere, when ``FASTMODE_FUSED=0``, and in the ``labs``
    package (whose engine must run the learner's functions)."""
    device = torch.device(device)
    if not fused_ops_enabled() or not __name__.startswith("solutions."):
        return PLAIN_OPS  # under labs/ the chains are a learner's own functions, graded as written
    if device.type == "cuda":
        return triton_layer_ops()
    if device.type == "cpu" and model is not None:
        return cpu_layer_ops(model)
    return PLAIN_OPS
