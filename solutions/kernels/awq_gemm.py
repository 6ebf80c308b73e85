"""W4A16: ``y = x W^T`` with ``W`` packed as INT4 codes, dequantized inside the matrix product (Triton).

Weight format (``quant.pack``, ``quant.rtn``)::

    qweight  int32   [N, K/8]   code of W[n, k] = (qweight[n, k // 8] >> 4 * (k % 8)) & 0xF
    scales   float16 [N, K/g]   W[n, k] = (code - zeros[n, k // g]) * scales[n, k // g]
    zeros    uint8   [N, K/g]   (any strides: the kernels take them as arguments)

Decode reads every weight once per token, so the kernels are built to stream the packed words at memory
speed; the arithmetic per code has to stay a handful of instructions or it, not memory, sets the pace.
Three tricks keep it there:

- **A code read as a float.** A code ``c`` moved to bits 19..22 (the top of the mantissa) of a word whose
  other bits are those of float32 ``16.0`` (``0x41800000``) *is* the float ``16 + c``: one shift and one
  AND-OR, no int-to-float conversion. ``(16 + c) * s - (16 + z) * s = (c - z) * s`` up to float32 rounding
  (a small offset: sums of ``x * (16 + c)`` lose little to the subtraction that follows).
- **Slots instead of a reshape.** Code ``i`` of word ``j`` belongs to ``k = 8j + i``. A tile of words
  ``[BLOCK_N, BLOCK_K/8]`` gives, for each static ``i``, a tile of codes in the same layout as the words;
  the matching columns of ``x`` are ``k = 8j + i``. A dot product does not care about the order of its
  ``k``, so the tile is 8 products over ``BLOCK_K/8`` each, and nothing is ever reshuffled::

        words  [n, j]  ->  slot 0: codes of k = 0, 8, 16, ...   with x[:, 0::8]
                           slot 1: codes of k = 1, 9, 17, ...   with x[:, 1::8]   ... 8 slots

- **Split-K for small matrices.** A 2048 x 2048 weight has too few output tiles to keep every SM
  streaming, so ``SPLIT_K`` programs share each tile's K range and write float32 partial sums
  ``[SPLIT_K, M, N]``; ``_sum_splits_kernel`` adds them in a fixed order (deterministic: greedy
  decoding gives the same tokens every run, unlike atomics).

Kernels: ``_w4a16_gemv_kernel`` for one row (batch-1 decode) on CUDA cores: per word it accumulates
``sum_i x_i (16 + c_i)`` and applies ``s * (part - (16 + z) * sum_i x_i)`` once; ``_w4a16_gemm_kernel``
for two rows or more on tensor cores. With at most 16 rows it computes ``y^T = W x^T`` (``SWAP_AB``): the
MMA's large side (64 rows a warpgroup) holds real weight rows, and only its 16-wide side carries the
padding rows of ``x``. ``python -m solutions bench int4`` measures them against copy bandwidth.

On CUDA both are autotuned per (row bucket, N, K, group): the first call of a shape times the candidates,
so run each shape once eagerly before capturing a CUDA graph; every later call is graph-safe (no host
reads of device values, the grid from host integers only). ``FASTMODE_AUTOTUNE=0`` runs one fixed tile
untimed instead (a correctness run compiles one variant per kernel). Under ``TRITON_INTERPRET=1`` they
run one small fixed tile; the engine's CPU path uses torch's own int4 kernel instead (``quant.linear``).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from .blocks import cdiv
from .tuning import autotunes_on, quick_bench

FLOAT_16_BITS = 0x41800000  # float32 16.0: a code in bits 19..22 beside these bits reads 16 + code


@triton.jit
def _code_slot(words, i: tl.constexpr, float_16_bits):
    """Float32 ``16 + c`` for code slot ``i`` (bits ``4i .. 4i + 3``) of every uint32 word: the code moved
    to bits 19..22."""
    if i < 5:
        moved = words << (19 - 4 * i)
    else:
        moved = words >> (4 * i - 19)
    # float_16_bits is a run-time argument: as a constant, the AND and the OR would compile to two
    # instructions instead of one LOP3
    return ((moved & 0x780000) | float_16_bits).to(tl.float32, bitcast=True)


@triton.jit
def _load_tile(
    qweight_ptr, scales_ptr, zeros_ptr, offs_n, offs_w, K, stride_qn, stride_sn, stride_sg, stride_zn,
    stride_zg, GROUP: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """Words ``[BLOCK_N, BLOCK_K/8]`` (uint32) and each word's group scale and zero (float32, same shape).

    Words past K load as 0 (the matching ``x`` is 0 too); a word never straddles two groups (g % 8 == 0).
    """
    word_mask = (offs_w < K // 8)[None, :] | EVEN_K
    words = tl.load(qweight_ptr + offs_n[:, None] * stride_qn + offs_w[None, :], mask=word_mask, other=0)
    group = (offs_w // (GROUP // 8))[None, :]
    scale = tl.load(scales_ptr + offs_n[:, None] * stride_sn + group * stride_sg, mask=word_mask, other=0.0)
    zero = tl.load(zeros_ptr + offs_n[:, None] * stride_zn + group * stride_zg, mask=word_mask, other=0)
    return words.to(tl.uint32, bitcast=True), scale.to(tl.float32), zero.to(tl.float32)


@triton.jit
def _split_range(K, BLOCK_K: tl.constexpr, SPLIT_K):
    """The K tiles ``[first, last)`` of this program's split (program axis 2); a split may get none."""
    tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(tiles, SPLIT_K)
    first = tl.program_id(2) * per_split
    return first, tl.minimum(first + per_split, tiles)


