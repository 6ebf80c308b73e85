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
    raise NotImplementedError('Lab 0: softmax(q k^T * scale + mask) v, where query head h reads K/V head h // (Hq // Hkv) (hints: make hint LAB=0)')
