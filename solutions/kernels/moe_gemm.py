"""The experts of a MoE layer as grouped GEMMs (Triton, the fused-MoE pattern), a torch path, and references.

Each token runs through its ``k`` chosen experts' SwiGLU FFN and mixes their outputs::

    y[t] = sum_j  weights[t, j] * W2[e] (silu(W1[e] x[t]) * W3[e] x[t])      e = experts[t, j]

Weights are stacked by expert: ``w13`` ``[E, 2I, H]`` (gate rows, then up rows) and ``w2`` ``[E, H, I]``.

The Triton path (vLLM's ``fused_moe`` shape) first permutes the ``T * k`` assignments so each expert's
rows are contiguous and padded to ``BLOCK_M`` (``moe_permute``). Each row block is one (expert, m-tile)
pair; one launch computes every pair's tiles at once: a program reads which expert owns its row block,
gathers those ``BLOCK_M`` token rows of ``x`` by index (no permuted copy of ``x`` is ever written), and
multiplies them by that expert's ``[BLOCK_K, BLOCK_N]`` weight tiles::

    sorted_ids  [a3 a0 a5 P | a1 a2 P P | a4 P P P]      block_experts [0 | 1 | 3]
                 ---------   ---------   ---------
                  expert 0    expert 1    expert 3         (expert 2 got no token: no block, no work)

Two launches make a layer. The first computes the gate and up tiles of the same columns side by side and
writes ``silu(gate) * up`` (``[T * k, I]``, from the float32 accumulators): the ``[T * k, 2I]`` gate/up
product is never written. The second multiplies each row by its routing weight and writes it back in
assignment order, so the sum over ``k`` is a reshape and a ``sum``. Programs run in groups of
``GROUP_SIZE_M`` row blocks per column tile (the Triton matmul tutorial's L2 ordering), so a weight tile
is read from memory once for several row blocks of its expert. On CUDA the tile shapes are autotuned per
(``BLOCK_M``, N, K, gating, dtype): a shape's first call times the candidates, so run it once eagerly
before capturing a CUDA graph (every later call is graph-safe: the grid comes from host integers only).
``FASTMODE_AUTOTUNE=0`` runs the first candidate untimed instead (a correctness run compiles one variant
per launch). ``python -m solutions bench moe`` times the kernel against the per-expert loop and a dense FFN.

The torch path (CPU) does the same permutation and runs one dense matmul per non-empty expert on its
contiguous slice: a loop over experts, never over tokens.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .blocks import cdiv
from .moe_permute import Permutation, permute
from .tuning import autotunes_on, quick_bench


@triton.jit(do_not_specialize=["num_assignments", "num_blocks"])  # one binary whatever the batch size
def _grouped_gemm_kernel(
    a_ptr, w_ptr, out_ptr, sorted_ids_ptr, block_experts_ptr, row_scale_ptr,
    N, K, num_assignments, num_blocks, stride_am, stride_we, stride_wn, stride_wk, stride_om,
    TOP_K: tl.constexpr, GATED: tl.constexpr, SCALE_ROWS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
):  # fmt: skip
    """``out[a] = a_row(a) @ w[expert]^T`` for the assignments ``a`` of one row block, one ``BLOCK_N`` slice.

    ``a_row(a)`` is row ``a // TOP_K`` of ``a``: with ``TOP_K = k`` the token's hidden state (first GEMM),
    with ``TOP_K = 1`` the assignment's own intermediate row (second GEMM). ``GATED``: ``w`` holds ``2N``
    rows (gate, then up) and ``out[a] = silu(gate) * up`` for output columns ``n < N``. Padding rows
    (``id >= num_assignments``) read row 0 and are never stored.
    """
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # L2 ordering: GROUP_SIZE_M row blocks take turns on one column tile before the next column tile.
    blocks_per_group = GROUP_SIZE_M * num_pid_n
    first_block = (pid // blocks_per_group) * GROUP_SIZE_M
    group_rows = min(num_blocks - first_block, GROUP_SIZE_M)
    pid_m = first_block + (pid % blocks_per_group) % group_rows
    pid_n = (pid % blocks_per_group) // group_rows

    expert = tl.load(block_experts_ptr + pid_m).to(tl.int64)
    if expert < 0:  # a tail block of padding only
        return
    ids = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = ids < num_assignments
    rows = tl.where(valid, ids // TOP_K, 0)  # padding reads row 0, so the loads need no row mask
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    # Columns past N wrap onto valid ones (never stored): loads need only the K mask.
    w_ptrs = w_ptr + expert * stride_we + (offs_n % N)[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GATED:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        if GATED:
            w_up = tl.load(w_ptrs + N * stride_wn, mask=k_mask[:, None], other=0.0)
            acc_up = tl.dot(a, w_up, acc_up, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * stride_wk
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    if SCALE_ROWS:
        acc *= tl.load(row_scale_ptr + ids, mask=valid, other=0.0).to(tl.float32)[:, None]
    out_mask = valid[:, None] & (offs_n[None, :] < N)
    out_ptrs = out_ptr + ids[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)


# CUDA candidates (BLOCK_N, BLOCK_K, num_warps, num_stages) per BLOCK_M, after vLLM's tuned fused-MoE
# tables for H100: small row blocks are weight-bandwidth-bound (long K tiles, deep pipelines), large ones
# compute-bound (wide N tiles, 8 warps). A gated launch holds two accumulators, so its N tile is halved.
_CUDA_CANDIDATES = {
    16: [(64, 128, 4, 4), (128, 128, 4, 3), (64, 256, 8, 4)],
    32: [(64, 128, 4, 4), (128, 128, 8, 3), (64, 256, 8, 4)],
    64: [(128, 64, 4, 4), (128, 128, 8, 3), (256, 64, 8, 4)],
    128: [(128, 64, 8, 4), (256, 64, 8, 3), (128, 128, 8, 3)],
}
SHARED_MEMORY_BYTES = 227 * 1024  # per block on sm_90 (H100 / H200)
INTERPRETER_TILES = {"BLOCK_N": 32, "BLOCK_K": 32, "GROUP_SIZE_M": 2}  # small tl.dot tiles, and a swizzle


def _candidates(block_m: int, gated: bool) -> set[tuple[int, int, int, int]]:
    return {(n // 2 if gated else n, k, warps, stages) for n, k, warps, stages in _CUDA_CANDIDATES[block_m]}


def _prune_configs(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The candidates of this launch's ``BLOCK_M`` and gating whose pipeline fits in shared memory (if none
    does, the smallest with fewer stages). Float32 operands multiply in IEEE float32, emulated on CUDA cores:
    only the smallest candidate is worth compiling."""
    block_m, gated = kwargs["BLOCK_M"], kwargs["GATED"]
    element_size = named_args["a_ptr"].element_size()
    wanted = _candidates(block_m, gated)

    def stage_bytes(c: triton.Config) -> int:
        n, k = c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
        return (block_m * k + (2 if gated else 1) * k * n) * element_size

    shape = lambda c: (c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages)  # noqa: E731
    kept = [c for c in configs if shape(c) in wanted]
    fitting = [c for c in kept if c.num_stages * stage_bytes(c) <= SHARED_MEMORY_BYTES]
    if not fitting or element_size == 4:
        smallest = min(fitting or kept, key=stage_bytes)
        stages = min(smallest.num_stages, max(1, SHARED_MEMORY_BYTES // stage_bytes(smallest)))
        return [triton.Config(smallest.kwargs, num_warps=smallest.num_warps, num_stages=stages)]
    return fitting


_grouped_gemm_autotuned = triton.autotune(
    configs=[
        triton.Config({"BLOCK_N": n, "BLOCK_K": k, "GROUP_SIZE_M": 8}, num_warps=warps, num_stages=stages)
        for n, k, warps, stages in sorted(
            {c for m in _CUDA_CANDIDATES for g in (False, True) for c in _candidates(m, g)}
        )
    ],
    key=["N", "K", "BLOCK_M", "GATED"],
    prune_configs_by={"early_config_prune": _prune_configs},
    do_bench=quick_bench,
)(_grouped_gemm_kernel)


_TUNED_LAUNCHES: set[tuple] = set()  # (N, K, BLOCK_M, gated, dtype) already timed


def _refuse_tuning_in_a_graph(launch: tuple) -> None:
    """A CUDA graph cannot record a tuning run (it synchronises): name the launch to warm up instead."""
    if launch in _TUNED_LAUNCHES:
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"the grouped MoE kernel was never autotuned for (N, K, BLOCK_M, gated, dtype) = {launch} and a "
            "CUDA graph is being captured: run the layer once eagerly with that batch size before the capture"
        )


def block_m_for(num_assignments: int, num_experts: int) -> int:
    """The row block (and permutation padding) for a batch: 16 rows when experts get a few rows each
    (decode: the weights are the cost, padding is free), up to 128 when they get hundreds (prefill:
    tensor-core tiles). Host integers only, so the choice is the same at capture and at replay."""
    rows_per_expert = num_assignments / num_experts
    for block_m, most_rows in ((16, 16), (32, 32), (64, 96)):
        if rows_per_expert <= most_rows:
            return block_m
    return 128


def grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    perm: Permutation,
    top_k: int,
    gated: bool = False,
    row_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[a.shape[0] * top_k, N]``: row ``i`` is ``a[i // top_k] @ w[e]^T`` (times ``row_scale[i]``), ``e``
    its expert in ``perm``. ``gated``: ``w`` ``[E, 2N, K]`` holds gate rows then up rows, and row ``i`` is
    ``silu(gate_i) * up_i``. ``row_scale`` is read in assignment order (a contiguous ``[T, k]`` works)."""
    num_experts, n, k = w.shape
    if a.shape[1] != k:
        raise ValueError(f"a has {a.shape[1]} features but the expert weights take {k}")
    if perm.sorted_ids.numel() != perm.block * perm.block_experts.numel():
        raise ValueError(f"the permutation's sorted_ids are not whole blocks of {perm.block} rows")
    if perm.block < 16:
        raise ValueError(f"the kernel's row block is 16 rows or more (a tl.dot tile), not {perm.block}")
    if gated and n % 2:
        raise ValueError(f"a gated launch needs as many up rows as gate rows; w has {n} rows per expert")
    if a.device.type != "cuda" and a.dtype == torch.bfloat16:
        # The Triton interpreter's tl.dot multiplies bfloat16 tiles as their raw 16-bit patterns: use float32.
        scale = None if row_scale is None else row_scale.float()
        return grouped_gemm(a.float(), w.float(), perm, top_k, gated, scale).to(a.dtype)
    num_assignments = a.shape[0] * top_k
    n_out = n // 2 if gated else n
    if row_scale is not None and row_scale.numel() != num_assignments:
        raise ValueError(f"row_scale has {row_scale.numel()} entries for {num_assignments} assignments")
    out = torch.empty(num_assignments, n_out, device=a.device, dtype=a.dtype)
    scale = row_scale.contiguous() if row_scale is not None else out  # never read when SCALE_ROWS is False
    num_blocks = perm.block_experts.numel()
    args = (
        a, w, out, perm.sorted_ids, perm.block_experts, scale,
        n_out, k, num_assignments, num_blocks, a.stride(0), w.stride(0), w.stride(1), w.stride(2),
        out.stride(0),
    )  # fmt: skip
    meta = dict(
        TOP_K=top_k, GATED=gated, SCALE_ROWS=row_scale is not None,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32", BLOCK_M=perm.block,
    )  # fmt: skip
    grid = lambda cfg: (num_blocks * cdiv(n_out, cfg["BLOCK_N"]),)  # noqa: E731
    if not autotunes_on(a.device):  # the interpreter: one fixed small tile
        _grouped_gemm_kernel[grid(INTERPRETER_TILES)](*args, **meta, **INTERPRETER_TILES)
    elif os.environ.get("FASTMODE_AUTOTUNE", "1") == "0":  # correctness runs: the first candidate, untimed
        config = _prune_configs(_grouped_gemm_autotuned.configs, {"a_ptr": a}, **meta)[0]
        _grouped_gemm_kernel[grid(config.kwargs)](*args, **meta, **config.all_kwargs())
    else:
        launch = (n_out, k, perm.block, gated, a.dtype)
        _refuse_tuning_in_a_graph(launch)
        _grouped_gemm_autotuned[grid](*args, **meta)
        _TUNED_LAUNCHES.add(launch)
    return out


def check_moe_inputs(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    check_ids: bool,
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
        raise ValueError(
            f"x [T, {x.shape[1]}], w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit together"
        )
    if experts.shape != weights.shape or experts.shape[0] != x.shape[0]:
        raise ValueError(
            f"experts {tuple(experts.shape)} and weights {tuple(weights.shape)} must both be [T, k]"
        )
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
    """The MoE layer on the grouped Triton kernel: permute, gate/up GEMM with SwiGLU, down GEMM weighted, sum.

    With ``check_ids=False`` nothing reads a device value on the host, so the call can be captured in a
    CUDA graph (after one eager call per shape has autotuned the kernel)."""
    check_moe_inputs(x, w13, w2, weights, experts, check_ids)
    tokens, top_k = experts.shape
    num_experts = w13.shape[0]
    block_m = block_m_for(tokens * top_k, num_experts) if x.device.type == "cuda" else 16
    perm = permute(experts, num_experts, block_m)
    hidden = grouped_gemm(x.contiguous(), w13, perm, top_k, gated=True)
    out = grouped_gemm(hidden, w2, perm, 1, row_scale=weights)
    return out if top_k == 1 else out.view(tokens, top_k, -1).sum(dim=1)


def fused_moe_torch(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
) -> torch.Tensor:
    """The MoE layer in torch: rows sorted by expert, one matmul per non-empty expert on
    its slice, scatter-add back."""
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
    runs the kernel through the interpreter, as ``import solutions`` chooses on a machine without a GPU)."""
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
    """The baseline the kernel must beat (Hugging Face Mixtral's loop):
    per expert, find its tokens, run, add back."""
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
