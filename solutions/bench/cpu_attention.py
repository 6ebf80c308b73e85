"""The CPU paged attention of one decode query (batch 1) against the bytes it reads:
``bench decode --attention``.

For a few context lengths and block layouts, one step's attention over every layer of a model-sized cache
(each layer's K/V in its own memory, so nothing stays in a CPU cache from the previous layer) is timed as the
engine runs it: the step's tables built once (``TorchPagedStep``), then one ``attend`` per layer. The rate is
the K and V bytes of the context divided by the time: a read in place should approach the machine's read
bandwidth, a gather pays a copy of the same bytes first.

Layouts: blocks in ascending order (one view of the cache), in descending order (one view, the last block's
stale rows masked: the order a freed sequence's blocks come back in), in two runs (gathered), and ascending
but gathered (the path every table but an ascending one took before), for the cost of the gather itself.
"""

from __future__ import annotations

import functools

import torch

from ..kernels import paged_torch
from ..kernels.blocks import cdiv
from .timing import alternating_ms

LENGTHS = (128, 512, 2048)
LAYERS, BLOCK_SIZE, KV_HEADS, Q_HEADS, HEAD_DIM = 30, 16, 3, 9, 64  # SmolLM2-135M's attention


def layouts(num_blocks: int) -> dict[str, tuple[list[int], bool]]:
    """Block tables of ``num_blocks`` blocks for each layout, and whether to let the step read it in place."""
    ascending = list(range(1, num_blocks + 1))
    half = num_blocks // 2
    return {
        "ascending": (ascending, True),
        "descending": (ascending[::-1], True),
        "two runs (gathered)": (ascending[:half] + [b + 1 for b in ascending[half:]], True),
        "ascending, gathered": (ascending, False),
    }


def attention_table(repeats: int = 5) -> list[str]:
    """Lines of a table: per context length and layout, microseconds per layer and GB/s of K/V read."""
    lines = [f"{'context':>8}  {'layout':<22}{'us/layer':>10}{'GB/s':>8}"]
    context_run = paged_torch.context_run
    try:
        for length in LENGTHS:
            num_blocks = cdiv(length, BLOCK_SIZE)
            k_cache, v_cache = torch.randn(2, LAYERS, num_blocks + 2, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
            q = torch.randn(1, Q_HEADS, HEAD_DIM)
            steps = {
                name: functools.partial(_step, q, k_cache, v_cache, blocks, length, context_run, in_place)
                for name, (blocks, in_place) in layouts(num_blocks).items()
            }
            best_ms = alternating_ms(steps, repeats, min)  # rounds alternate between the layouts
            kv_bytes = 2 * length * KV_HEADS * HEAD_DIM * k_cache.element_size()
            for name, ms in best_ms.items():
                per_layer = ms / 1e3 / LAYERS
                rate = kv_bytes / per_layer / 1e9
                lines.append(f"{length:>8}  {name:<22}{per_layer * 1e6:>10.1f}{rate:>8.1f}")
    finally:
        paged_torch.context_run = context_run
    return lines


@torch.inference_mode()
def _step(q, k_cache, v_cache, blocks: list[int], length: int, context_run, in_place: bool) -> None:
    """One step's attention over every layer; ``in_place=False`` takes the step's in-place read away."""
    paged_torch.context_run = context_run if in_place else lambda *args: None
    table = torch.tensor([blocks], dtype=torch.int32)
    starts, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([length], dtype=torch.int32)
    step = paged_torch.TorchPagedStep(table, starts, lens, BLOCK_SIZE, length, k_cache.dtype)
    for layer in range(LAYERS):
        step.attend(q, k_cache[layer], v_cache[layer])
