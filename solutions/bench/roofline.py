"""The decode roofline: a batch-1 decode step must read every weight once, so
``tokens/s <= read bandwidth / weight bytes per token``. Both sides are measured, not assumed."""

from __future__ import annotations

from torch import nn

from .timing import bandwidth_gbps


def measure_read_bandwidth(nbytes: int = 1 << 30, repeats: int = 5, device: str = "cpu") -> float:
    """Bytes/s of summing a float32 buffer of ``nbytes`` (bigger than any cache by default):
    ``timing.bandwidth_gbps`` with ``copy=False``."""
    return 1e9 * bandwidth_gbps(nbytes, device, copy=False, repeats=repeats)


def decode_bytes_per_token(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter once, except the embedding table, of which
    it reads one row (a tied LM head still reads the whole matrix, as the head)."""
    embedding = model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied matrix counts once
    tied = model.lm_head.weight is embedding
    return total if tied else total - embedding.numel() * embedding.element_size() + embedding[0].nbytes
