"""The paged KV cache's tensors, and the attention call the model makes over them in one step.

Memory, per layer, for keys and for values alike::

    [num_blocks, block_size, Hkv, D]            block 0 is the null block (padding writes land there)
       block 0: | null .................. |
       block 1: | t0 t1 ... t15 |   <- sequence A, positions 0-15     block_table[A] = [1, 7]
       block 7: | t16 t17 -- -- |   <- sequence A, positions 16-17 (partly full)
       block 4: | t0 ... t15    |   <- shared by A and B when they have the same first 16 tokens

A token at position ``p`` of a sequence is stored at row ``slot = block_table[p // block_size] *
block_size + p % block_size`` of the flattened cache (the "slot mapping"). Which blocks a sequence owns
is the ``KVCacheManager``'s business; this file only holds the bytes and reads/writes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..kernels.attention_backend import resolve_backend
from ..kernels.blocks import cache_slots
from ..kernels.paged_attention import paged_attention
from ..kernels.paged_torch import DecodeContext, TorchPagedStep, check_slots_fit, kept_slots, write_slots
from ..kernels.store_kv import store_kv


class PagedKVCache:
    """K and V tensors ``[num_layers, num_blocks, block_size, num_kv_heads, head_dim]``, zero-initialised."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str | torch.device,
    ):
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.k = _zeros(shape, dtype, torch.device(device))
        self.v = _zeros(shape, dtype, torch.device(device))

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """K and V of ``block_size`` tokens in every layer."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.itemsize

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block ``dst`` becomes a copy of ``src`` in every layer, for each ``(src, dst)``."""
        if not pairs:
            return
        pinned = self.k.device.type == "cuda"  # a pinned source copies without making the host wait
        src, dst = (
            torch.tensor(c, pin_memory=pinned).to(self.k.device, non_blocking=True) for c in zip(*pairs)
        )
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros that, on a CPU, take memory only where they are written. ``torch.zeros`` writes every byte, so a
    1 GiB cache would be resident from the start; ``calloc`` (numpy's zeros) maps zero pages that the OS
    backs only when a block is first stored into, as a GPU cache's size is reserved, not used."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = dtype.itemsize * math.prod(shape)
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)


@dataclass
class AttentionMetadata:
    """Where each sequence of a step's flat token batch lives, as the attention kernels want it.

    Sequence ``b`` owns tokens ``query_start_loc[b] : query_start_loc[b + 1]`` of the batch; they are the last
    of its ``seq_lens[b]`` tokens. Sequences with one query token (decodes) come first.
    """

    slot_mapping: torch.Tensor  # [T] int64: cache row of each token
    block_table: torch.Tensor  # [B, max_blocks] int32, padded with the null block 0
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    max_query_len: int
    max_seq_len: int


