"""The CPU paths of the paged-KV kernels, in plain torch (no Triton import, so a CPU engine never loads a
kernel module before ``TRITON_INTERPRET`` is decided): ``store_kv_torch`` writes a step's K/V into their slots,
``paged_attention_torch`` attends through block tables. Semantics are those of ``store_kv.store_kv`` and
``paged_attention.paged_attention``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    if slot_mapping.device.type == "cpu" and slot_mapping.numel():
        rows = k_cache.shape[0] * k_cache.shape[1]
        if int(slot_mapping.max()) >= rows:
            raise ValueError(f"slot {int(slot_mapping.max())} is past the cache's last row ({rows - 1})")


def store_kv_torch(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """The CPU path of ``store_kv``: ``index_copy_`` into the caches viewed as ``[num_slots, Hkv, D]``."""
    check_store_kv_inputs(k, v, k_cache, v_cache, slot_mapping)
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    for cache, new in ((k_cache, k), (v_cache, v)):
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slot_mapping.long(), new.to(cache.dtype))


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
    """Attention of a flat, variable-length batch over a paged KV cache: the CPU path. Cache rows outside every
    context must hold finite values (the engine zero-initialises the cache): they are masked, not skipped.

    q ``[T, Hq, D]``; k_cache, v_cache ``[num_blocks, block_size, Hkv, D]``; ``block_table`` ``[B, max_blocks]``;
    sequence ``b`` owns query rows ``query_start_loc[b] : query_start_loc[b + 1]``, which are the last tokens of
    its ``seq_lens[b]`` tokens (causal, aligned bottom-right). Token ``p``'s K/V sit in block
    ``block_table[b, p // block_size]`` at offset ``p % block_size``.

    Each sequence's blocks are gathered into one contiguous ``[Hkv, L, D]`` view of its context, then torch's
    fused ``scaled_dot_product_attention`` attends without materialising a score matrix. Sequences with a single
    query (decodes) are handled as one batch; the others (prefill chunks, draft verification) are padded to the
    longest of them and run as a second batch. Returns ``[T, Hq, D]`` in q's dtype.
    """
    block_size = k_cache.shape[1]
    num_blocks = -(-max_seq_len // block_size)
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).tolist()
    num_single = next((i for i, n in enumerate(q_lens) if n != 1), len(q_lens))
    out = torch.empty_like(q)
    if num_single:
        # One query per sequence: q [B, Hq, 1, D] against each sequence's gathered context, padding masked.
        rows = slice(0, num_single)
        keys, values, visible = _gather_context(k_cache, v_cache, block_table[rows], seq_lens[rows], num_blocks)
        qs = q[:num_single].unsqueeze(2)
        attended = _sdpa(qs, keys, values, visible[:, None, None, :], sm_scale)
        out[:num_single] = attended.squeeze(2)
    if num_single < len(q_lens):
        rows = slice(num_single, len(q_lens))
        lens = torch.tensor(q_lens[num_single:], device=q.device)
        starts = query_start_loc[num_single:-1].long()
        longest = int(lens.max())
        # Padded query rows: sequence i's row j is token starts[i] + j (clamped; padding rows are discarded).
        local = torch.arange(longest, device=q.device)
        valid = local[None, :] < lens[:, None]
        token = torch.where(valid, starts[:, None] + local[None, :], starts[:, None])
        qs = q[token].transpose(1, 2)  # [P, Hq, longest, D]
        keys, values, in_context = _gather_context(k_cache, v_cache, block_table[rows], seq_lens[rows], num_blocks)
        # Query j of sequence i is at absolute position seq_len - q_len + j and sees keys up to it.
        position = (seq_lens[rows, None] - lens[:, None] + local[None, :]).clamp(min=0)
        key_pos = torch.arange(keys.shape[2], device=q.device)
        visible = in_context[:, None, :] & (key_pos[None, None, :] <= position[:, :, None])
        attended = _sdpa(qs, keys, values, visible[:, None], sm_scale).transpose(1, 2)  # [P, longest, Hq, D]
        out[token[valid]] = attended[valid]
    return out


def _gather_context(k_cache, v_cache, block_table, seq_lens, num_blocks):
    """K, V ``[B, Hkv, L, D]`` of each sequence's first ``L = num_blocks * block_size`` positions, and the mask
    ``[B, L]`` of positions inside its context."""
    table = block_table[:, :num_blocks].long()
    keys = k_cache[table].flatten(1, 2).transpose(1, 2)
    values = v_cache[table].flatten(1, 2).transpose(1, 2)
    length = keys.shape[2]
    visible = torch.arange(length, device=keys.device)[None, :] < seq_lens[:, None]
    return keys, values, visible


def _sdpa(q, k, v, mask, sm_scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale, enable_gqa=True)