@triton.jit(do_not_specialize=["SPLIT_K"])  # one binary for every split: autotuning compiles less
def _w4a16_gemv_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, partial_ptr, N, K, stride_xm, stride_qn, stride_sn,
    stride_sg, stride_zn, stride_zg, stride_om, float_16_bits, SPLIT_K,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    """Program ``(row, n, split)``: ``x[row, split's K] @ W[n-tile, split's K]^T``.

    One FFMA per code: ``part[n, j] = sum_i x[8j + i] * (16 + c_i)``; the zero and the scale come in once
    per word, ``acc += s * (part - (16 + z) * sum_i x[8j + i])``; ``STAGES`` tiles of words are in flight.
    With ``SPLIT_K == 1`` the result goes to ``out``, else to ``partial[split]`` ``[M, N]`` float32.
    """
    row, pid_n = tl.program_id(0), tl.program_id(1)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N  # wrapped columns are computed, never stored
    first, last = _split_range(K, BLOCK_K, SPLIT_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
    for tile in tl.range(first, last, num_stages=STAGES):  # no tl.dot here: the loop asks for its pipelining
        offs_w = tile * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        words, scale, zero = _load_tile(
            qweight_ptr, scales_ptr, zeros_ptr, offs_n, offs_w, K, stride_qn, stride_sn, stride_sg, stride_zn,
            stride_zg, GROUP, EVEN_K,
        )  # fmt: skip
        x_words = x_ptr + row * stride_xm + offs_w * 8
        x_mask = (offs_w < K // 8) | EVEN_K
        part = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
        x_sum = tl.zeros((BLOCK_K // 8,), dtype=tl.float32)
        for i in tl.static_range(8):
            x_i = tl.load(x_words + i, mask=x_mask, other=0.0).to(tl.float32)
            part += _code_slot(words, i, float_16_bits) * x_i[None, :]
            x_sum += x_i
        acc += scale * (part - (zero + 16.0) * x_sum[None, :])
    offs_out = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    y = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        tl.store(out_ptr + row * stride_om + offs_out, y.to(out_ptr.dtype.element_ty), mask=offs_out < N)
    else:
        partial = partial_ptr + (tl.program_id(2) * tl.num_programs(0) + row) * N + offs_out
        tl.store(partial, y, mask=offs_out < N)


@triton.jit(do_not_specialize=["M", "M_BUCKET", "SPLIT_K"])  # one binary for every row count and split
def _w4a16_gemm_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, partial_ptr, M, N, K, M_BUCKET, stride_xm, stride_qn,
    stride_sn, stride_sg, stride_zn, stride_zg, stride_om, float_16_bits, SPLIT_K,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, SWAP_AB: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Program ``(m-n tile, 0, split)``: a ``[BLOCK_M, BLOCK_N]`` tile of ``x @ W^T`` over the split's K,
    8 slot products per K tile, each slot's weights dequantized by one FFMA ``(16 + c) * s - (16 + z) * s``.
    Stored as in ``_w4a16_gemv_kernel``: to ``out`` when ``SPLIT_K == 1``, else to ``partial[split]``.

    ``M_BUCKET`` (the next power of two of M) is not read: it is the autotuner's key, so a shape is tuned
    once per bucket, not once per prompt length.
    """
    pid = tl.program_id(0)
    num_pid_m, num_pid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    # L2 ordering: GROUP_SIZE_M row tiles take turns on one column tile of weights.
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    first_m = (pid // tiles_per_group) * GROUP_SIZE_M
    group_rows = min(num_pid_m - first_m, GROUP_SIZE_M)
    pid_m = first_m + (pid % tiles_per_group) % group_rows
    pid_n = (pid % tiles_per_group) // group_rows
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M  # wrapped rows and columns are never stored
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    first, last = _split_range(K, BLOCK_K, SPLIT_K)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for tile in range(first, last):
        offs_w = tile * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        words, scale, zero = _load_tile(
            qweight_ptr, scales_ptr, zeros_ptr, offs_n, offs_w, K, stride_qn, stride_sn, stride_sg, stride_zn,
            stride_zg, GROUP, EVEN_K,
        )  # fmt: skip
        zero_scaled = (zero + 16.0) * scale
        x_words = x_ptr + offs_m[:, None] * stride_xm + offs_w[None, :] * 8
        x_mask = (offs_w < K // 8)[None, :] | EVEN_K
        for i in tl.static_range(8):
            x_i = tl.load(x_words + i, mask=x_mask, other=0.0)
            w_i = (_code_slot(words, i, float_16_bits) * scale - zero_scaled).to(x_ptr.dtype.element_ty)
            if SWAP_AB:
                acc = tl.dot(w_i, tl.trans(x_i), acc, input_precision=DOT_PRECISION)
            else:
                acc = tl.dot(x_i, tl.trans(w_i), acc, input_precision=DOT_PRECISION)
    if SWAP_AB:
        acc = tl.trans(acc)
    offs_out_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_out_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_out_m < M)[:, None] & (offs_out_n < N)[None, :]
    if SPLIT_K == 1:
        out = out_ptr + offs_out_m[:, None] * stride_om + offs_out_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        partial = partial_ptr + tl.program_id(2) * M * N + offs_out_m[:, None] * N + offs_out_n[None, :]
        tl.store(partial, acc, mask=mask)


@triton.jit
def _sum_splits_kernel(partial_ptr, out_ptr, numel, SPLIT_K, BLOCK: tl.constexpr):
    """``out = sum_s partial[s]`` over the ``SPLIT_K`` float32 slices, in split order, in ``out``'s dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):
        total += tl.load(partial_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)


BLOCK_K = 128  # 16 words per row and tile: each slot product has K = 16, a tensor-core step
SKINNY_ROWS = 16  # up to this many rows: SWAP_AB and split-K (decode batches); above it, prefill tiles
_SPLITS = (1, 2, 4, 8, 16)
# Candidates on CUDA, each timed with every split worth timing. GEMV: (BLOCK_N, num_warps, STAGES).
# Skinny (2-16 rows, SWAP_AB, BLOCK_M 16): (BLOCK_N, num_warps, num_stages). Prefill: (BLOCK_M, BLOCK_N,
# num_warps, num_stages).
_GEMV_TILES = [(128, 4, 1), (128, 4, 3), (256, 8, 3)]
_SKINNY_TILES = [(64, 4, 3), (128, 4, 3), (256, 8, 3)]
_PREFILL_TILES = [(64, 128, 4, 3), (128, 128, 8, 3), (128, 256, 8, 3), (64, 64, 4, 4)]
INTERPRETER_BLOCK_N = 32


_TUNED_LAUNCHES: set[tuple] = set()  # (gemv, row bucket, N, K, group, dtype) already timed


def _refuse_tuning_in_a_graph(launch: tuple) -> None:
    """A CUDA graph cannot record a tuning run (it synchronises): name the launch to warm up instead."""
    if launch in _TUNED_LAUNCHES:
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        gemv, m_bucket, n, k, group, dtype = launch
        raise RuntimeError(
            f"awq_gemm was never autotuned for {m_bucket}-row bucket, {n} x {k}, group {group}, {dtype}, "
            "and a CUDA graph is being captured: call it once eagerly with that shape before capturing"
        )


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _splits_worth_timing(n: int, k: int, block_n: int, sms: int) -> list[int]:
    """1, and larger splits while the grid stays within four waves of the SMs and each split has 2 K tiles."""
    n_tiles, k_tiles = cdiv(n, block_n), cdiv(k, BLOCK_K)
    return [s for s in _SPLITS if s == 1 or (n_tiles * s <= 4 * sms and k_tiles >= 2 * s)]


def _worth_timing(
    configs: list[triton.Config], m_bucket: int, n: int, k: int, sms: int, float32: bool
) -> list[triton.Config]:
    """The candidates for a launch: its row bucket's tiles, with the splits worth timing at its N and K.
    Float32 activations multiply in IEEE float32 (no TF32 rounding), emulated on CUDA cores: small tiles
    only."""
    skinny = m_bucket <= SKINNY_ROWS
    kept = []
    for c in configs:
        block_m, block_n = c.kwargs.get("BLOCK_M"), c.kwargs["BLOCK_N"]  # BLOCK_M None: a GEMV candidate
        if block_m is not None and (block_m == 16) != skinny:
            continue
        if block_m is not None and block_m > 16 and block_m > 2 * m_bucket:  # a tile mostly past the last row
            continue
        if float32 and block_m is not None and (block_m > 64 or block_n > 64):
            continue
        if c.kwargs["SPLIT_K"] in _splits_worth_timing(n, k, block_n, sms):
            kept.append(c)
    return kept


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    x = named_args["x_ptr"]
    m_bucket = named_args.get("M_BUCKET", 1)
    return _worth_timing(configs, m_bucket, named_args["N"], named_args["K"], _sm_count(x.device.index or 0),
                         x.dtype == torch.float32)  # fmt: skip


def _sum_splits(partial: torch.Tensor, out: torch.Tensor, split: int) -> None:
    block = 1024
    _sum_splits_kernel[(cdiv(out.numel(), block),)](partial, out, out.numel(), split, block)


def _sum_splits_when_timed(nargs: dict, exception: Exception | None) -> None:
    """The autotuner's post-hook, run inside each timed call: a split candidate's time includes the pass that
    adds its partial sums, as every real call pays it."""
    if exception is None and nargs["SPLIT_K"] > 1:
        _sum_splits(nargs["partial_ptr"], nargs["out_ptr"], nargs["SPLIT_K"])


_gemv_autotuned = triton.autotune(
    configs=[
        triton.Config({"BLOCK_N": n, "SPLIT_K": s, "STAGES": st}, num_warps=w)
        for n, w, st in _GEMV_TILES
        for s in _SPLITS
    ],
    key=["N", "K", "GROUP"],
    prune_configs_by={"early_config_prune": _prune},
    post_hook=_sum_splits_when_timed,
    do_bench=quick_bench,
)(_w4a16_gemv_kernel)

_gemm_autotuned = triton.autotune(
    configs=[
        triton.Config(
            {"BLOCK_M": 16, "BLOCK_N": n, "SPLIT_K": s, "GROUP_SIZE_M": 1, "SWAP_AB": True},
            num_warps=w,
            num_stages=st,
        )
        for n, w, st in _SKINNY_TILES
        for s in _SPLITS
    ]
    + [
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n, "SPLIT_K": 1, "GROUP_SIZE_M": 8, "SWAP_AB": False},
            num_warps=w,
            num_stages=st,
        )
        for m, n, w, st in _PREFILL_TILES
    ],  # fmt: skip
    key=["M_BUCKET", "N", "K", "GROUP"],
    prune_configs_by={"early_config_prune": _prune},
    post_hook=_sum_splits_when_timed,
    do_bench=quick_bench,
)(_w4a16_gemm_kernel)


def check_w4a16_inputs(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> None:
    """Raise a ValueError naming the problem if the operands do not form one W4A16 product."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D [M, K], got shape {tuple(x.shape)}")
    n, k = qweight.shape[0], qweight.shape[1] * 8
    if qweight.dtype != torch.int32:
        raise ValueError(f"qweight must be int32 (eight codes per word), got {qweight.dtype}")
    if x.shape[1] != k:
        raise ValueError(f"x has {x.shape[1]} features but qweight packs {k} ({qweight.shape[1]} words x 8)")
    if group_size < 8 or group_size % 8 or k % group_size:
        raise ValueError(f"group_size {group_size} must be a multiple of 8 that divides in_features {k}")
    if scales.shape != (n, k // group_size) or zeros.shape != scales.shape:
        shapes = f"{tuple(scales.shape)} and {tuple(zeros.shape)}"
        raise ValueError(f"scales and zeros must be [{n}, {k // group_size}]: got {shapes}")


@functools.cache
def _max_split(gemv: bool, m_bucket: int, n: int, k: int, device_index: int, float32: bool) -> int:
    """The largest split the autotuner may pick for this launch: the partial-sum buffer is sized for it."""
    configs = (_gemv_autotuned if gemv else _gemm_autotuned).configs
    kept = _worth_timing(configs, m_bucket, n, k, _sm_count(device_index), float32)
    return max(c.kwargs["SPLIT_K"] for c in kept)


def _fixed_config(gemv: bool, m_bucket: int, n: int, k: int, x: torch.Tensor, split: int) -> dict:
    """The one configuration run untimed: the interpreter's small tile; on CUDA (a chosen split, or
    ``FASTMODE_AUTOTUNE=0``) the launch's first candidate, with that split."""
    if not autotunes_on(x.device):
        tile = dict(BLOCK_N=INTERPRETER_BLOCK_N, SPLIT_K=split)
        if gemv:
            return tile | dict(STAGES=3)
        return tile | dict(BLOCK_M=16, GROUP_SIZE_M=2, SWAP_AB=m_bucket <= SKINNY_ROWS)
    configs = (_gemv_autotuned if gemv else _gemm_autotuned).configs
    sms, float32 = _sm_count(x.device.index or 0), x.dtype == torch.float32
    return _worth_timing(configs, m_bucket, n, k, sms, float32)[0].all_kwargs() | dict(SPLIT_K=split)


def awq_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    split_k: int | None = None,
) -> torch.Tensor:
    """``x`` ``[M, K]`` times the dequantized weight transposed: ``[M, N]`` in ``x``'s dtype.

    One row runs the GEMV kernel, more rows the GEMM kernel. ``split_k`` None: tiles and split autotuned on
    CUDA, one split in the interpreter. An integer fixes the split and runs one fixed tile (tests and
    benchmarks use it to exercise a chosen split)."""
    check_w4a16_inputs(x, qweight, scales, zeros, group_size)
    if split_k is not None and split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {split_k}")
    if x.device.type != "cuda" and x.dtype == torch.bfloat16:
        # The Triton interpreter's tl.dot multiplies bfloat16 tiles as their raw 16-bit patterns: use float32.
        return awq_gemm(x.float(), qweight, scales, zeros, group_size, split_k).to(x.dtype)
    x, qweight = x.contiguous(), qweight.contiguous()
    (m, k), n = x.shape, qweight.shape[0]
    gemv, float32 = m == 1, x.dtype == torch.float32
    m_bucket = min(triton.next_power_of_2(m), 1024)
    # FASTMODE_AUTOTUNE=0 (as for the attention kernels): one fixed tile on CUDA too, for correctness runs
    tuned = autotunes_on(x.device) and split_k is None and os.environ.get("FASTMODE_AUTOTUNE", "1") != "0"
    autotuned = (_gemv_autotuned if gemv else _gemm_autotuned) if tuned else None
    if autotuned is not None:
        max_split = _max_split(gemv, m_bucket, n, k, x.device.index or 0, float32)
    else:
        max_split = split_k or 1
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    partial = torch.empty(max_split, m, n, device=x.device, dtype=torch.float32) if max_split > 1 else out
    args = [x, qweight, scales, zeros, out, partial, *([n, k] if gemv else [m, n, k, m_bucket])]
    args += [x.stride(0), qweight.stride(0), *scales.stride(), *zeros.stride(), out.stride(0), FLOAT_16_BITS]
    meta = dict(GROUP=group_size, BLOCK_K=BLOCK_K, EVEN_K=k % BLOCK_K == 0)
    if gemv:
        grid = lambda c: (m, cdiv(n, c["BLOCK_N"]), c["SPLIT_K"])  # noqa: E731
    else:
        tiles = lambda c: cdiv(m, c["BLOCK_M"]) * cdiv(n, c["BLOCK_N"])  # noqa: E731
        grid = lambda c: (tiles(c), 1, c["SPLIT_K"])  # noqa: E731
        meta["DOT_PRECISION"] = "ieee" if float32 else "tf32"
    if autotuned is not None:
        launch = (gemv, m_bucket, n, k, group_size, x.dtype)
        _refuse_tuning_in_a_graph(launch)
        autotuned[grid](*args, **meta)
        _TUNED_LAUNCHES.add(launch)
        split = autotuned.best_config.kwargs["SPLIT_K"]  # the configuration this call ran
    else:
        config = _fixed_config(gemv, m_bucket, n, k, x, split_k or 1)
        (_w4a16_gemv_kernel if gemv else _w4a16_gemm_kernel)[grid(config)](*args, **meta, **config)
        split = config["SPLIT_K"]
    if split > 1:
        _sum_splits(partial, out, split)
    return out
