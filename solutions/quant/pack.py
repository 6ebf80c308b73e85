"""Eight 4-bit values per int32, along the last dimension.

Layout of one packed word (``values[..., 8j : 8j + 8]`` -> ``packed[..., j]``)::

    bit  31..28  27..24  23..20  19..16  15..12  11..8   7..4    3..0
         v[8j+7] v[8j+6] v[8j+5] v[8j+4] v[8j+3] v[8j+2] v[8j+1] v[8j]

Element ``k`` lives in word ``k // 8`` at bit offset ``4 * (k % 8)``, the rule every kernel that reads
the packed weight uses. Values must lie in ``[0, 15]``: INT3 codes (0..7) travel in the same 4-bit
containers. Element 7 of a word sets the sign bit, so readers shift and mask (``(w >> s) & 0xF``)
rather than trusting the sign.
"""

from __future__ import annotations

import torch

VALUES_PER_WORD = 8
BITS = 4


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """``values`` ``[..., K]`` integers in [0, 15], ``K % 8 == 0`` -> int32 ``[..., K // 8]``."""
    if values.shape[-1] % VALUES_PER_WORD:
        raise ValueError(
            f"the last dimension ({values.shape[-1]}) must be a multiple of {VALUES_PER_WORD} to pack"
        )
    if values.numel() and (int(values.min()) < 0 or int(values.max()) > 15):
        raise ValueError(f"4-bit values must lie in [0, 15]; got [{int(values.min())}, {int(values.max())}]")
    # BEGIN SOLUTION Lab 6: element k goes to word k // 8 at bit 4 * (k % 8); return int32 words
    # HINT: Reshape the last dim to [K/8, 8]: value i of each row of 8 is shifted left by 4 * i bits, and the
    #  eight shifted values are combined. The 4-bit fields never overlap, so OR and sum give the same word.
    # HINT: Shift in int32 and sum with dtype=torch.int32;
    #  element 7 may set bit 31 (a negative word), which is fine.
    words = values.to(torch.int32).reshape(*values.shape[:-1], -1, VALUES_PER_WORD)
    shifts = torch.arange(0, BITS * VALUES_PER_WORD, BITS, dtype=torch.int32, device=values.device)
    # The eight fields are disjoint, so their sum is their bitwise OR;
    # int32 wraps into the sign bit as intended.
    return (words << shifts).sum(dim=-1, dtype=torch.int32)
    # END SOLUTION


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., K // 8]`` -> uint8 ``[..., K]`` in [0, 15]; the inverse of ``pack_int4``."""
    if packed.dtype != torch.int32:
        raise ValueError(f"packed weights must be int32, got {packed.dtype}")
    # BEGIN SOLUTION Lab 6: the inverse of pack_int4: take each 4-bit field back out of its word, as uint8
    # HINT: Field i of a word is (word >> 4 * i) & 0xF; broadcasting packed[..., None] against a
    #  vector of the eight shifts gets all of them at once. Shifting a negative int32 copies its sign
    #  bit in: the 0xF mask drops it.
    # HINT: Then reshape [..., K/8, 8] -> [..., K] and cast to torch.uint8.
    shifts = torch.arange(0, BITS * VALUES_PER_WORD, BITS, dtype=torch.int32, device=packed.device)
    fields = (packed.unsqueeze(-1) >> shifts) & 0xF  # arithmetic shift: the mask drops the copied sign bits
    return fields.reshape(*packed.shape[:-1], -1).to(torch.uint8)
    # END SOLUTION
