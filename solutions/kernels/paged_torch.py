"""The CPU paths of the paged-KV kernels, in plain torch: ``store_kv_torch`` writes a step's K/V into their
slots, ``paged_attention_torch`` attends through block tables. Semantics are those of ``store_kv.store_kv``
and ``paged_attention.paged_attention``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .batch_invariant import batch_invariant
from .blocks import cdiv

DECODE_BUCKETS = 4  # a step's decodes are attended in at most this many groups of similar context length
# ... of at least this many sequences (each group costs a gather and an attention call a layer)
MIN_BUCKET = 4


@dataclass(frozen=True)
class DecodeContext:
    """One decoding sequence's context, for a caller that stores this step's K/V and attends itself.

    ``rows`` None: ``keys``, ``values`` ``[num_layers, L, Hkv, D]`` are views of rows ``start : start + L`` of
    every layer's cache (in block-id order, every one of them context, read in place), and the token goes to
    row ``row`` (``[1]`` int64) of them. Otherwise ``keys``, ``values`` are every layer's whole cache
    ``[num_layers, num_slots, Hkv, D]``, the token goes to cache row ``row``, and ``rows`` (``[L]`` int64) are
    the context's cache rows in token order, the token's own last. A step of several new tokens (a verify
    pass) comes in the gathered form with ``row`` ``[R]`` and ``visible`` (``[R, L]`` bool): which of the
    context's rows each new token attends to (its predecessors for a chain, its path for a tree)."""

    keys: torch.Tensor
    values: torch.Tensor
    row: torch.Tensor
    rows: torch.Tensor | None = None
    visible: torch.Tensor | None = None


