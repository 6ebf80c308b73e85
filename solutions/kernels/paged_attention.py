"""Attention over a paged KV cache in Triton: a flash-decoding kernel for decode steps, a varlen
FlashAttention kernel for prefill chunks and mixed batches. Both read K/V through block tables.

Layout (``CORE.md``): q ``[T, Hq, D]`` packs the step's queries; ``k_cache``/``v_cache``
``[num_blocks, block_size, Hkv, D]``; sequence ``b`` owns query rows
``query_start_loc[b]:query_start_loc[b+1]``, which are the LAST ``q_len`` of its ``seq_lens[b]`` tokens
(bottom-right causal: query ``i`` sees positions ``p <= i + seq_len - q_len``), and its K/V for position
``p`` sit at block ``block_table[b, p // block_size]``, offset ``p % block_size``. Query head ``h``
reads KV head ``h // (Hq // Hkv)``.

Decode (every ``q_len <= 1``) is memory-bound: the whole context is read once per query. One program serves
all the query heads of one KV head (GQA), so each K/V tile is loaded once for the group, and each sequence's
context is cut into ``num_splits`` ranges handled by separate programs, each writing a partial output and its
log-sum-exp; a small second kernel merges them (flash-decoding). With one split the first kernel writes the
output directly. The split count comes from the SM count, the batch and the longest context
(``decode_num_splits``), so a small batch still fills the GPU. A decode call is CUDA-graph safe: its grid and
buffers depend on host ints only, and padding rows (``seq_lens`` 0) read nothing and output zeros.

Prefill is Lesson 1's kernel with the key loop reading through the block table, so a prefix-cache hit (a long
cached prefix, a few new queries) computes only the new rows; key tiles wholly before a query tile's diagonal
skip the causal mask. On CUDA both kernels' tiles, warps and pipeline stages are autotuned (``tuning.py``);
``bench paged_attention`` measures them.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .blocks import cdiv
from .flash_attention import (
    INTERPRETER_PREFILL,
    LOG2_E,
    PREFILL_CONFIGS,
    _check_head_dim,
    _dot,
    _interpretable,
    _online_softmax_step,
    fitting_prefill_configs,
)
from .tuning import TunedKernel, pow2_bucket


@triton.jit
def _tile_blocks(table_row, pos, valid, BLOCK_SIZE: tl.constexpr):
    """The physical block ids (int64) of logical positions ``pos`` of one sequence, read from its block table
    row ``table_row``; 0 (the null block) where ``valid`` is false."""
    # BEGIN SOLUTION Lab 2: position p lives in physical block table_row[p // BLOCK_SIZE]:
    #  load those block ids (masked, other=0) as int64
    # HINT: The cache is [num_blocks, block_size, Hkv, D] and a sequence's tokens are scattered over it: its
    #  block table row says where. Logical position p sits in physical block table_row[p // BLOCK_SIZE].
    # HINT: One load of the block id of every position: table_row + pos // BLOCK_SIZE, masked by valid with
    #  other=0 (past the sequence's end the table holds padding).
    # HINT: Cast the ids to tl.int64: the caller multiplies them by the cache's block stride, which overflows
    #  int32 on a large cache.
    return tl.load(table_row + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    # END SOLUTION


@triton.jit
def _load_kv_tile(
    K_cache, V_cache, block, pos, valid, kv_h,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """K and V tiles ``[len(pos), HEAD_DIM]`` of KV head ``kv_h`` for logical positions ``pos`` of one
    sequence, whose physical blocks ``_tile_blocks`` read; positions where ``valid`` is false load as 0."""
    offs_d = tl.arange(0, HEAD_DIM)
    # BEGIN SOLUTION Lab 2: position p sits at offset p % BLOCK_SIZE of its physical block block[p]:
    #  load the K and V rows there (masked, other=0)
    # HINT: A block holds BLOCK_SIZE consecutive positions; row p % BLOCK_SIZE of block[p] holds every KV
    #  head's D values of position p.
    # HINT: One 2-D load each for K and V: base + block * stride_b + offset * stride_s + kv_h * stride_h
    #  + offs_d, masked by valid[:, None] with other=0.0; return (k, v).
    # HINT: block[:, None] and offset[:, None] index the rows, offs_d[None, :] the columns; block is int64
    #  already, so the products cannot overflow.
    offset = pos % BLOCK_SIZE
    k = tl.load(
        K_cache
        + block[:, None] * stride_kb
        + offset[:, None] * stride_ks
        + kv_h * stride_kh
        + offs_d[None, :],
        mask=valid[:, None],
        other=0.0,
    )
    v = tl.load(
        V_cache
        + block[:, None] * stride_vb
        + offset[:, None] * stride_vs
        + kv_h * stride_vh
        + offs_d[None, :],
        mask=valid[:, None],
        other=0.0,
    )
    return k, v
    # END SOLUTION


@triton.jit
def _paged_decode(
    Q, K_cache, V_cache, Out, Lse,
    block_table, query_start_loc, seq_lens,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh, stride_os, stride_lt, stride_lh,
    group, num_splits, qk_scale,
    tune_programs, tune_tiles,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Program (b, kv_h, split): the query heads of KV head ``kv_h`` for sequence ``b``'s one query, over the
    ``split``-th of ``num_splits`` tile-aligned ranges of its own context. With SPLIT, writes the normalised
    partial output ``Out[t, h, split]`` and its base-2 log-sum-exp ``Lse[t, h, split]``. ``tune_programs`` and
    ``tune_tiles`` are only the autotuning key."""
    b = tl.program_id(0)
    kv_h = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(query_start_loc + b)
    if tl.load(query_start_loc + b + 1) == row:
        return
    seq_len = tl.load(seq_lens + b)
    # Each sequence cuts its own context into the splits, so a short one still spreads over every program (a
    # graph's split count is fixed for the longest context it serves); a padding row (seq_len 0) reads
    # nothing.
    per_split = (seq_len + num_splits - 1) // num_splits
    split_len = (per_split + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = split * split_len
    end = tl.minimum(seq_len, start + split_len)

    offs_g = tl.arange(0, BLOCK_H)
    heads = kv_h * group + offs_g
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        Q + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=offs_g[:, None] < group,
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    table_row = block_table + b.to(tl.int64) * stride_bt
    pos = start + tl.arange(0, BLOCK_N)
    block = _tile_blocks(table_row, pos, pos < end, BLOCK_SIZE)
    for start_n in range(start, end, BLOCK_N):
        pos = start_n + tl.arange(0, BLOCK_N)
        valid = pos < end
        k, v = _load_kv_tile(
            K_cache, V_cache, block, pos, valid, kv_h,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, BLOCK_SIZE, HEAD_DIM,
        )  # fmt: skip
        # The next tile's block ids, one iteration ahead: the compiler pipelines K/V loads (several tiles in
        # flight) only when their addresses do not come from a load in the same iteration.
        block = _tile_blocks(table_row, pos + BLOCK_N, pos + BLOCK_N < end, BLOCK_SIZE)
        s = _dot(q, tl.trans(k)) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, v)

    # A split past the sequence's end saw no key: output 0 and lse -inf, so the merge gives it no weight.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    out_ptrs = Out + row * stride_ot + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :]
    tl.store(out_ptrs, out.to(Out.dtype.element_ty), mask=offs_g[:, None] < group)
    if SPLIT:
        tl.store(
            Lse + row * stride_lt + heads * stride_lh + split, m_i + tl.math.log2(l_safe), mask=offs_g < group
        )


