"""Write one step's keys and values into the paged KV cache, token by token, at their slots.

The cache of one layer is ``k_cache``/``v_cache`` ``[num_blocks, block_size, Hkv, D]``. Token ``t`` of the
step goes to row ``slot = slot_mapping[t]`` of the cache seen as ``[num_blocks * block_size, Hkv, D]``,
i.e. block ``slot // block_size``, offset ``slot % block_size``; the runner computes
``slot = block_table[p // block_size] * block_size + p % block_size`` for the token at position ``p``.
A negative slot means "no cache row" (a padding token) and is skipped.

``store_kv`` is the Triton kernel (one program per token, all heads at once); ``paged_torch.store_kv_torch``
is the CPU path, one ``index_copy_`` per tensor. Both cast to the cache's dtype and write in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .paged_torch import check_store_kv_inputs


@triton.jit
def _store_kv(
    K, V, K_cache, V_cache, slot_mapping,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    kv_heads, head_dim,
    BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0)
    slot = tl.load(slot_mapping + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < kv_heads) & (offs_d[None, :] < head_dim)
    src = token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    dst = block * stride_kcb + offset * stride_kcs + offs_h[:, None] * stride_kch + offs_d[None, :]
    tl.store(K_cache + dst, tl.load(K + src, mask=mask), mask=mask)
    src = token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    dst = block * stride_vcb + offset * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :]
    tl.store(V_cache + dst, tl.load(V + src, mask=mask), mask=mask)


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """bf16 seen as int16 on CPU: the interpreter's numpy has no bfloat16, and a copy needs only the bits."""
    return t.view(torch.int16) if t.device.type != "cuda" and t.dtype == torch.bfloat16 else t


def store_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Triton: ``k_cache`` row ``slot_mapping[t]``
    (flattened over blocks) = ``k[t]``, same for v (module doc).

    Tokens with a negative slot are skipped. The caches need stride 1 in their last dim (as allocated).
    """
    check_store_kv_inputs(k, v, k_cache, v_cache, slot_mapping)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must be contiguous in their last dim (head_dim)")
    if k.shape[0] == 0:
        return
    k, v = (t.to(k_cache.dtype) for t in (k, v))
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    k, v, k_bits, v_bits = (_as_bits(t) for t in (k, v, k_cache, v_cache))
    kv_heads, head_dim = k.shape[1], k.shape[2]
    _store_kv[(k.shape[0],)](
        k, v, k_bits, v_bits, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *k_bits.stride()[:3], *v_bits.stride()[:3],
        kv_heads, head_dim,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=triton.next_power_of_2(kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim), num_warps=1 if kv_heads * head_dim <= 512 else 4,
    )  # fmt: skip