def check_store_kv_inputs(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Raise a ValueError naming the problem if the arguments cannot form a ``store_kv`` call.

    Slot values are checked only for CPU tensors: on a GPU that would synchronise the device every layer.
    """
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [T, Hkv, D]; got {tuple(k.shape)} and {tuple(v.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [num_blocks, block_size, Hkv, D]; "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"k [T, Hkv, D] {tuple(k.shape)} does not match the cache's [Hkv, D] {tuple(k_cache.shape[2:])}"
        )
    if k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache must share a dtype; got {k_cache.dtype} and {v_cache.dtype}")
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"slot_mapping must be an int32/int64 vector of one slot per token ({k.shape[0]}); "
            f"got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    if len({t.device for t in (k, v, k_cache, v_cache, slot_mapping)}) != 1:
        raise ValueError("k, v, k_cache, v_cache and slot_mapping must be on one device")
    if slot_mapping.device.type == "cpu":
        check_slots_fit(slot_mapping, k_cache.shape[0] * k_cache.shape[1])


def check_slots_fit(slot_mapping: torch.Tensor, num_slots: int) -> None:
    """Raise a ValueError naming the slot if one is past the cache's last row
    (reads the values: CPU tensors)."""
    if slot_mapping.numel() and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot {int(slot_mapping.max())} is past the cache's last row ({num_slots - 1})")


def store_kv_torch(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """The CPU path of ``store_kv``: ``index_copy_`` into the caches viewed as ``[num_slots, Hkv, D]``."""
    check_store_kv_inputs(k, v, k_cache, v_cache, slot_mapping)
    with_slot, slots = kept_slots(slot_mapping)
    if with_slot is not None:
        k, v = k[with_slot], v[with_slot]
    write_slots(k, v, k_cache, v_cache, slots)


def kept_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the tokens that have a slot, or None when all do; their slots as int64). A negative slot marks a token
    whose K/V is not kept."""
    has_slot = slot_mapping >= 0
    if bool(has_slot.all()):
        return None, slot_mapping.long()
    with_slot = has_slot.nonzero().squeeze(1)
    return with_slot, slot_mapping[with_slot].long()


def write_slots(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """Token ``i``'s K/V into cache row ``slots[i]`` (int64, every slot valid: no checks here, the callers
    check once), through ``index_copy_`` into the caches viewed as ``[num_slots, Hkv, D]``."""
    for cache, new in ((k_cache, k), (v_cache, v)):
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, new.to(cache.dtype))


def paged_attention_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_query_len: int,
    max_seq_len: int,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Attention of a flat, variable-length batch over a paged KV cache: the CPU path.
    Cache rows outside every context must hold finite values (the engine zero-initialises the
    cache): they are masked, not skipped.

    q ``[T, Hq, D]``; k_cache, v_cache ``[num_blocks, block_size, Hkv, D]``; ``block_table``
    ``[B, max_blocks]``; sequence ``b`` owns query rows ``query_start_loc[b] : query_start_loc[b + 1]``,
    which are the last tokens of its ``seq_lens[b]`` tokens (causal, aligned bottom-right).
    Token ``p``'s K/V sit in block ``block_table[b, p // block_size]`` at offset ``p % block_size``.
    Returns ``[T, Hq, D]`` in q's dtype.

    One call = one ``TorchPagedStep`` (the step's index work) + its ``attend`` (the per-layer work).
    """
    step = TorchPagedStep(
        block_table, query_start_loc, seq_lens, k_cache.shape[1], max_seq_len, k_cache.dtype
    )
    return step.attend(q, k_cache, v_cache, sm_scale)


class TorchPagedStep:
    """The part of the CPU paged attention that depends only on the step's layout, computed once per step and
    reused by every layer (a layer then runs two gathers, one fused attention call per group, and a scatter).

    Each sequence's blocks are gathered into one contiguous ``[Hkv, L, D]`` view of its context, then torch's
    fused ``scaled_dot_product_attention`` attends without materialising a score matrix. Sequences with a
    single query (decodes) form one batch; the others (prefill chunks, draft verification) are padded to the
    longest of them and form a second. Decodes are sorted by context length and split into a few buckets, each
    padded to its own longest context (less padding to gather and to attend over). Masks are additive tensors
    made here, once. Without padding to hide (one decode, or one prompt computed from its first token) no mask
    is used at all: the decode's keys are cut to its length, the prompt runs ``is_causal``.

    The gathers write into buffers made by the first layer and reused by every later one: a fresh
    multi-megabyte tensor per layer costs the allocator's page faults as well as the copy (measured
    2-3x slower on CPU). A lone prompt whose blocks are consecutive in the cache is not gathered at all:
    its context is a view of the cache. Nor is a lone decode (batch 1) whose block ids form one run,
    in whatever order (ascending as a fresh allocator hands them out, descending as a freed sequence's
    blocks come back): its one query sees its whole context and attention does not depend on the order
    of its keys, so the context is one view (``context_run``). Blocks in several runs are gathered:
    reading each run in place and merging by log-sum-exp measured slower than the gather up to 2k tokens of
    context (``bench decode --attention``).

    With ``$FASTMODE_BATCH_INVARIANT=1`` (``kernels/batch_invariant.py``) each query row attends alone,
    over exactly its own context in token order (a view of the cache where the sequence's blocks ascend in one
    run, else gathered; no padding, no mask, one SDPA call per row): its result does not depend on the step's
    other rows.
    """

    def __init__(
        self,
        block_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        block_size: int,
        max_seq_len: int,
        dtype: torch.dtype,
    ):
        self.num_blocks = cdiv(max_seq_len, block_size)
        q_lens = (query_start_loc[1:] - query_start_loc[:-1]).tolist()
        self.invariant = batch_invariant()
        if self.invariant:  # per sequence: its first query token, query count, context length, block table
            self.rows_of = list(
                zip(query_start_loc[:-1].tolist(), q_lens, seq_lens.tolist(), block_table.long(), strict=True)
            )
            self.block_size = block_size
        self.num_single = num_single = next((i for i, n in enumerate(q_lens) if n != 1), len(q_lens))
        self.num_seqs = len(q_lens)
        table = block_table[:, : self.num_blocks].long()
        device = block_table.device
        self.decode_buckets = self._decode_buckets(table, seq_lens[:num_single].tolist(), block_size, dtype)
        self.prefill_table = self.prefill_mask = self.token = self.token_valid = self.valid = None
        self.causal_len = None
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # group -> gathered K, V (reused)
        self.prefill_first_block = None
        if num_single < len(q_lens):
            rows = slice(num_single, len(q_lens))
            self.prefill_table = table[rows]
            self.prefill_first_block = _first_of_run(self.prefill_table)
            lens = torch.tensor(q_lens[num_single:], device=device)
            starts = query_start_loc[num_single:-1].long()
            if len(q_lens) - num_single == 1 and q_lens[-1] == int(seq_lens[-1]):  # one prompt from its start
                self.causal_len = q_lens[-1]
                self.token = slice(int(starts[0]), int(starts[0]) + self.causal_len)
                return
            local = torch.arange(int(lens.max()), device=device)
            self.valid = local[None, :] < lens[:, None]
            # Padded query rows: sequence i's row j is token starts[i] + j
            # (clamped; padding rows are discarded).
            self.token = torch.where(self.valid, starts[:, None] + local[None, :], starts[:, None])
            self.token_valid = self.token[self.valid]
            # Query j of sequence i is at absolute position seq_len - q_len + j and sees keys up to it.
            position = (seq_lens[rows, None] - lens[:, None] + local[None, :]).clamp(min=0)
            key_pos = torch.arange(self.num_blocks * block_size, device=device)
            in_context = key_pos[None, :] < seq_lens[rows, None]
            visible = in_context[:, None, :] & (key_pos[None, None, :] <= position[:, :, None])
            self.prefill_mask = _additive(visible, dtype)[:, None]

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sm_scale: float | None = None
    ) -> torch.Tensor:
        """q ``[T, Hq, D]`` against one layer's caches
        ``[num_blocks, block_size, Hkv, D]`` -> ``[T, Hq, D]``."""
        if self.invariant:
            return self._attend_rows(q, k_cache, v_cache, sm_scale)
        if self.num_single == self.num_seqs:  # decodes only: no output buffer to fill
            return self._decode(q, k_cache, v_cache, sm_scale)
        out = torch.empty_like(q)
        if self.num_single:
            out[: self.num_single] = self._decode(q[: self.num_single], k_cache, v_cache, sm_scale)
        keys, values = self._context(-1, k_cache, v_cache, self.prefill_table, self.prefill_first_block)
        if self.causal_len is not None:
            qs = q[self.token].transpose(0, 1)[None]  # [1, Hq, L, D]
            keys, values = keys[:, :, : self.causal_len], values[:, :, : self.causal_len]
            attended = _sdpa(qs, keys, values, None, sm_scale, causal=True)
            out[self.token] = attended[0].transpose(0, 1)
            return out
        qs = q[self.token].transpose(1, 2)  # [P, Hq, longest, D]
        attended = _sdpa(qs, keys, values, self.prefill_mask, sm_scale).transpose(1, 2)  # [P, longest, Hq, D]
        out[self.token_valid] = attended[self.valid]
        return out

    def _attend_rows(self, q, k_cache, v_cache, sm_scale):
        """Batch-invariant attention: each query row alone over its own context, in token order."""
        out = torch.empty_like(q)
        for first, q_len, seq_len, blocks in self.rows_of:
            used = blocks[: cdiv(seq_len, self.block_size)]
            start = first_of_run(used)
            if start is not None:  # ascending blocks: the context is a view of the cache, in token order
                keys, values = (
                    c[start : start + len(used)].reshape(1, -1, *c.shape[2:]).transpose(1, 2)
                    for c in (k_cache, v_cache)
                )
            else:
                keys, values = (
                    c.index_select(0, used).reshape(1, -1, *c.shape[2:]).transpose(1, 2)
                    for c in (k_cache, v_cache)
                )
            for j in range(q_len):
                length = seq_len - q_len + j + 1
                row = q[first + j : first + j + 1].unsqueeze(2)  # [1, Hq, 1, D]
                out[first + j] = _sdpa(row, keys[:, :, :length], values[:, :, :length], None, sm_scale)[
                    0, :, 0
                ]
        return out

    @staticmethod
    def _decode_buckets(table, lens: list[int], block_size: int, dtype) -> list[DecodeBucket]:
        """The step's decodes sorted by length and cut into at most ``DECODE_BUCKETS`` groups of at least
        ``MIN_BUCKET`` sequences: each group is padded only to its own longest context."""
        if not lens:
            return []
        order = sorted(range(len(lens)), key=lens.__getitem__)
        count = max(1, min(DECODE_BUCKETS, len(lens) // MIN_BUCKET))
        buckets = []
        for i in range(count):
            members = order[i * len(lens) // count : (i + 1) * len(lens) // count]
            longest = lens[members[-1]]
            rows = None if count == 1 else torch.tensor(members, device=table.device)
            bucket_table = table[: len(lens)] if rows is None else table[rows]
            mask = None
            if any(lens[m] != longest for m in members):
                member_lens = torch.tensor([lens[m] for m in members] if rows is not None else lens)
                visible = torch.arange(longest)[None, :] < member_lens[:, None]
                mask = _additive(visible.to(table.device), dtype)[:, None, None, :]
            bucket_table = bucket_table[:, : cdiv(longest, block_size)]
            run = None
            if len(lens) == 1:
                run = context_run(bucket_table[0].tolist(), longest, block_size, dtype, table.device)
            buckets.append(DecodeBucket(rows, bucket_table, longest, mask, run))
        return buckets

    def _decode(self, q, k_cache, v_cache, sm_scale):
        """One query per sequence: q ``[B, Hq, D]`` against each sequence's
        gathered context, bucket by bucket."""
        if len(self.decode_buckets) == 1:
            return self._decode_bucket(0, q, k_cache, v_cache, sm_scale)
        out = torch.empty_like(q)
        for i, bucket in enumerate(self.decode_buckets):
            attended = self._decode_bucket(i, q.index_select(0, bucket.rows), k_cache, v_cache, sm_scale)
            out.index_copy_(0, bucket.rows, attended)
        return out

    def _decode_bucket(self, i, q, k_cache, v_cache, sm_scale):
        bucket = self.decode_buckets[i]
        if bucket.run is not None:
            return attend_run(q, k_cache, v_cache, bucket.run, sm_scale)
        keys, values = self._context(i, k_cache, v_cache, bucket.table, None)
        keys, values = keys[:, :, : bucket.length], values[:, :, : bucket.length]
        return _sdpa(q.unsqueeze(2), keys, values, bucket.mask, sm_scale).squeeze(2)

    def _context(self, group, k_cache, v_cache, table, first_block):
        """K, V ``[B, Hkv, L, D]`` of ``table``'s blocks: a view of the cache when ``first_block`` says they
        are one consecutive run of a single sequence, else gathered into this step's buffers for ``group`` (a
        decode bucket's index, or -1 for the prefills)."""
        if first_block is not None:
            run = slice(first_block, first_block + table.shape[1])
            keys, values = (
                cache[run].reshape(1, -1, *cache.shape[2:]).transpose(1, 2) for cache in (k_cache, v_cache)
            )
            return keys, values
        buffers = self._buffers.get(group)
        # the first layer's call: every layer's cache has the same shape, dtype and device
        if buffers is None:
            shape = (table.numel(), k_cache[0].numel())
            buffers = self._buffers[group] = tuple(k_cache.new_empty(shape) for _ in range(2))
        return _gather(k_cache, v_cache, table, buffers)


@dataclass(frozen=True)
class DecodeBucket:
    """Decodes attended together: ``rows`` of the step's decode queries (None: all of them, in order), their
    block ``table`` ``[b, blocks]`` (int64), the longest context ``length``, and the additive ``mask``
    ``[b, 1, 1, length]`` hiding each shorter context's padding (None when every context has that length), and
    ``run`` when the bucket is one sequence read in place (None: gathered)."""

    rows: torch.Tensor | None
    table: torch.Tensor
    length: int
    mask: torch.Tensor | None
    run: CacheRun | None = None


@dataclass(frozen=True)
class CacheRun:
    """Rows ``start : start + length`` of one layer's cache viewed as ``[num_slots, Hkv, D]``,
    read in place, and the additive ``mask`` ``[1, 1, 1, length]`` hiding the stale rows among them
    (None: every row is context)."""

    start: int
    length: int
    mask: torch.Tensor | None


def context_run(
    blocks: list[int], length: int, block_size: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> CacheRun | None:
    """The cache rows of one sequence's ``length`` tokens as one run, when its blocks ``blocks`` (its block
    table cut to ``ceil(length / block_size)`` entries) are consecutive ids in any order; else None. Valid for
    a query that sees the whole context (a decode): the rows come in block-id order, not in token order.

    Only the last block can be partly filled: its rows past the last token are cut off when it is the run's
    highest block, and masked when it is not (a table in descending order)::

        blocks [9, 8, 7], length 40, block_size 16:   rows 112 ......... 128 ......... 144 ......... 160
                                                           | 7: t32-t39, stale | 8: t16-t31 | 9: t0-t15 |
                                                           one run of 48 rows; rows 120-127 masked
    """
    low, high = min(blocks), max(blocks)
    if high - low != len(blocks) - 1 or len(set(blocks)) != len(blocks):
        return None
    start, stop, mask = low * block_size, (high + 1) * block_size, None
    last = blocks[-1]
    stale = range(last * block_size + length - (len(blocks) - 1) * block_size, (last + 1) * block_size)
    if stale and last == high:
        stop = stale.start
    elif stale:
        visible = torch.ones(stop - start, dtype=torch.bool, device=device)
        visible[stale.start - start : stale.stop - start] = False
        mask = _additive(visible, dtype).view(1, 1, 1, -1)
    return CacheRun(start, stop - start, mask)


def attend_run(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, run: CacheRun, sm_scale: float | None
) -> torch.Tensor:
    """One sequence's decode query q ``[1, Hq, D]`` over its context, read in place: ``run`` of the caches
    ``[num_blocks, block_size, Hkv, D]``."""
    keys, values = (
        cache.view(-1, *cache.shape[2:])[run.start : run.start + run.length].transpose(0, 1).unsqueeze(0)
        for cache in (k_cache, v_cache)
    )
    return _sdpa(q.unsqueeze(2), keys, values, run.mask, sm_scale).squeeze(2)


def first_of_run(ids: torch.Tensor) -> int | None:
    """The first of ``ids`` (1-D, CPU) when they are consecutive (``i, i + 1, ...``): cache rows or blocks
    that can be read as one view of the cache instead of gathered. None otherwise."""
    if ids.numel() > 1 and not bool((ids[1:] - ids[:-1] == 1).all()):
        return None
    return int(ids[0])


def _first_of_run(table: torch.Tensor) -> int | None:
    """``first_of_run`` of a one-row block ``table`` (one sequence); None for several rows."""
    return first_of_run(table[0]) if table.shape[0] == 1 else None


def _gather(k_cache, v_cache, table, out):
    """K, V ``[B, Hkv, L, D]`` of the blocks in ``table`` ``[B, num_blocks]`` (int64),
    ``L = num_blocks * block_size``, written into ``out``: two ``[B * num_blocks, block_size * Hkv * D]``
    buffers in the cache's dtype.

    ``index_select`` over the caches viewed as one row per block copies whole blocks (measured 2-8x faster
    than advanced indexing ``k_cache[table]`` on CPU)."""
    batch, num_blocks = table.shape
    block_size, heads, dim = k_cache.shape[1:]
    rows = table.flatten()
    gathered = []
    for cache, buffer in zip((k_cache, v_cache), out):
        torch.index_select(cache.view(cache.shape[0], -1), 0, rows, out=buffer)
        gathered.append(buffer.view(batch, num_blocks * block_size, heads, dim).transpose(1, 2))
    return gathered[0], gathered[1]


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as SDPA's additive mask in the attention's dtype (0 where visible, -inf elsewhere)."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(
        ~visible, float("-inf")
    )


def _sdpa(q, k, v, mask, sm_scale, causal=False):
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=sm_scale, is_causal=causal, enable_gqa=True
    )