@triton.jit
def _merge_splits(
    Partial, Lse, Out,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
    num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Program (t, h): out = sum_s w_s * partial_s / sum_s w_s with
    w_s = 2^(lse_s - max lse) (flash-decoding)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    used = offs_s < num_splits
    lse = tl.load(Lse + t * stride_lt + h * stride_lh + offs_s, mask=used, other=float("-inf"))
    top = tl.max(lse, 0)
    weight = tl.math.exp2(lse - tl.where(top == float("-inf"), 0.0, top))
    part = tl.load(
        Partial + t * stride_pt + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=used[:, None],
        other=0.0,
    )
    total = tl.sum(weight, 0)
    out = tl.sum(weight[:, None] * part, 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(Out + t * stride_ot + h * stride_oh + offs_d, out.to(Out.dtype.element_ty))


@triton.jit
def _paged_prefill(
    Q, K_cache, V_cache, Out,
    block_table, query_start_loc, seq_lens,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh,
    q_heads, group, qk_scale,
    tune_q_len, tune_seq_len,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Program (m, b * Hq + h): query rows ``[m * BLOCK_M, (m + 1) * BLOCK_M)`` of sequence ``b``, head ``h``.
    ``tune_q_len`` and ``tune_seq_len`` are only the autotuning key."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // q_heads
    h = bh % q_heads
    kv_h = h // group
    q_start = tl.load(query_start_loc + b)
    q_len = tl.load(query_start_loc + b + 1) - q_start
    seq_len = tl.load(seq_lens + b)
    if start_m * BLOCK_M >= q_len:
        return
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + (q_start + offs_m[:, None]) * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=offs_m[:, None] < q_len, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # The queries are the last q_len positions: row i sits at position i + shift and sees p <= i + shift.
    shift = seq_len - q_len
    hi = tl.minimum(seq_len, (start_m + 1) * BLOCK_M + shift)
    # Key tiles wholly at or before the tile's first row's position are visible to every row: no mask there.
    unmasked_end = (start_m * BLOCK_M + shift + 1) // BLOCK_N * BLOCK_N
    table_row = block_table + b.to(tl.int64) * stride_bt
    # Each tile's block ids are read one iteration ahead, as in the decode kernel (so its K/V loads pipeline).
    pos = tl.arange(0, BLOCK_N)
    block = _tile_blocks(table_row, pos, pos < hi, BLOCK_SIZE)
    for start_n in range(0, unmasked_end, BLOCK_N):
        pos = start_n + tl.arange(0, BLOCK_N)
        k, v = _load_kv_tile(
            K_cache, V_cache, block, pos, pos < unmasked_end, kv_h,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, BLOCK_SIZE, HEAD_DIM,
        )  # fmt: skip
        block = _tile_blocks(table_row, pos + BLOCK_N, pos + BLOCK_N < hi, BLOCK_SIZE)
        m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, _dot(q, tl.trans(k)) * qk_scale, v)
    for start_n in range(unmasked_end, hi, BLOCK_N):
        pos = start_n + tl.arange(0, BLOCK_N)
        k, v = _load_kv_tile(
            K_cache, V_cache, block, pos, pos < hi, kv_h,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, BLOCK_SIZE, HEAD_DIM,
        )  # fmt: skip
        block = _tile_blocks(table_row, pos + BLOCK_N, pos + BLOCK_N < hi, BLOCK_SIZE)
        s = _dot(q, tl.trans(k)) * qk_scale
        s = tl.where((pos[None, :] < hi) & (pos[None, :] <= offs_m[:, None] + shift), s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(m_i, l_i, acc, s, v)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out_ptrs = Out + (q_start + offs_m[:, None]) * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, (acc / l_safe[:, None]).to(Out.dtype.element_ty), mask=offs_m[:, None] < q_len)


# (BLOCK_N, num_warps, num_stages) tried for the decode kernel on CUDA: key tiles of 32-128 positions, one or
# two warpgroups, one to three K/V tiles in flight. 64 / 4 warps (D 64) and 64 / 8 warps (D 128) with 2 stages
# were the fixed choice before autotuning.
DECODE_TILES = [(32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 8, 3)]
DECODE_CONFIGS = [
    triton.Config({"BLOCK_N": n}, num_warps=warps, num_stages=stages) for n, warps, stages in DECODE_TILES
]


def fitting_decode_configs(configs: list[triton.Config], head_dim: int) -> list[triton.Config]:
    """Drop tiles whose pipelined K/V (2-byte elements) would pass ~200 KB of shared memory at this head
    dim."""
    return [c for c in configs if c.num_stages * 2 * c.kwargs["BLOCK_N"] * head_dim * 2 <= 200 * 1024]


_paged_decode_tuned = TunedKernel(
    _paged_decode,
    DECODE_CONFIGS,
    key=["HEAD_DIM", "BLOCK_H", "BLOCK_SIZE", "SPLIT", "tune_programs", "tune_tiles"],
    # The interpreter's cost is per tile step: 32 keeps several steps in the tests' short contexts.
    interpreter_config=triton.Config({"BLOCK_N": 32}, num_warps=1, num_stages=1),
    warm_up_hint="call paged_attention.tune_decode(k_cache, v_cache, ...) for each graph bucket first",
    prune=fitting_decode_configs,
)
_paged_prefill_tuned = TunedKernel(
    _paged_prefill,
    PREFILL_CONFIGS,
    key=["HEAD_DIM", "BLOCK_SIZE", "tune_q_len", "tune_seq_len"],
    interpreter_config=INTERPRETER_PREFILL,
    warm_up_hint="prefill steps run eagerly, outside CUDA graphs",
    prune=fitting_prefill_configs,
)


def check_paged_attention_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    max_seq_len: int,
) -> None:
    """Raise a ValueError naming the problem if the arguments cannot form a ``paged_attention`` call.

    Shapes and dtypes are always checked; lengths and offsets only for CPU tensors (on a GPU reading them
    would synchronise the device every layer).
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [T, Hq, D]; got {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache and v_cache must both be [num_blocks, block_size, Hkv, D]; "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    q_heads, head_dim = q.shape[1:]
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"q's head dim ({head_dim}) differs from the cache's ({k_cache.shape[3]})")
    if q_heads % kv_heads:
        raise ValueError(f"query heads ({q_heads}) must be a multiple of key/value heads ({kv_heads})")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(
            f"q, k_cache, v_cache must share a dtype; got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    batch = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    if block_table.dim() != 2 or block_table.shape[0] != batch or query_start_loc.shape != (batch + 1,):
        raise ValueError(
            f"need block_table [B, max_blocks], query_start_loc [B + 1], seq_lens [B]; got "
            f"{tuple(block_table.shape)}, {tuple(query_start_loc.shape)}, {tuple(seq_lens.shape)}"
        )
    for name, t in (
        ("block_table", block_table),
        ("query_start_loc", query_start_loc),
        ("seq_lens", seq_lens),
    ):
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32; got {t.dtype}")
    if len({t.device for t in (q, k_cache, v_cache, block_table, query_start_loc, seq_lens)}) != 1:
        raise ValueError("q, the caches, block_table, query_start_loc and seq_lens must be on one device")
    if q.device.type != "cpu" or batch == 0:
        return
    q_lens = query_start_loc.diff()
    if int(query_start_loc[0]) != 0 or int(query_start_loc[-1]) != q.shape[0] or bool((q_lens < 0).any()):
        raise ValueError(
            f"query_start_loc must rise from 0 to T = {q.shape[0]}; got {query_start_loc.tolist()}"
        )
    # A padding row (seq_len 0, as a CUDA graph's unused rows are) may hold a query: it attends to nothing.
    if bool(((q_lens > seq_lens) & (seq_lens > 0)).any()):
        raise ValueError(
            f"a sequence has more queries than tokens: q_lens {q_lens.tolist()}, seq_lens {seq_lens.tolist()}"
        )
    if int(q_lens.max()) > max_query_len or int(seq_lens.max()) > max_seq_len:
        raise ValueError(
            f"max_query_len {max_query_len} / max_seq_len {max_seq_len} are below the batch's "
            f"{int(q_lens.max())} / {int(seq_lens.max())}"
        )
    blocks_needed = int((seq_lens.max() + k_cache.shape[1] - 1) // k_cache.shape[1])
    if blocks_needed > block_table.shape[1]:
        raise ValueError(
            f"block_table has {block_table.shape[1]} columns; a sequence needs {blocks_needed} blocks"
        )


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Decode programs wanted per SM: enough K/V loads in flight to cover memory latency on every SM.
PROGRAMS_PER_SM = 4
# The fewest positions a decode program reads (two 64-key tiles), and the most programs a context is cut into.
MIN_SPLIT_LEN = 128
MAX_SPLITS = 64
# In the interpreter a decode program reads this many positions (a multiple of MIN_SPLIT_LEN).
INTERPRETER_SPLIT_LEN = 1024


def decode_num_splits(batch: int, kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """How many programs share one sequence's context: on a GPU, enough for ``PROGRAMS_PER_SM`` programs per
    SM over the ``batch * kv_heads`` (sequence, KV head) pairs, with at least ``MIN_SPLIT_LEN`` of
    ``max_seq_len`` positions each and at most ``MAX_SPLITS``; in the interpreter, one per 1024 positions.

    For a CUDA graph, call it with the bucket's batch and the engine's ``max_model_len`` and pass the result
    as ``num_splits``: every sequence then cuts its own context into that many ranges."""
    if device.type != "cuda":
        return max(1, cdiv(max_seq_len, INTERPRETER_SPLIT_LEN))
    index = torch.cuda.current_device() if device.index is None else device.index
    wanted = cdiv(PROGRAMS_PER_SM * _sm_count(index), max(1, batch * kv_heads))
    return max(1, min(wanted, cdiv(max_seq_len, MIN_SPLIT_LEN), MAX_SPLITS))


def decode_tuning_key(
    batch: int, kv_heads: int, max_seq_len: int, device: torch.device, num_splits: int | None = None
) -> tuple[int, int, int]:
    """``(splits, tune_programs, tune_tiles)`` of a decode call: its split count (``num_splits``, default
    ``decode_num_splits``) and the two bucketed sizes its autotuning is keyed on (with ``splits > 1``, the
    head dim, block size, query-head block and dtypes, fixed for one engine)."""
    splits = num_splits or decode_num_splits(batch, kv_heads, max_seq_len, device)
    programs = pow2_bucket(batch * kv_heads * splits, 1, 1 << 16)
    return splits, programs, pow2_bucket(cdiv(max_seq_len, splits), 16, 1 << 16)


def eager_decode_shapes(
    max_batch: int, max_seq_len: int, kv_heads: int, device: torch.device
) -> list[tuple[int, int]]:
    """Every decode tuning key that an eager step of at most ``max_batch`` sequences, the longest at most
    ``max_seq_len`` tokens, can meet, as one ``(batch, max_seq_len)`` call of each (the last of that key in
    (batch, length) order): ``tune_decode`` on each at start-up leaves no key for a request to wait on."""
    shapes = {}
    lengths = _key_run_ends(max_seq_len)
    for batch in range(1, max_batch + 1):
        for seq_len in lengths:
            splits, programs, tiles = decode_tuning_key(batch, kv_heads, seq_len, device)
            shapes[(splits > 1, programs, tiles)] = (batch, seq_len)
    return sorted(shapes.values())


def _key_run_ends(max_seq_len: int) -> list[int]:
    """The last context length of each run of lengths in ``[1, max_seq_len]`` over which a decode call's
    tuning key cannot change at a fixed batch: its split count changes only where ``cdiv(n, MIN_SPLIT_LEN)``
    (or, in the interpreter, ``cdiv(n, INTERPRETER_SPLIT_LEN)``, a multiple of it) does, its tile bucket only
    where ``cdiv(n, splits)`` passes a power of two."""
    ends = {max_seq_len, *range(MIN_SPLIT_LEN, max_seq_len, MIN_SPLIT_LEN)}
    for splits in range(1, max(MAX_SPLITS, cdiv(max_seq_len, INTERPRETER_SPLIT_LEN)) + 1):
        power = 1
        while splits * power < max_seq_len:
            ends.add(splits * power)
            power *= 2
    return sorted(ends)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_query_len: int,
    max_seq_len: int,
    sm_scale: float | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal attention of the packed queries q ``[T, Hq, D]`` over each sequence's paged K/V (module doc).

    ``max_query_len`` and ``max_seq_len`` (host ints, at least the batch's longest) size the grids and key
    the autotuning; when ``max_query_len == 1`` the decode kernel runs, each context cut into ``num_splits``
    ranges (default: ``decode_num_splits``). Every row of q belongs to a sequence (``query_start_loc[B] ==
    T``); a row whose ``seq_lens`` is 0 (a graph's padding) outputs zeros and reads no cache row. On a GPU the
    lengths are trusted, not checked, and nothing on the host waits for the device, so a decode call can be
    captured in a CUDA graph (once its configuration is tuned: ``tune_decode``). Returns ``[T, Hq, D]`` in q's
    dtype.
    """
    check_paged_attention_inputs(
        q, k_cache, v_cache, block_table, query_start_loc, seq_lens, max_query_len, max_seq_len
    )
    _check_head_dim(q.shape[-1])
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be at least 1, got {num_splits}")
    in_dtype = q.dtype
    q, k_cache, v_cache = _interpretable(q, k_cache, v_cache)
    batch = seq_lens.shape[0]
    q_heads, head_dim = q.shape[1:]
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    qk_scale = (head_dim**-0.5 if sm_scale is None else sm_scale) * LOG2_E
    out = torch.empty_like(q)
    if q.shape[0] == 0 or batch == 0:
        return out.to(in_dtype)
    cache_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])
    if max_query_len == 1:
        key = decode_tuning_key(batch, kv_heads, max_seq_len, q.device, num_splits)
        splits, tune_programs, tune_tiles = key
        if splits > 1:
            target = torch.empty(q.shape[0], q_heads, splits, head_dim, device=q.device, dtype=torch.float32)
            lse = torch.empty(q.shape[0], q_heads, splits, device=q.device, dtype=torch.float32)
        else:  # one split writes the output itself, and no log-sum-exp
            target, lse = out.unsqueeze(2), out
        # tl.dot needs 16 rows on a GPU: a group of 3 query heads rides in a 16-row tile.
        block_h = max(16 if q.is_cuda else 1, triton.next_power_of_2(group))
        _paged_decode_tuned(
            lambda meta: (batch, kv_heads, splits),
            q, k_cache, v_cache, target, lse,
            block_table, query_start_loc, seq_lens,
            q.stride(0), q.stride(1), *cache_strides,
            block_table.stride(0), *target.stride()[:3], lse.stride(0), lse.stride(1),
            group, splits, qk_scale, tune_programs, tune_tiles,
            BLOCK_SIZE=block_size, HEAD_DIM=head_dim, BLOCK_H=block_h, SPLIT=splits > 1,
        )  # fmt: skip
        if splits > 1:
            _merge_splits[(q.shape[0], q_heads)](
                target, lse, out,
                *target.stride()[:3], lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
                splits, HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(splits),
                num_warps=1 if head_dim <= 64 else 2,
            )  # fmt: skip
        return out.to(in_dtype)
    _paged_prefill_tuned(
        lambda meta: (cdiv(max_query_len, meta["BLOCK_M"]), batch * q_heads),
        q, k_cache, v_cache, out,
        block_table, query_start_loc, seq_lens,
        q.stride(0), q.stride(1), *cache_strides,
        block_table.stride(0), out.stride(0), out.stride(1),
        q_heads, group, qk_scale,
        pow2_bucket(max_query_len, 16, 1 << 16), pow2_bucket(max_seq_len, 16, 1 << 20),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
    )  # fmt: skip
    return out.to(in_dtype)


