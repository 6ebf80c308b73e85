"""The decode roofline: a batch-1 decode step must read every weight once, so
``tokens/s <= read bandwidth / weight bytes per token``. Both sides are measured, not assumed."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn


def measure_read_bandwidth(nbytes: int = 1 << 30, repeats: int = 5, device: str = "cpu") -> float:
    """Median bytes/s of summing a float32 buffer of ``nbytes`` (bigger than any cache by default)."""
    buffer = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    buffer.sum()  # fault the pages in
    times = []
    for _ in range(repeats):
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        buffer.sum()
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times)


def decode_bytes_per_token(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: every parameter once, except the embedding table, of which
    it reads one row (a tied LM head still reads the whole matrix, as the head)."""
    embedding = model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied matrix counts once
    tied = model.lm_head.weight is embedding
    return total if tied else total - embedding.numel() * embedding.element_size() + embedding[0].nbytes
