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
        raise ValueError(
            f"q, k, v must be 4-D [B, H, L, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
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
    # BEGIN SOLUTION Lab 0: softmax(q k^T * scale + mask) v, where query head h
    #  reads K/V head h // (Hq // Hkv)
    # HINT: First make it right: repeat K and V's heads (repeat_interleave(group, dim=1)) and it
    #  is plain attention. Then drop the copy: view q as [B, Hkv, group * Lq, D] so each K/V head
    #  serves its group in one matmul.
    # HINT: Masks, filled with -inf before the softmax: key j is padding when j >= kv_lens[b];
    #  causal is bottom-right, query i sees keys j <= i + (len_b - Lq), len_b = kv_lens[b] or Lk.
    #  Softmax in float32, cast to v's dtype.
    # HINT: The tricky lines are the two views. Query head h = kv * group + g, so the groups of one K/V head
    #  are neighbours and q.reshape(B, Hkv, group * Lq, D) keeps each with its head. View the scores as
    #  [B, Hkv, group, Lq, Lk] before masking, so a [B, Lq, Lk] mask broadcasts with two new axes.
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    group = q_heads // kv_heads
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    # Fold each group of query heads into the row dimension of its shared K/V head.
    scores = q.reshape(batch, kv_heads, group * q_len, head_dim) @ k.transpose(-1, -2)
    scores = scores.float().view(batch, kv_heads, group, q_len, k_len) * scale
    if causal or kv_lens is not None:
        key_pos = torch.arange(k_len, device=q.device)
        lens = torch.full((batch,), k_len, device=q.device) if kv_lens is None else kv_lens.to(q.device)
        visible = key_pos[None, None, :] < lens[:, None, None]  # [B, 1, Lk]
        if causal:
            last_visible = torch.arange(q_len, device=q.device)[None, :] + (lens[:, None] - q_len)  # [B, Lq]
            visible = visible & (key_pos[None, None, :] <= last_visible[:, :, None])  # [B, Lq, Lk]
        scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(batch, kv_heads, group * q_len, k_len)
    return (probs @ v).view(batch, q_heads, q_len, head_dim)
    # END SOLUTION
