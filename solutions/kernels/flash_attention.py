"""FlashAttention-2 forward in Triton: tiled attention with an online softmax, never storing the N x N scores.

Semantics match ``kernels.attention.gqa_attention``: q ``[B, Hq, Lq, D]``, k/v ``[B, Hkv, Lk, D]``, query
head ``h`` reads K/V head ``h // (Hq // Hkv)``, causal aligned bottom-right (query ``i`` sees keys
``j <= i + Lk - Lq``). One program owns ``BLOCK_M`` query rows of one (sequence, query head) and loops over
key blocks, keeping per row the running max ``m``, the running sum ``l`` (relative to ``m``) and the
unnormalised output ``acc``, all in float32. Scores are kept in base 2 (scaled by log2 e) so ``exp2`` is used.

The varlen form packs sequences along one token axis: q ``[Tq, Hq, D]``, k/v ``[Tk, Hkv, D]``, with
``cu_seqlens_q``/``cu_seqlens_k`` ``[B + 1]`` int32 offsets; sequence ``b`` owns rows
``cu[b]:cu[b + 1]``.

Every ``tl.dot`` goes through ``_dot``, which keeps float32 inputs in IEEE float32: a GPU's default rounds
them to TF32 (10 mantissa bits), enough to flip a greedy token against a float32 reference. On CUDA the tile
sizes, warps and pipeline stages are autotuned per head dim and shape (``kernels/tuning.py``); the interpreter
runs small fixed tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention import check_attention_inputs
from .blocks import cdiv
from .tuning import TunedKernel, pow2_bucket

LOG2_E = 1.4426950408889634


def online_softmax_update(
    m: torch.Tensor, denom: torch.Tensor, acc: torch.Tensor, s: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One key block of the online softmax, in plain torch (natural-log scores).

    Invariant on entry and exit: ``acc / denom[:, None]`` is softmax attention over the keys seen so far, with
    ``denom = sum exp(s - m)`` and ``m`` the row max so far.
    ``s`` ``[M, N]`` are this block's scores, ``v`` ``[N, D]``.
    """
    # BEGIN SOLUTION Lab 1: fold this block into the running max m, sum denom and output acc
    #  (what came before needs rescaling)
    # HINT: The new max is m' = max(m, rowmax(s)). denom and acc were sums of exp(score - m): multiply them by
    #  exp(m - m') to make them relative to m', then add this block's exp(s - m') summed, and exp(s - m') @ v.
    # HINT: A row whose keys so far are all masked has m' = -inf, and exp(-inf - (-inf)) is NaN: where m' is
    #  -inf, subtract 0 instead (torch.where); the row's exp terms are then all 0, as they should be.
    # HINT: The rescale factor uses the old max against the guarded new one: exp(m - m_safe). For a row that
    #  saw no key yet (m = -inf) it is 0, and denom and acc are 0 there anyway, so nothing breaks.
    m_new = torch.maximum(m, s.amax(dim=1))
    # A row that has seen only masked keys keeps m = -inf; subtracting 0 instead avoids inf - inf = nan.
    m_safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - m_safe)
    p = torch.exp(s - m_safe[:, None])
    return m_new, denom * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ v
    # END SOLUTION


@triton.jit
def _dot(a, b):
    """``a @ b`` on tensor cores, accumulated in float32; float32 inputs stay IEEE float32 (not TF32)."""
    return tl.dot(a, b, input_precision="ieee" if a.dtype == tl.float32 else "tf32")


@triton.jit
def _online_softmax_step(m_i, l_i, acc, s, v):
    """The kernel's copy of ``online_softmax_update`` on base-2 scores ``s`` [BLOCK_M, BLOCK_N]."""
    # BEGIN SOLUTION Lab 1: online_softmax_update again, in Triton, on base-2 scores
    # HINT: tl.maximum, tl.max(s, 1), tl.math.exp2, tl.sum(p, 1) and tl.where give the same update;
    #  keep the -inf guard.
    # HINT: p @ v is _dot(p.to(v.dtype), v) (this file's tl.dot, exact in float32): both operands in one
    #  dtype, and acc stays float32.
    # HINT: exp2, not exp: the scores already carry the factor log2(e) (qk_scale), so exp2(s - m) equals
    #  exp of the unscaled difference. The guard: tl.where(m_new == float("-inf"), 0.0, m_new).
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v)
    return m_new, l_i, acc
    # END SOLUTION


