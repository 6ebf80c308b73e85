"""The CPU paged attention's batch-1 decode (``kernels.paged_torch``): one query reads its context in place
when its blocks are one run of ids, in whatever order, against the float64 reference.

Cache rows that hold no token of the sequence are large finite garbage: a run spans whole blocks and relies on
the mask for the last block's stale rows.
"""

from __future__ import annotations

import pytest
import torch

from solutions.kernels import paged_torch
from solutions.kernels.reference import reference_paged_attention

BLOCK = 16
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2}


def lone_decode(blocks: list[int], length: int, dtype: torch.dtype, num_blocks: int = 24, sm_scale=None):
    """A cache whose ``blocks`` hold one sequence's ``length`` tokens (every other row: 1e4) and its decode
    query: the relative error of the torch path's attention to the float64 reference's."""
    generator = torch.Generator().manual_seed(length * 100 + len(blocks))
    k_cache, v_cache = torch.full((2, num_blocks, BLOCK, 3, 64), 1e4, dtype=dtype)
    for p in range(length):
        row = blocks[p // BLOCK], p % BLOCK
        k_cache[row], v_cache[row] = torch.randn(2, 3, 64, generator=generator).to(dtype)
    q = torch.randn(1, 9, 64, generator=generator).to(dtype)
    table = torch.tensor([blocks + [0]], dtype=torch.int32)  # padded with the null block, as the runner pads
    starts, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([length], dtype=torch.int32)
    out = paged_torch.paged_attention_torch(
        q, k_cache, v_cache, table, starts, lens, max_query_len=1, max_seq_len=length, sm_scale=sm_scale
    )
    expected = reference_paged_attention(q, k_cache, v_cache, table, starts, lens, sm_scale=sm_scale)
    return float((out.double() - expected).norm() / expected.norm())


LAYOUTS = [
    pytest.param([3, 4, 5, 6], 57, True, id="ascending-partial"),
    pytest.param([3, 4, 5, 6], 64, True, id="ascending-full"),
    pytest.param([9, 8, 7, 6], 57, True, id="descending-partial-masked"),
    pytest.param([9, 8, 7, 6], 64, True, id="descending-full"),
    pytest.param([5, 3, 4, 6], 60, True, id="shuffled-run-masked"),
    pytest.param([4], 1, True, id="one-token"),
    pytest.param([5, 6, 1, 2], 60, False, id="two-runs-gathered"),
    pytest.param([7, 3, 11, 15, 20], 70, False, id="scattered-gathered"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("blocks, length, in_place", LAYOUTS)
def test_lone_decode_matches_reference(monkeypatch, blocks, length, in_place, dtype):
    """In place (no gather) when the blocks are one run of ids in any order, gathered otherwise."""
    gathered = []
    real_gather = paged_torch._gather
    monkeypatch.setattr(paged_torch, "_gather", lambda *a: gathered.append(1) or real_gather(*a))
    error = lone_decode(blocks, length, dtype)
    assert error < TOLERANCE[dtype], f"blocks {blocks}, {length} tokens: relative error {error:.1e}"
    assert bool(gathered) != in_place, f"blocks {blocks}: expected {'in place' if in_place else 'a gather'}"


def test_lone_decode_with_a_scale():
    assert lone_decode([9, 8, 7, 6], 57, torch.float32, sm_scale=0.3) < TOLERANCE[torch.float32]


def test_context_run_cuts_or_masks_the_last_block():
    """The docstring's picture: a descending table is one run with the stale rows masked; ascending, one run
    cut at the last token; blocks that are not one run of ids, or a repeated block, give None (gather)."""
    run = paged_torch.context_run([9, 8, 7], 40, BLOCK, torch.float32)
    assert (run.start, run.length) == (112, 48)
    hidden = (run.mask.flatten() == float("-inf")).nonzero().flatten().tolist()
    assert hidden == list(range(8, 16)), f"rows 120-127 of the cache should be masked, got {hidden}"
    run = paged_torch.context_run([7, 8, 9], 40, BLOCK, torch.float32)
    assert (run.start, run.length, run.mask) == (112, 40, None)
    assert paged_torch.context_run([1, 3, 2, 5], 60, BLOCK, torch.float32) is None
    assert paged_torch.context_run([4, 4, 5], 40, BLOCK, torch.float32) is None
