"""Float64 references that tests grade every attention implementation against.

Deliberately naive: repeat K/V heads, build the full mask, softmax in float64.
"""

from __future__ import annotations

import torch


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    sm_scale: float | None = None,
    kv_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Float64 attention with bottom-right causal alignment; returns float64 ``[B, Hq, Lq, D]``.

    A query row that sees no key at all (only possible with ``kv_lens`` shorter than the queries)
    returns zeros.
    """
    q, k, v = q.double(), k.double(), v.double()
    batch, q_heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    group = q_heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    out = torch.zeros_like(q)
    for b in range(batch):
        n_keys = k_len if kv_lens is None else int(kv_lens[b])
        mask = torch.zeros(q_len, k_len, dtype=torch.bool)
        mask[:, :n_keys] = True
        if causal:
            for i in range(q_len):
                mask[i, max(0, i + n_keys - q_len + 1) :] = False
        s = scores[b].masked_fill(~mask.to(scores.device), float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out[b] = p @ v[b]
    return out


def gather_paged_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first ``seq_len`` positions of one sequence, ``[seq_len, Hkv, D]``, read row by row from a paged
    ``cache`` ``[num_blocks, block_size, Hkv, D]`` through its ``block_table`` row."""
    block_size = cache.shape[1]
    rows = [cache[int(block_table[p // block_size]), p % block_size] for p in range(seq_len)]
    return torch.stack(rows) if rows else cache.new_zeros(0, *cache.shape[2:])


def reference_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Float64 paged attention, ``[T, Hq, D]``: sequence ``b``'s queries
    ``q[query_start_loc[b]:query_start_loc[b+1]]`` are the last of its ``seq_lens[b]`` tokens
    and attend (bottom-right causal) to its K/V gathered through ``block_table[b]``. Rows that
    belong to no sequence stay zero."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(len(seq_lens)):
        start, end, seq_len = int(query_start_loc[b]), int(query_start_loc[b + 1]), int(seq_lens[b])
        if end == start:
            continue
        k, v = (
            gather_paged_kv(cache, block_table[b], seq_len).transpose(0, 1)[None]
            for cache in (k_cache, v_cache)
        )
        heads_first = q[start:end].transpose(0, 1)[None]
        out[start:end] = reference_attention(heads_first, k, v, causal=True, sm_scale=sm_scale)[0].transpose(
            0, 1
        )
    return out


def reference_store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """New copies of the caches with token ``t``'s K/V at block ``slot // block_size``, offset
    ``slot % block_size`` (``slot = slot_mapping[t]``; negative slots skipped), one token at a time."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    block_size = k_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            k_cache[slot // block_size, slot % block_size] = k[t]
            v_cache[slot // block_size, slot % block_size] = v[t]
    return k_cache, v_cache