# The most K/V bytes of an engine's cache the decode tuning walks: many times an H200's L2, to time HBM reads.
TUNE_CACHE_BYTES = 1 << 30


def tune_decode(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    batch: int,
    max_seq_len: int,
    q_heads: int,
    num_splits: int | None = None,
) -> None:
    """Autotune the decode kernel for one CUDA-graph bucket before it is captured: ``batch`` sequences of
    ``max_seq_len`` tokens each, cut into ``num_splits`` ranges (default: ``decode_num_splits``, as in
    ``paged_attention``), reading the engine's own caches (one layer's ``[num_blocks, block_size, Hkv, D]``;
    block 0 is never read, nothing is written). A later ``paged_attention(..., max_query_len=1,
    max_seq_len=max_seq_len, num_splits=num_splits)`` over ``batch`` sequences of this cache's shape and dtype
    reuses the tuned configuration, inside a graph too. A real warm-up step cannot tune: its padding rows have
    no context to time. Does nothing off CUDA (nothing is tuned there)."""
    if k_cache.device.type != "cuda":
        return
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    if num_blocks < 2:
        raise ValueError("tune_decode needs a cache with at least one block besides the null block 0")
    blocks_per_seq = cdiv(max_seq_len, block_size)
    bytes_per_block = 2 * block_size * kv_heads * head_dim * k_cache.element_size()
    usable = min(num_blocks - 1, max(1, TUNE_CACHE_BYTES // bytes_per_block))
    # Sequences walk the cache's blocks cyclically: distinct blocks up to TUNE_CACHE_BYTES, like a full cache.
    walk = torch.arange(batch * blocks_per_seq, device=k_cache.device) % usable + 1
    block_table = walk.view(batch, -1).int()
    q = torch.randn(batch, q_heads, head_dim, device=k_cache.device, dtype=k_cache.dtype)
    query_start_loc = torch.arange(batch + 1, device=k_cache.device, dtype=torch.int32)
    seq_lens = torch.full((batch,), max_seq_len, device=k_cache.device, dtype=torch.int32)
    paged_attention(
        q, k_cache, v_cache, block_table, query_start_loc, seq_lens,
        max_query_len=1, max_seq_len=max_seq_len, num_splits=num_splits,
    )  # fmt: skip