@triton.jit
def _flash_fwd(
    Q, K, V, Out, LSE,
    cu_q, cu_k,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    q_len, k_len, q_heads, group, qk_scale,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, STORE_LSE: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // q_heads
    h = bh % q_heads
    kv_h = h // group
    if VARLEN:
        # Packed rows: every sequence sits at batch 0 with its own row offset and lengths.
        q_start = tl.load(cu_q + b)
        k_start = tl.load(cu_k + b)
        q_len = tl.load(cu_q + b + 1) - q_start
        k_len = tl.load(cu_k + b + 1) - k_start
        q_base = Q + q_start * stride_qm + h * stride_qh
        k_base = K + k_start * stride_kn + kv_h * stride_kh
        v_base = V + k_start * stride_vn + kv_h * stride_vh
        o_base = Out + q_start * stride_om + h * stride_oh
        lse_base = LSE + q_start * q_heads + h
        lse_stride = q_heads
    else:
        q_base = Q + b * stride_qb + h * stride_qh
        k_base = K + b * stride_kb + kv_h * stride_kh
        v_base = V + b * stride_vb + kv_h * stride_vh
        o_base = Out + b * stride_ob + h * stride_oh
        lse_base = LSE + bh * q_len
        lse_stride = 1
    if start_m * BLOCK_M >= q_len:
        return
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_base + offs_m[:, None] * stride_qm + offs_d[None, :], mask=offs_m[:, None] < q_len, other=0.0
    )

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # Bottom-right causal: row i sees keys j <= i + shift; key blocks past the block's last row are skipped.
    shift = k_len - q_len
    hi = k_len
    if CAUSAL:
        hi = tl.minimum(k_len, (start_m + 1) * BLOCK_M + shift)
    # BEGIN SOLUTION Lab 1: loop over key blocks up to hi:
    #  load a K and a V tile, score, mask, update (m_i, l_i, acc)
    # HINT: for start_n in range(0, hi, BLOCK_N): the block's key rows are cols = start_n + offs_n;
    #  load tiles like q (k_base + cols[:, None] * stride_kn + offs_d[None, :]) with
    #  mask=cols[:, None] < k_len, other=0.0.
    # HINT: s = _dot(q, tl.trans(k)) * qk_scale (_dot: tl.dot, exact in float32); a key is visible if
    #  cols < k_len and, when CAUSAL, cols <= offs_m + shift; s = tl.where(visible, s, float('-inf')), then
    #  m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, v).
    # HINT: The causal test is a [BLOCK_M, BLOCK_N] grid: key columns along the second axis, query rows along
    #  the first, cols[None, :] <= offs_m[:, None] + shift. The loads' mask has the other orientation
    #  (cols[:, None]), because a K tile's keys are its rows.
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(
            k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < k_len, other=0.0
        )
        v = tl.load(
            v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < k_len, other=0.0
        )
        s = _dot(q, tl.trans(k)) * qk_scale
        visible = cols[None, :] < k_len
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + shift)
        s = tl.where(visible, s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, v)
    # END SOLUTION

    # Rows that see no key at all (causal with Lq > Lk) output 0, as a fully masked softmax row has no mass.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(
        o_base + offs_m[:, None] * stride_om + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=offs_m[:, None] < q_len,
    )
    if STORE_LSE:
        # Natural-log LSE: m and l are in base 2.
        lse = (m_i + tl.math.log2(l_safe)) / 1.4426950408889634
        tl.store(lse_base + offs_m * lse_stride, lse, mask=offs_m < q_len)


# (BLOCK_M, BLOCK_N, num_warps, num_stages) tried on CUDA, for the FlashAttention kernel here and the varlen
# paged prefill kernel (``paged_attention.py``). 128 x 64 with 4 warps / 3 stages (D 64) and 8 warps / 2
# stages (D 128) were the fixed choice before autotuning; the smallest fits float32 at D 128.
PREFILL_TILES = [
    (128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2)
]  # fmt: skip
PREFILL_CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps, num_stages=stages)
    for m, n, warps, stages in PREFILL_TILES
]
# The interpreter costs the same per tile step whatever the tile's size; 16 x 16 keeps the tests' tiles many.
INTERPRETER_PREFILL = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_warps=1, num_stages=1)


def fitting_prefill_configs(configs: list[triton.Config], head_dim: int) -> list[triton.Config]:
    """Drop tiles that cannot run well at this head dim: pipelined K/V (2-byte elements) and Q past ~200 KB of
    shared memory fail to launch, and more than 64 float32 accumulator values a thread spill registers
    (compiled for sm_90, 128 x 64 tiles at D 128 with 4 warps do)."""

    def shared_bytes(c: triton.Config) -> int:
        return (c.num_stages * 2 * c.kwargs["BLOCK_N"] + c.kwargs["BLOCK_M"]) * head_dim * 2

    def accumulators_per_thread(c: triton.Config) -> int:
        return c.kwargs["BLOCK_M"] * head_dim // (32 * c.num_warps)

    return [c for c in configs if shared_bytes(c) <= 200 * 1024 and accumulators_per_thread(c) <= 64]


