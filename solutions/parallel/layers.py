"""The sharded layers that talk to the other ranks: what a Llama needs beyond its column-parallel projections.

Each wraps the module that does its rank's local math (``nn.Linear``, the CPU's measured ``CpuLinear``, an
INT4 ``QuantLinear``, an ``nn.Embedding``) and adds the one collective that makes the shards whole again::

    RowParallelLinear       y = sum over ranks of x_r W_r^T (+ b)   rank r: W[:, cols_r], input x[..., cols_r]
    VocabParallelEmbedding  rank r looks up its range of the vocabulary, zeros for other ids; sum over ranks
    ParallelLMHead          rank r computes its range's logits; rank 0 gathers them all

The column-parallel projections (QKV, gate/up) need no layer of their own: a rank's rows of the fused weight
make a plain linear whose outputs are its own heads and channels (``shard.py`` says which rows).
"""

from __future__ import annotations

import torch
from torch import nn

from .group import TensorParallelGroup


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with ``W`` split by columns (input features) across the ranks.

    Rank ``r`` holds ``W[:, cols_r]`` in ``linear`` and receives ``x[..., cols_r]`` (the column-parallel layer
    before it produced exactly those), so ``linear(x)`` is a partial sum of ``y``; the ranks' partial sums add
    up to ``x W^T``. ``bias`` ``[out_features]`` (None for a Llama) is the whole bias, held by every rank.
    """

    def __init__(self, linear: nn.Module, group: TensorParallelGroup, bias: torch.Tensor | None = None):
        super().__init__()
        self.linear, self.group = linear, group
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def weight(self) -> torch.Tensor:
        """This rank's columns ``[out_features, in_features / N]`` (the inner linear's weight)."""
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION Lab 9: sum the ranks' partial products (no collective on one rank); add the bias once
        # HINT: linear(x) on rank r is x_r W_r^T, one of N partial sums of x W^T. group.all_reduce(t) adds
        #  every rank's t into each rank's t, in place. On one rank (group.world_size == 1) run no collective.
        # HINT: The bias belongs to the sum, not to each partial: every rank holds the whole bias, so adding
        #  it before the all-reduce counts it N times. Add it after, when it is not None.
    # HINT: Both paths end the same way: whether the all-reduce ran or not (one rank), the bias, when there
    #  is one, goes onto the summed output. An early return on one rank would drop it.
        out = self.linear(x)
        if self.group.world_size > 1:
            self.group.all_reduce(out)
        return out if self.bias is None else out + self.bias
        # END SOLUTION

    def extra_repr(self) -> str:
        return f"rank {self.group.rank} of {self.group.world_size}, all-reduce"


class VocabParallelEmbedding(nn.Module):
    """Token embeddings with the vocabulary split across ranks: rank ``r``'s ``embedding`` holds the rows of
    ids ``[vocab_start, vocab_end)`` (its row ``i`` is id ``vocab_start + i``; padding rows past ``vocab_end``
    are zero).

    Each rank looks up the ids it owns and gives zeros for the others; exactly one rank owns each id, so the
    sum over ranks is the embedding of every id."""

    def __init__(self, embedding: nn.Module, vocab_start: int, vocab_end: int, group: TensorParallelGroup):
        super().__init__()
        self.embedding, self.group = embedding, group
        self.vocab_start, self.vocab_end = vocab_start, vocab_end

    @property
    def weight(self) -> torch.Tensor:
        """This rank's rows of the table (the inner embedding's)."""
        return self.embedding.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION Lab 9: look up this rank's ids at their local row, zeros for the rest; sum the ranks
        # HINT: Rank r's table holds its own ids only: id vocab_start + i is row i. Another rank's id is out
        #  of range here (an index error) or, shifted, lands on a wrong row. So give every id a valid row
        #  first (0 will do), look up, then zero the output rows of the ids that are not this rank's.
        # HINT: A boolean mask of this rank's ids, from two comparisons; torch.where picks each id's row (its
        #  local one, or 0); Tensor.masked_fill zeros rows where a mask is True (give the mask a trailing axis
        #  to cover the hidden dim); then group.all_reduce when world_size > 1.
    # HINT: The local index is ids - vocab_start, and only where the id is this rank's: inside torch.where,
    #  so that no out-of-range index ever reaches the lookup. The mask for masked_fill is the opposite one,
    #  ~mine.unsqueeze(-1).
        mine = (ids >= self.vocab_start) & (ids < self.vocab_end)
        out = self.embedding(torch.where(mine, ids - self.vocab_start, 0))
        out = out.masked_fill(~mine.unsqueeze(-1), 0)
        if self.group.world_size > 1:
            self.group.all_reduce(out)
        return out
        # END SOLUTION

    def extra_repr(self) -> str:
        return (
            f"ids [{self.vocab_start}, {self.vocab_end}), rank {self.group.rank} of {self.group.world_size}"
        )


class ParallelLMHead(nn.Module):
    """Next-token logits with the vocabulary split across ranks: rank ``r``'s ``linear`` computes the logits
    of its ``ceil(V / N)`` vocabulary rows; rank 0 gathers every rank's and returns all ``vocab_size`` of them
    (the padding rows' dropped). The other ranks return their own shard, which nobody reads: only rank 0
    samples."""

    def __init__(self, linear: nn.Module, vocab_size: int, group: TensorParallelGroup):
        super().__init__()
        self.linear, self.vocab_size, self.group = linear, vocab_size, group

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.linear(hidden)
        full = self.group.gather_to_first(local) if self.group.world_size > 1 else local
        if full is None:
            return local
        return full if full.shape[-1] == self.vocab_size else full[..., : self.vocab_size].contiguous()

    def extra_repr(self) -> str:
        return f"vocab {self.vocab_size}, gathered to rank 0 of {self.group.world_size}"
