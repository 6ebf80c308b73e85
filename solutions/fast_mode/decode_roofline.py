"""The decode roofline as a what-if: tokens/s from bytes per token and memory bandwidth, on any memory.

A decode step streams the weights a token uses (all of them for a dense model, the active ones for a
Mixture-of-Experts model at batch 1) plus each sequence's KV cache, so one user can get at most

    per-user tokens/s <= bandwidth / (active weight bytes + batch * KV bytes per sequence)

and a batch of B users B times that in all. It is an upper bound from bandwidth alone: compute, kernel launch
and the step's overhead (which notebooks 00 and 07 measure) come on top. A model larger than one chip's memory
is sharded over ``chips_needed`` chips; the bound then adds their bandwidths and takes the links between the
chips to be free, which is exactly what this arithmetic cannot check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Bytes per weight: bfloat16; int8; INT4 codes in groups of 64 with a 16-bit scale and zero per group
# (Lesson 6's AWQ layout: 0.5 + 4 / 64).
BYTES_PER_WEIGHT = {"bf16": 2.0, "int8": 1.0, "int4": 0.5 + 4 / 64}


@dataclass(frozen=True)
class Memory:
    """Where the weights live: its read bandwidth, its capacity per chip, and where the figures come from."""

    name: str
    bandwidth_bytes_per_s: float
    capacity_bytes: float
    source: str

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0 or not self.capacity_bytes > 0:
            raise ValueError(f"Memory {self.name!r} needs a positive bandwidth and capacity")


# Cerebras, "Cerebras Systems Unveils World's Fastest AI Chip with Whopping 4 Trillion Transistors" (WSE-3
# press release, 13 March 2024): 44 GB of on-chip SRAM, 21 PB/s memory bandwidth. Vendor figures, not ours.
WSE3_SRAM = Memory(
    "Cerebras WSE-3 on-chip SRAM",
    21e15,
    44e9,
    "Cerebras WSE-3 announcement, 13 March 2024: 44 GB on-chip SRAM, 21 PB/s (vendor figures)",
)
# NVIDIA H200 datasheet: 141 GB of HBM3e (its bandwidth is measured, not quoted)
H200_HBM_CAPACITY_BYTES = 141e9


@dataclass(frozen=True)
class ModelSize:
    """A model by its parameter counts; ``active_parameters``: those a token uses (all, in a dense model)."""

    name: str
    parameters: float
    active_parameters: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        active = self.active_parameters
        if not self.parameters > 0 or (active is not None and not 0 < active <= self.parameters):
            raise ValueError(f"ModelSize {self.name!r} needs parameters > 0 and 0 < active <= parameters")

    @property
    def active(self) -> float:
        return self.parameters if self.active_parameters is None else self.active_parameters


@dataclass(frozen=True)
class RooflinePoint:
    per_user_tokens_per_s: float
    aggregate_tokens_per_s: float
    weight_bytes: float  # all the weights, in this format
    bytes_per_step: float  # what one decode step streams: the active weights and every sequence's KV cache
    chips_needed: int  # chips whose memory holds the weights and the KV caches
    fits_one_chip: bool


def decode_roofline(
    memory: Memory, model: ModelSize, weight_format: str, batch: int = 1, kv_bytes_per_sequence: float = 0.0
) -> RooflinePoint:
    """The bandwidth bound of decoding ``model`` stored as ``weight_format`` (a key of ``BYTES_PER_WEIGHT``)
    from ``memory``, ``batch`` sequences at once, each with ``kv_bytes_per_sequence`` bytes of KV cache to
    read (``bench.kv.kv_bytes_per_token`` times its context)."""
    if weight_format not in BYTES_PER_WEIGHT:
        raise ValueError(f"weight_format must be one of {sorted(BYTES_PER_WEIGHT)}, got {weight_format!r}")
    if batch < 1 or kv_bytes_per_sequence < 0:
        raise ValueError(
            f"need batch >= 1 and kv_bytes_per_sequence >= 0, got {batch}, {kv_bytes_per_sequence}"
        )
    per_weight = BYTES_PER_WEIGHT[weight_format]
    weight_bytes = model.parameters * per_weight
    held = weight_bytes + batch * kv_bytes_per_sequence
    chips = math.ceil(held / memory.capacity_bytes)
    step_bytes = model.active * per_weight + batch * kv_bytes_per_sequence
    per_user = chips * memory.bandwidth_bytes_per_s / step_bytes
    return RooflinePoint(per_user, batch * per_user, weight_bytes, step_bytes, chips, chips == 1)
