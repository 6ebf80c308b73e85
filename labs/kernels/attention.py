# Generated from solutions/kernels/attention.py by tools/make_labs.py: fill in each NotImplementedError.
"""Grouped-query attention in plain PyTorch: the CPU path, and the semantics every kernel matches.

Shapes: q ``[B, Hq, Lq, D]``; k, v ``[B, Hkv, Lk, D]`` with ``Hq % Hkv == 0``. Query head ``h`` reads
key/value head ``h // (Hq // Hkv)``. Causal masking is aligned bottom-right: query ``i`` sees keys
``j <= i + Lk - Lq``, so a chunk of new queries can attend to a longer cached prefix.
"""

from __future__ import annotations

import torch


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise a ValueError naming the problem if q, k, v do not form a valid attention call."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D [B, H, L, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch size or head dim")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")


def gqa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    sm_scale: float | None = None,
    kv_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T * sm_scale + mask) v, without materialising repeated K/V heads.

    ``kv_lens`` ``[B]`` (optional) gives each sequence's number of valid keys: keys at ``j >= kv_lens[b]``
    are padding and masked, and causal alignment uses ``kv_lens[b]`` in place of ``Lk``.
    Softmax runs in float32; the result has q's dtype and shape.
    """
    raise NotImplementedError('Lab 0: fold each group of query heads onto its K/V head, mask (kv_lens, bottom-right causal), softmax in float32, multiply by v')


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
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale, enable_gqa=True)
