"""Which decode tuning keys an engine can meet (``paged_attention.eager_decode_shapes``, tuned at start-up so
that no request waits on a tuner): the shortcut over the runs of context lengths finds exactly what trying
every batch and every length finds, on a CPU and with a GPU's split counts (an SM count stood in)."""

from __future__ import annotations

import pytest
import torch

from solutions.kernels import paged_attention as pa


def every_key(max_batch: int, max_seq_len: int, kv_heads: int, device: torch.device) -> list[tuple[int, int]]:
    """The oracle: every (batch, length) tried, the last of each key kept."""
    shapes = {}
    for batch in range(1, max_batch + 1):
        for seq_len in range(1, max_seq_len + 1):
            splits, programs, tiles = pa.decode_tuning_key(batch, kv_heads, seq_len, device)
            shapes[(splits > 1, programs, tiles)] = (batch, seq_len)
    return sorted(shapes.values())


@pytest.mark.parametrize(
    "max_batch, max_seq_len, kv_heads",
    [(6, 300, 3), (12, 1100, 32), (3, 2500, 5)],
    ids=["gqa3-short", "mha32-past-1024", "kv5-long"],
)
@pytest.mark.parametrize("sms", [None, 132, 7], ids=["interpreter", "h100-sms", "few-sms"])
def test_eager_decode_shapes_find_every_key(monkeypatch, max_batch, max_seq_len, kv_heads, sms):
    device = torch.device("cpu")
    if sms is not None:  # a GPU's split counts without a GPU: only the SM count is read from the device
        monkeypatch.setattr(pa, "_sm_count", lambda index: sms)
        device = torch.device("cuda:0")
    expected = every_key(max_batch, max_seq_len, kv_heads, device)
    assert pa.eager_decode_shapes(max_batch, max_seq_len, kv_heads, device) == expected
    assert len(expected) > 3, "too few keys to prove much"