class PagedAttention:
    """The model's ``attend`` for one step: write this step's K/V into their slots, then attend through the
    block tables. The torch path serves the CPU; "triton" runs the Lesson 2 kernels (compiled on CUDA, through
    the interpreter on CPU).

    The torch path does the step's index work here, once (slot checks, which tokens have a slot, gather
    tables, masks: a ``TorchPagedStep``), so each layer only copies its K/V in and attends."""

    def __init__(self, cache: PagedKVCache, meta: AttentionMetadata, backend: str = "auto"):
        self.cache, self.meta = cache, meta
        self.triton = resolve_backend(backend, cache.k.device) == "triton"
        if self.triton:
            self._attention, self._store = paged_attention, store_kv
            return
        check_slots_fit(meta.slot_mapping, cache.num_blocks * cache.block_size)
        self._with_slot, self._slots = kept_slots(meta.slot_mapping)
        self._step = TorchPagedStep(
            meta.block_table,
            meta.query_start_loc,
            meta.seq_lens,
            cache.block_size,
            meta.max_seq_len,
            cache.k.dtype,
        )

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta, k_cache, v_cache = self.meta, self.cache.k[layer], self.cache.v[layer]
        if self.triton:
            self._store(k, v, k_cache, v_cache, meta.slot_mapping)
        else:
            if self._with_slot is not None:
                k, v = k[self._with_slot], v[self._with_slot]
            write_slots(k, v, k_cache, v_cache, self._slots)
        return self._attend_stored(q, k_cache, v_cache)

    def decode_context(self) -> DecodeContext | None:
        """This step's context as a ``DecodeContext``, for a caller that stores and attends itself (the
        layers without module calls, ``model/cpu_decode_layers.py``); None unless the step is one decode on
        the torch path. Read in place where its cache rows form one run with no stale row among them
        (``TorchPagedStep``'s ``CacheRun``), else by its rows."""
        if (
            self.triton
            or self._step.num_seqs != 1
            or self._step.num_single != 1
            or self._with_slot is not None
        ):
            return None
        bucket = self._step.decode_buckets[0]
        keys, values = self.flat_caches()
        run = bucket.run
        if run is not None and run.mask is None and 0 <= int(self._slots[0]) - run.start < run.length:
            in_run = slice(run.start, run.start + run.length)
            return DecodeContext(keys[:, in_run], values[:, in_run], self._slots - run.start)
        positions = torch.arange(bucket.length, device=bucket.table.device)
        rows = cache_slots(bucket.table[0], positions, self.cache.block_size)
        return DecodeContext(keys, values, self._slots, rows)

    def verify_context(self, max_rows: int) -> DecodeContext | None:
        """One sequence's 2 to ``max_rows`` new tokens after its context (a verify pass over a chain of
        drafts, say) as a ``DecodeContext`` in its gathered form: ``row`` ``[R]`` the tokens' cache rows,
        ``rows`` ``[L]`` the whole context's in token order, the tokens' last, ``visible`` causal (token
        ``i`` sees the first ``L - R + 1 + i`` rows). None on any other step and on the Triton path."""
        meta = self.meta
        if (
            self.triton
            or self._step.num_seqs != 1
            or self._step.num_single != 0
            or self._with_slot is not None
            or not 2 <= meta.max_query_len <= max_rows
        ):
            return None
        context, new = meta.max_seq_len, meta.max_query_len
        positions = torch.arange(context, device=meta.block_table.device)
        rows = cache_slots(meta.block_table[0].long(), positions, self.cache.block_size)
        visible = positions[None, :] <= positions[context - new :, None]
        return DecodeContext(*self.flat_caches(), self._slots, rows, visible)

    def flat_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer's K and V cache as rows: ``[num_layers, num_slots, Hkv, D]`` views."""
        return tuple(
            cache.view(cache.shape[0], -1, *cache.shape[3:]) for cache in (self.cache.k, self.cache.v)
        )

    def rope_store_attend(
        self,
        layer: int,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        rope_store_kv: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        """``__call__`` from the unrotated fused projection ``qkv`` ``[T, Hq + 2 Hkv, D]``: one
        ``rope_store_kv`` launch rotates the queries in place and writes the rotated keys and the values at
        the step's slots (negative slots write nothing), then the queries attend."""
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
        q = rope_store_kv(qkv, cos, sin, k_cache, v_cache, self.meta.slot_mapping)
        return self._attend_stored(q, k_cache, v_cache)

    def _attend_stored(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Attention of q ``[T, Hq, D]`` through the block tables, this step's K/V already in the cache."""
        meta = self.meta
        if self.triton:
            return self._attention(
                q,
                k_cache,
                v_cache,
                meta.block_table,
                meta.query_start_loc,
                meta.seq_lens,
                max_query_len=meta.max_query_len,
                max_seq_len=meta.max_seq_len,
            )
        # A bfloat16 model on a CPU keeps a float32 cache (``kv_sizing.allocate_kv_cache``):
        # attend in its dtype.
        return self._step.attend(q.to(k_cache.dtype), k_cache, v_cache).to(q.dtype)
