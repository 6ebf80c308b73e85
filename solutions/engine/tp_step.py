"""What rank 0 tells the other ranks about a step, and how a rank rebuilds the step's inputs from it.

A step's int32 inputs already sit packed in one buffer (``input_batch.py``); a rank needs only the sizes that
say
where each array starts, the two bounds attention takes, and the copy-on-write block pairs to apply first::

    StepHeader   (num_tokens, num_logits, num_seqs, width, max_query_len, max_seq_len, block_copies)
                 sent to each worker through its pipe: a few dozen bytes
    the buffer   layout.total int32 entries, broadcast from rank 0 over the process group

Every rank then runs the same forward over the same ``StepInputs``, each on its own shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .input_batch import StepInputs, StepLayout


@dataclass(frozen=True)
class StepHeader:
    """One step's shape: ``layout`` (where each array sits in the packed buffer), attention's query and
    context bounds, and the ``(src, dst)`` blocks to copy in every layer before the forward
    (copy-on-write)."""

    layout: StepLayout
    max_query_len: int
    max_seq_len: int
    block_copies: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, inputs: StepInputs, block_copies: list[tuple[int, int]]) -> StepHeader:
        return cls(inputs.layout, inputs.max_query_len, inputs.max_seq_len, tuple(block_copies))

    def step_inputs(self, buffer: torch.Tensor) -> StepInputs:
        """The step's inputs as views of ``buffer`` (this rank's copy of rank 0's packed buffer). What only
        rank 0 uses (the logits spans, the persistent batch's rows) is left empty."""
        views = self.layout.split(buffer[: self.layout.total])
        empty = np.empty(0, dtype=np.int64)
        return StepInputs(self.layout, *views, self.max_query_len, self.max_seq_len, {}, empty, empty, [], [])
