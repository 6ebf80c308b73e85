"""Token permutation: sort the ``T * k`` (token, expert) assignments by expert, pad each group to a block.

A grouped GEMM runs one tile of ``BLOCK`` rows against one expert's weights, so each expert's rows
must be contiguous and a tile must never straddle two experts. Assignment ``a = t * k + j`` is token
``t``'s ``j``-th choice. With block 4, experts 0..2 and 5 assignments::

    experts (flat)       [2, 0, 0, 2, 0]          counts [3, 0, 2] -> padded [4, 0, 4]
    sorted_ids           [1, 2, 4, P | 0, 3, P, P]    P = T * k: a padding row (never read, never written)
    block_experts        [0 | 2]

Invariants: ``len(sorted_ids) == BLOCK * len(block_experts)``; every assignment appears exactly once;
rows of block ``b`` are assignments of expert ``block_experts[b]`` or padding. The buffers are sized for
the worst case (``T * k + E * (BLOCK - 1)`` rows, a whole number of blocks), so nothing waits on the
GPU to learn the sizes; blocks past the last expert's group hold only padding and expert -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .blocks import cdiv


@dataclass(frozen=True)
class Permutation:
    """``sorted_ids`` ``[R]`` int64 (assignment index or the padding value ``T * k``),
    ``block_experts`` ``[R / block]`` int64 (-1 for an all-padding tail block), ``counts`` ``[E]``."""

    sorted_ids: torch.Tensor
    block_experts: torch.Tensor
    counts: torch.Tensor
    block: int


def permute(experts: torch.Tensor, num_experts: int, block: int) -> Permutation:
    """Group the assignments ``experts`` ``[T, k]`` by expert, each group padded
    to a multiple of ``block``."""
    if experts.dim() != 2:
        raise ValueError(f"experts must be [tokens, top_k], got shape {tuple(experts.shape)}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    num_assignments = experts.numel()
    worst_rows = num_assignments + num_experts * (block - 1)
    num_rows = cdiv(worst_rows, block) * block
    # BEGIN SOLUTION Lab 5: stable-sort the flat expert ids; each group starts at the padded cumulative count;
    #  scatter the ids there, fill the rest with T*k; one expert id per block
    # HINT: A grouped GEMM multiplies a tile of BLOCK rows by one expert's weights, so the T * k assignments
    #  are sorted by expert, each expert's group starts on a block boundary (padded to a multiple of
    #  block), and each block records its expert.
    # HINT: Sort the flat expert ids; count per expert and round each count up to a multiple of block;
    #  exclusive cumulative sums give each group's start, unpadded and padded; each assignment goes to
    #  its group's padded start plus its rank in the group; a block's expert comes from a search in the
    #  padded cumulative counts.
    # HINT: Sort stably (torch.argsort(flat, stable=True)) so each group keeps its assignments in token
    #  order; the rank in a group is the position in sorted order minus the group's unpadded start;
    #  blocks past the last group get expert -1.
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    # Counted with index_add_, not bincount: on a GPU bincount reads the largest id back to the host, a sync
    # that a CUDA graph cannot record.
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.index_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    start = torch.cumsum(counts, 0) - counts
    padded_start = torch.cumsum(padded, 0) - padded
    sorted_experts = flat[order]
    rank_in_group = torch.arange(num_assignments, device=flat.device) - start[sorted_experts]
    sorted_ids = torch.full((num_rows,), num_assignments, dtype=torch.int64, device=flat.device)
    sorted_ids[padded_start[sorted_experts] + rank_in_group] = order
    block_rows = torch.arange(0, num_rows, block, device=flat.device)
    block_experts = torch.searchsorted(torch.cumsum(padded, 0), block_rows, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1)
    return Permutation(sorted_ids, block_experts, counts, block)
    # END SOLUTION
