"""Block arithmetic, written once: how many blocks of ``size`` cover ``n`` items, and where a token of a paged
sequence lives in the flat KV cache.

    block table [7, 3, 9], block_size 16
        positions  0..15 -> block 7    rows  7*16 ..  7*16+15
        positions 16..31 -> block 3    rows  3*16 ..  3*16+15
        positions 32..39 -> block 9    rows  9*16 ..  9*16+7
    slot (row) of position p = table[p // block_size] * block_size + p % block_size

The Triton kernels compute the same address inside their loops (``kernels/paged_attention.py``, Lab 2, walks
the table itself); everything on the host calls ``cache_slots``.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

Indices = TypeVar("Indices", np.ndarray, torch.Tensor)


def cdiv(n: int, size: int) -> int:
    """How many blocks of ``size`` cover ``n`` items: ``ceil(n / size)`` in integers (no float rounding)."""
    return -(-n // size)


def cache_slots(
    block_table: Indices, positions: Indices, block_size: int, rows: Indices | None = None
) -> Indices:
    """The flat cache rows of ``positions``: ``block_table[p // block_size] * block_size + p % block_size``.

    Elementwise over numpy arrays or torch tensors (the table's kind). ``block_table`` is one sequence's table
    ``[max_blocks]``, or ``[B, max_blocks]`` with ``rows`` naming each position's sequence."""
    blocks = positions // block_size if rows is None else (rows, positions // block_size)
    return block_table[blocks] * block_size + positions % block_size
