"""The experts of a MoE layer as grouped GEMMs (Triton, the fused-MoE pattern), a torch path, and references.

Each token runs through its ``k`` chosen experts' SwiGLU FFN and mixes their outputs::

    y[t] = sum_j  weights[t, j] * W2[e] (silu(W1[e] x[t]) * W3[e] x[t])      e = experts[t, j]

Weights are stacked by expert: ``w13`` ``[E, 2I, H]`` (gate rows, then up rows) and ``w2`` ``[E, H, I]``.

The Triton path (vLLM's ``fused_moe`` shape) first permutes the ``T * k`` assignments so each expert's
rows are contiguous and padded to ``BLOCK_M`` (``moe_permute``). One launch then computes every
expert's tiles at once: program ``(m, n)`` reads which expert owns row block ``m``, gathers those
``BLOCK_M`` token rows of ``x`` by index (no permuted copy of ``x`` is ever written), and multiplies
them by that expert's ``[BLOCK_K, BLOCK_N]`` weight tiles::

    sorted_ids  [a3 a0 a5 P | a1 a2 P P | a4 P P P]      block_experts [0 | 1 | 3]
                 ---------   ---------   ---------
                  expert 0    expert 1    expert 3         (expert 2 got no token: no block, no work)

The second GEMM multiplies each row by its routing weight and writes it back in assignment order, so
the sum over ``k`` is a reshape and a ``sum``. The torch path (CPU) does the same permutation and runs
one dense matmul per non-empty expert on its contiguous slice: a loop over experts, never over tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .moe_permute import permute


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, w_ptr, out_ptr, sorted_ids_ptr, block_experts_ptr, row_scale_ptr,
    N, K, num_assignments, stride_am, stride_we, stride_wn, stride_wk, stride_om,
    TOP_K: tl.constexpr, SCALE_ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``out[a] = a_row(a) @ w[expert]^T`` for the assignments ``a`` of one row block, one ``BLOCK_N`` slice.

    ``a_row(a)`` is row ``a // TOP_K`` of ``a``: with ``TOP_K = k`` the token's hidden state (first GEMM),
    with ``TOP_K = 1`` the assignment's own intermediate row (second GEMM). Padding rows
    (``id >= num_assignments``) are masked on load and store.
    """
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_experts_ptr + pid_m)
    if expert < 0:  # a tail block of padding only
        return
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = ids < num_assignments
    rows = ids // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a_mask = valid[:, None] & (offs_k[None, :] < K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + offs_k[None, :], mask=a_mask, other=0.0)
        w_mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
        w = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk, mask=w_mask, other=0.0)
        acc += tl.dot(a, w)
    if SCALE_ROWS:
        acc *= tl.load(row_scale_ptr + ids, mask=valid, other=0.0).to(tl.float32)[:, None]
    out_mask = valid[:, None] & (offs_n[None, :] < N)
    tl.store(out_ptr + ids[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def _block_sizes(device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K): tensor-core tiles on CUDA, the smallest ``tl.dot`` tiles in the interpreter."""
    return (64, 128, 64) if device.type == "cuda" else (16, 32, 32)


def grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_ids: torch.Tensor,
    block_experts: torch.Tensor,
    num_assignments: int,
    top_k: int,
    block: tuple[int, int, int],
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[num_assignments, N]``: row ``i`` is ``a[i // top_k] @ w[e]^T`` (times ``row_scale[i]``), e its expert."""
    block_m, block_n, block_k = block
    num_experts, n, k = w.shape
    if a.shape[1] != k:
        raise ValueError(f"a has {a.shape[1]} features but the expert weights take {k}")
    if sorted_ids.numel() != block_m * block_experts.numel():
        raise ValueError(f"the permutation's blocks are not {block_m} rows long (permute with block={block_m})")
    out = torch.empty(num_assignments, n, device=a.device, dtype=a.dtype)
    scale = row_scale if row_scale is not None else out  # never read when SCALE_ROWS is False
    grid = (block_experts.numel(), triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        a, w, out, sorted_ids, block_experts, scale,
        n, k, num_assignments, a.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
        top_k, row_scale is not None, block_m, block_n, block_k,
    )  # fmt: skip
    return out


def check_moe_inputs(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, check_ids: bool
) -> None:
    """Raise a ValueError naming the problem if the operands do not form one MoE layer.

    ``check_ids`` also checks every expert id is in range (a host sync on a GPU: the model's own router,
    whose top-k ids are in range by construction, skips it)."""
    if x.dim() != 2:
        raise ValueError(f"x must be [tokens, hidden], got shape {tuple(x.shape)}")
    if w13.dim() != 3 or w2.dim() != 3 or w13.shape[0] != w2.shape[0]:
        raise ValueError(f"w13 [E, 2I, H] and w2 [E, H, I] disagree: {tuple(w13.shape)}, {tuple(w2.shape)}")
    num_experts, two_i, hidden = w13.shape
    if hidden != x.shape[1] or w2.shape[1:] != (hidden, two_i // 2):
        raise ValueError(f"x [T, {x.shape[1]}], w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit together")
    if experts.shape != weights.shape or experts.shape[0] != x.shape[0]:
        raise ValueError(f"experts {tuple(experts.shape)} and weights {tuple(weights.shape)} must both be [T, k]")
    if check_ids and experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= num_experts):
        raise ValueError(f"expert ids must lie in [0, {num_experts})")


def fused_moe_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    check_ids: bool = True,
) -> torch.Tensor:
    """The MoE layer on the grouped Triton kernel: permute, GEMM (gate/up), SwiGLU, GEMM (down, weighted), sum."""
    check_moe_inputs(x, w13, w2, weights, experts, check_ids)
    tokens, top_k = experts.shape
    block = _block_sizes(x.device)
    perm = permute(experts, w13.shape[0], block[0])
    x = x.contiguous()
    args = (perm.sorted_ids, perm.block_experts, tokens * top_k)
    gate_up = grouped_gemm(x, w13, *args, top_k, block)
    gate, up = gate_up.chunk(2, dim=-1)
    hidden = F.silu(gate) * up
    out = grouped_gemm(hidden, w2, *args, 1, block, row_scale=weights.flatten().to(torch.float32).contiguous())
    return out.view(tokens, top_k, -1).sum(dim=1)


def fused_moe_torch(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
) -> torch.Tensor:
    """The MoE layer in torch: rows sorted by expert, one matmul per non-empty expert on its slice, scatter-add back."""
    tokens, top_k = experts.shape
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()  # one host sync for all experts
    token_of_row = order // top_k
    rows = x[token_of_row]
    out_rows = torch.empty_like(rows)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            gate, up = (rows[start : start + count] @ w13[expert].t()).chunk(2, dim=-1)
            out_rows[start : start + count] = (F.silu(gate) * up) @ w2[expert].t()
            start += count
    out_rows *= weights.flatten()[order].to(x.dtype)[:, None]
    return torch.zeros_like(x).index_add_(0, token_of_row, out_rows)


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    backend: str = "auto",
    check_ids: bool = True,
) -> torch.Tensor:
    """``[T, H]``: the MoE layer on ``backend`` ("auto": Triton on CUDA, torch on CPU; "triton" on CPU
    runs the kernel through the interpreter, ``TRITON_INTERPRET=1`` set before import)."""
    if backend == "auto":
        backend = "triton" if x.device.type == "cuda" else "torch"
    if backend == "triton":
        return fused_moe_triton(x, w13, w2, weights, experts, check_ids)
    if backend != "torch":
        raise ValueError(f"MoE backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    check_moe_inputs(x, w13, w2, weights, experts, check_ids)
    return fused_moe_torch(x, w13, w2, weights, experts)


def moe_per_expert_loop(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
) -> torch.Tensor:
    """The baseline the kernel must beat (Hugging Face Mixtral's loop): per expert, find its tokens, run, add back."""
    out = torch.zeros_like(x)
    for expert in range(w13.shape[0]):
        token, slot = torch.where(experts == expert)
        if token.numel():
            gate, up = (x[token] @ w13[expert].t()).chunk(2, dim=-1)
            y = (F.silu(gate) * up) @ w2[expert].t()
            out.index_add_(0, token, y * weights[token, slot].to(x.dtype)[:, None])
    return out


def reference_moe(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
) -> torch.Tensor:
    """Float64 per-expert loop: the oracle every implementation is graded against."""
    return moe_per_expert_loop(x.double(), w13.double(), w2.double(), weights.double(), experts)
