"""W4A16: ``y = x W^T`` with ``W`` packed as INT4 codes, dequantized inside the matrix product (Triton).

Weight format (``quant.pack``, ``quant.rtn``)::

    qweight  int32   [N, K/8]   code of W[n, k] = (qweight[n, k // 8] >> 4 * (k % 8)) & 0xF
    scales   float16 [N, K/g]   W[n, k] = (code - zeros[n, k // g]) * scales[n, k // g]
    zeros    uint8   [N, K/g]

Two shapes of the same computation:

- ``_w4a16_gemm_kernel`` (prefill, many rows): tiles ``[BLOCK_M, BLOCK_N]`` of ``y``; each step of
  the K loop loads a ``[BLOCK_N, BLOCK_K]`` tile of codes, dequantizes it in registers and feeds
  ``tl.dot``. The weight never exists in float in global memory.
- ``_w4a16_gemv_kernel`` (decode, a few rows): one program per ``BLOCK_N`` outputs and row, no
  ``tl.dot`` (a 1-row product cannot fill a tensor core); weight bytes dominate, and each is read once.

On CPU the same kernels run under ``TRITON_INTERPRET=1`` for tests; the engine's CPU path uses
torch's own int4 kernel instead (``quant.linear``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GEMV_MAX_ROWS = 4  # up to this many rows, re-reading the weight per row costs less than a tile that is mostly empty


@triton.jit
def _dequantize(
    qweight_ptr, scales_ptr, zeros_ptr, offs_n, k0, N, K,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Float32 ``W[offs_n, k0 : k0 + BLOCK_K]`` ``[BLOCK_N, BLOCK_K]``; out-of-range entries are 0.

    Each int32 word is loaded once and split into its eight codes by broadcasting shifts; the
    row-major reshape ``[BLOCK_N, BLOCK_K/8, 8] -> [BLOCK_N, BLOCK_K]`` puts code i of word j at k = 8j + i.
    """
    offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    word_mask = (offs_n[:, None] < N) & (offs_w[None, :] < K // 8)
    words = tl.load(qweight_ptr + offs_n[:, None] * (K // 8) + offs_w[None, :], mask=word_mask, other=0)
    codes = (words[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF
    codes = tl.reshape(codes, (BLOCK_N, BLOCK_K))
    offs_k = k0 + tl.arange(0, BLOCK_K)
    mask = (offs_n[:, None] < N) & (offs_k[None, :] < K)
    group = offs_n[:, None] * (K // GROUP) + offs_k[None, :] // GROUP  # one load per group, served from cache
    scales = tl.load(scales_ptr + group, mask=mask, other=0.0).to(tl.float32)
    zeros = tl.load(zeros_ptr + group, mask=mask, other=0).to(tl.float32)
    return (codes.to(tl.float32) - zeros) * scales


@triton.jit
def _w4a16_gemm_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K, stride_xm, stride_om,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x_mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=x_mask, other=0.0)
        w = _dequantize(qweight_ptr, scales_ptr, zeros_ptr, offs_n, k0, N, K, GROUP, BLOCK_N, BLOCK_K)
        acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _w4a16_gemv_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, N, K, stride_xm, stride_om,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(1)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + row * stride_xm + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        w = _dequantize(qweight_ptr, scales_ptr, zeros_ptr, offs_n, k0, N, K, GROUP, BLOCK_N, BLOCK_K)
        acc += tl.sum(w * x[None, :], axis=1)
    tl.store(out_ptr + row * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=offs_n < N)


def check_w4a16_inputs(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
):
    """Raise a ValueError naming the problem if the operands do not form one W4A16 product."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    n, k = qweight.shape[0], qweight.shape[1] * 8
    if qweight.dtype != torch.int32:
        raise ValueError(f"qweight must be int32 (eight codes per word), got {qweight.dtype}")
    if x.shape[1] != k:
        raise ValueError(f"x has {x.shape[1]} features but qweight packs {k} ({qweight.shape[1]} words x 8)")
    if k % group_size:
        raise ValueError(f"group_size {group_size} does not divide in_features {k}")
    if scales.shape != (n, k // group_size) or zeros.shape != scales.shape:
        raise ValueError(
            f"scales and zeros must be [{n}, {k // group_size}]; got {tuple(scales.shape)}, {tuple(zeros.shape)}"
        )


def awq_gemm(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``x`` ``[M, K]`` times the dequantized weight transposed: ``[M, N]`` in ``x``'s dtype."""
    check_w4a16_inputs(x, qweight, scales, zeros, group_size)
    x = x.contiguous()
    (m, k), n = x.shape, qweight.shape[0]
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    args = (qweight.contiguous(), scales.contiguous(), zeros.contiguous(), out)
    if m <= GEMV_MAX_ROWS:
        block_n, block_k = 64, 128
        grid = (triton.cdiv(n, block_n), m)
        _w4a16_gemv_kernel[grid](x, *args, n, k, x.stride(0), out.stride(0), group_size, block_n, block_k)
    else:
        block_m, block_n, block_k = 32, 64, 64
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
        _w4a16_gemm_kernel[grid](x, *args, m, n, k, x.stride(0), out.stride(0), group_size, block_m, block_n, block_k)
    return out
