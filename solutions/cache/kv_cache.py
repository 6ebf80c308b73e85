"""A preallocated, contiguous KV cache: one fixed-size slot of ``max_len`` tokens per running sequence.

Memory layout, per layer, for keys and for values alike::

    [num_slots, max_len, Hkv, D]       row r = slot * max_len + position   (the "slot mapping")
      slot 0: | t0 | t1 | t2 | ... unused ... |
      slot 1: | t0 | t1 | ... unused ........ |

Every slot reserves ``max_len`` rows whether its sequence uses them or not: that waste is what the
paged cache of Lesson 2 removes. K/V are written through the flat slot mapping, the same interface a
paged cache uses (there a row is ``block * block_size + offset``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.attention import gqa_attention
from ..kernels.attention_backend import prefill_attention


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ):
        self.num_slots, self.max_len = num_slots, max_len
        shape = (num_layers, num_slots, max_len, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``, ``v`` ``[T, Hkv, D]`` at rows ``slot_mapping`` ``[T]``."""
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)

    def sequence_kv(self, layer: int, slots: slice | torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ``[B, Hkv, length, D]`` of the first ``length`` positions of ``slots``."""
        k = self.k[layer, slots, :length].transpose(1, 2)
        v = self.v[layer, slots, :length].transpose(1, 2)
        return k, v


@dataclass
class AttentionMetadata:
    """Where each sequence of a flat token batch lives in the cache (built once per step).

    Tokens of sequence ``i`` are ``query_start[i] : query_start[i] + query_lens[i]`` of the batch;
    after this step the sequence holds ``seq_lens[i]`` tokens in slot ``slots[i]``.
    """

    slot_mapping: torch.Tensor  # [T] cache row of each token
    slots: list[int]
    query_start: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    seq_lens_tensor: torch.Tensor  # [B], on the model's device

    @property
    def is_decode(self) -> bool:
        return all(n == 1 for n in self.query_lens)


class CacheAttention:
    """The model's ``attend`` for one step: write K/V to the cache, then attend over each sequence."""

    def __init__(self, cache: KVCache, meta: AttentionMetadata, backend: str = "auto"):
        self.cache, self.meta, self.backend = cache, meta, backend
        # Decode batches whose slots are 0..B-1 read the cache as a view, not a gather.
        slots = meta.slots
        self.slot_index = (
            slice(0, len(slots)) if slots == list(range(len(slots))) else torch.tensor(slots, device=cache.k.device)
        )
        self.max_seq_len = max(meta.seq_lens)
        self.padded = min(meta.seq_lens) != self.max_seq_len

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = self.meta
        self.cache.write(layer, meta.slot_mapping, k, v)
        if meta.is_decode:
            keys, values = self.cache.sequence_kv(layer, self.slot_index, self.max_seq_len)
            out = gqa_attention(
                q.unsqueeze(2),  # [B, Hq, 1, D]
                keys,
                values,
                causal=False,
                kv_lens=meta.seq_lens_tensor if self.padded else None,
            )
            return out.squeeze(2)
        outs = []
        for slot, start, q_len, seq_len in zip(meta.slots, meta.query_start, meta.query_lens, meta.seq_lens):
            keys, values = self.cache.sequence_kv(layer, slice(slot, slot + 1), seq_len)
            q_seq = q[start : start + q_len].transpose(0, 1).unsqueeze(0)  # [1, Hq, Lq, D]
            outs.append(prefill_attention(q_seq, keys, values, causal=True, backend=self.backend)[0].transpose(0, 1))
        return torch.cat(outs) if len(outs) > 1 else outs[0]
