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