_flash_fwd_tuned = TunedKernel(
    _flash_fwd,
    PREFILL_CONFIGS,
    key=["HEAD_DIM", "CAUSAL", "VARLEN", "STORE_LSE", "q_len", "k_len"],
    interpreter_config=INTERPRETER_PREFILL,
    warm_up_hint="call flash_attention once with these shapes before capturing",
    prune=fitting_prefill_configs,
)


def _interpretable(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Stride-1 last dims; on CPU, bf16 inputs go in as float32,
    as the interpreter's numpy has no bfloat16."""
    dtype = torch.float32 if tensors[0].device.type != "cuda" and tensors[0].dtype == torch.bfloat16 else None
    tensors = tuple(t if dtype is None else t.to(dtype) for t in tensors)
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


HEAD_DIMS = (16, 32, 64, 128)  # a head is one tile wide: a power of two, and 16 at least (a tl.dot's K)


def _check_head_dim(head_dim: int) -> None:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim must be one of {', '.join(map(str, HEAD_DIMS))}; got {head_dim}")


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    sm_scale: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * sm_scale + mask) v for q ``[B, Hq, Lq, D]``, k/v ``[B, Hkv, Lk, D]`` (see module doc).

    Returns the output (q's dtype and shape) and, with ``return_lse``, the float32 log-sum-exp ``[B, Hq, Lq]``
    of each row's scaled scores (``-inf`` for rows that see no key).
    """
    check_attention_inputs(q, k, v)
    _check_head_dim(q.shape[-1])
    batch, q_heads, q_len, head_dim = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    in_dtype = q.dtype
    q, k, v = _interpretable(q, k, v)
    out = torch.empty_like(q)
    lse = torch.empty((batch, q_heads, q_len), device=q.device, dtype=torch.float32)
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    _flash_fwd_tuned(
        lambda meta: (cdiv(q_len, meta["BLOCK_M"]), batch * q_heads),
        q, k, v, out, lse,
        q, q,  # cu_seqlens unused when VARLEN is off
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        q_len, k_len, q_heads, q_heads // kv_heads, scale * LOG2_E,
        CAUSAL=causal, VARLEN=False, STORE_LSE=return_lse, HEAD_DIM=head_dim,
    )  # fmt: skip
    out = out.to(in_dtype)
    return (out, lse) if return_lse else out


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    *,
    causal: bool,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Attention over packed sequences: q ``[Tq, Hq, D]``, k/v ``[Tk, Hkv, D]``,
    offsets ``[B + 1]`` (module doc).

    Each sequence attends only to its own keys; causal alignment is bottom-right per sequence.
    ``max_seqlen_q`` sizes the grid (the longest query run).
    """
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"varlen q, k, v must be 3-D [T, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    check_attention_inputs(
        q.unsqueeze(0).transpose(1, 2), k.unsqueeze(0).transpose(1, 2), v.unsqueeze(0).transpose(1, 2)
    )
    _check_head_dim(q.shape[-1])
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.dim() != 1:
        raise ValueError(
            f"cu_seqlens_q {tuple(cu_seqlens_q.shape)} and cu_seqlens_k "
            f"{tuple(cu_seqlens_k.shape)} must be [B + 1]"
        )
    q_heads, head_dim = q.shape[1], q.shape[2]
    batch = cu_seqlens_q.numel() - 1
    in_dtype = q.dtype
    q, k, v = _interpretable(q, k, v)
    cu_q, cu_k = (c.to(device=q.device, dtype=torch.int32) for c in (cu_seqlens_q, cu_seqlens_k))
    out = torch.empty_like(q)
    scale = head_dim**-0.5 if sm_scale is None else sm_scale
    # With VARLEN the kernel reads each sequence's lengths from the offsets: q_len is only the tuning key.
    tune_len = pow2_bucket(max_seqlen_q, 16, 1 << 16)
    _flash_fwd_tuned(
        lambda meta: (max(1, cdiv(max_seqlen_q, meta["BLOCK_M"])), batch * q_heads),
        q, k, v, out, out,  # LSE unused when STORE_LSE is off
        cu_q, cu_k,
        0, q.stride(1), q.stride(0), 0, k.stride(1), k.stride(0), 0, v.stride(1), v.stride(0),
        0, out.stride(1), out.stride(0),
        tune_len, 0, q_heads, q_heads // k.shape[1], scale * LOG2_E,
        CAUSAL=causal, VARLEN=True, STORE_LSE=False, HEAD_DIM=head_dim,
    )  # fmt: skip
    return out.to(in_dtype)


def flops(batch: int, heads: int, q_len: int, k_len: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs, 4 * B * H * Lq * Lk * D (two matmuls), halved when causal."""
    total = 4.0 * batch * heads * q_len * k_len * head_dim
    return total / 2 if causal else total
