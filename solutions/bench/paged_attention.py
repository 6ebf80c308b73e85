"""What ``python -m solutions bench paged_attention`` measures with (``cli/bench/paged_attention.py``; ``bench
kv``, ``bench kernels`` and ``bench attention`` use it too): the paged decode kernel's bytes per second
against a device-to-device copy, its batch-1 latency against SDPA over the same K/V stored densely, and varlen
paged prefill TFLOP/s against SDPA, each launch graph-replayed as the engine runs it and timed by
``triton.testing.do_bench``."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..kernels.blocks import cdiv
from ..kernels.flash_attention import flops
from ..kernels.paged_attention import (
    _paged_decode_tuned,
    _paged_prefill_tuned,
    decode_num_splits,
    paged_attention,
    tune_decode,
)
from ..kernels.reference import reference_attention
from .machine import machine_name
from .timing import bandwidth_gbps, median_ms

COPY_BYTES = 1 << 30
BANDWIDTH_GOAL = 0.6  # of copy bandwidth, at batch >= 16 and context >= 2048
LATENCY_GOAL = 1.5  # batch-1 decode time over SDPA's, at most
PREFILL_GOAL = 0.9  # varlen prefill TFLOP/s over SDPA's, at least
HEAD_SHAPES = {"135M": (9, 3, 64), "1.7B": (32, 32, 64)}  # (query heads, KV heads, head dim)
NO_CUDA = (
    "The paged-attention GPU benchmark needs CUDA, and this machine has none: nothing was timed. On CPU the "
    "kernels run (slowly) through the Triton interpreter for correctness: "
    "pytest tests/test_paged_attention.py, or this benchmark's code on tiny shapes: --smoke"
)


def _require(device: torch.device) -> None:
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(NO_CUDA)


def graphed(fn: Callable[[], torch.Tensor], device: torch.device) -> Callable[[], torch.Tensor]:
    """On CUDA, ``fn`` captured in a CUDA graph (after one eager call) and the graph's replay: what a decode
    step costs without Python's launch overhead. Elsewhere ``fn`` itself."""
    if device.type != "cuda":
        return fn
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


def random_paged_cache(
    num_seqs: int,
    context: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k_cache, v_cache, block_table): ``num_seqs`` sequences of ``context`` positions over shuffled blocks
    (block 0, the null block, unused), as a cache looks after many allocations and frees."""
    blocks_per_seq = cdiv(context, block_size)
    num_blocks = num_seqs * blocks_per_seq + 1
    k_cache, v_cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    block_table = (torch.randperm(num_blocks - 1, device=device) + 1).view(num_seqs, blocks_per_seq).int()
    return k_cache, v_cache, block_table


def _dense(cache: torch.Tensor, block_table: torch.Tensor, context: int) -> torch.Tensor:
    """Sequences' K or V read through their tables into ``[num_seqs, Hkv, context, D]``."""
    gathered = cache[block_table.long()].flatten(1, 2)[:, :context]
    return gathered.transpose(1, 2)


def decode_kernel_bandwidth(
    batch: int = 64, context: int = 2048, *, q_heads: int = 9, kv_heads: int = 3, head_dim: int = 64,
    block_size: int = 16, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cuda",
    copy_bytes: int = COPY_BYTES, copy_gbps: float | None = None,
) -> dict:  # fmt: skip
    """Time one decode step of ``batch`` sequences of ``context`` tokens (SmolLM2's heads by default).

    Returns ``device``, the shape, ``num_splits``, ``config`` (the tuned tiles), ``ms`` (median of the
    graph-replayed step on CUDA), ``eager_ms``, ``sdpa_ms`` (torch SDPA over the same K/V stored densely, also
    replayed), ``bytes`` (K/V read + q read + output written), ``gbps``, ``copy_gbps`` (measured in the same
    run unless given), ``fraction`` (gbps / copy_gbps), ``goal`` (0.6), ``meets_goal``, and ``rel_err`` of the
    kernel's output against a float64 reference on two sequences. Raises RuntimeError naming the problem when
    asked for CUDA without one.
    """
    device = torch.device(device)
    _require(device)
    torch.manual_seed(0)
    k_cache, v_cache, block_table = random_paged_cache(
        batch, context, kv_heads, head_dim, block_size, dtype, device
    )
    q = torch.randn(batch, q_heads, head_dim, device=device, dtype=dtype)
    query_start_loc = torch.arange(batch + 1, device=device, dtype=torch.int32)
    seq_lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    splits = decode_num_splits(batch, kv_heads, context, q.device)
    tune_decode(k_cache, v_cache, batch=batch, max_seq_len=context, num_splits=splits, q_heads=q_heads)

    def step() -> torch.Tensor:
        return paged_attention(
            q, k_cache, v_cache, block_table, query_start_loc, seq_lens,
            max_query_len=1, max_seq_len=context, num_splits=splits,
        )  # fmt: skip

    out = step()
    checked = min(batch, 2)
    heads_first = q[:checked, :, None].double()
    k, v = (_dense(cache, block_table[:checked], context).double() for cache in (k_cache, v_cache))
    ref = reference_attention(heads_first.cpu(), k.cpu(), v.cpu(), causal=True)[:, :, 0]
    rel_err = ((out[:checked].double().cpu() - ref).norm() / ref.norm()).item()

    dense_q = q[:, :, None]
    dense_k, dense_v = (_dense(cache, block_table, context).contiguous() for cache in (k_cache, v_cache))

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(dense_q, dense_k, dense_v, enable_gqa=True)

    ms = median_ms(graphed(step, device), device, 3)
    eager_ms = median_ms(step, device, 3)
    sdpa_ms = median_ms(graphed(sdpa, device), device, 3)
    element = torch.finfo(dtype).bits // 8
    moved = (2 * batch * context * kv_heads * head_dim + 2 * batch * q_heads * head_dim) * element
    gbps = moved / (ms * 1e-3) / 1e9
    copy_gbps = copy_gbps or bandwidth_gbps(copy_bytes, device)
    config = _paged_decode_tuned.last_config if device.type == "cuda" else None
    fraction = gbps / copy_gbps
    return {
        "device": machine_name(device), "batch": batch, "context": context, "q_heads": q_heads,
        "kv_heads": kv_heads, "head_dim": head_dim, "block_size": block_size,
        "dtype": str(dtype).removeprefix("torch."), "num_splits": splits, "config": tuned_tiles(config),
        "ms": ms, "eager_ms": eager_ms, "sdpa_ms": sdpa_ms, "bytes": moved, "gbps": gbps,
        "copy_gbps": copy_gbps, "fraction": fraction, "goal": BANDWIDTH_GOAL,
        "meets_goal": fraction >= BANDWIDTH_GOAL, "rel_err": rel_err,
    }  # fmt: skip


def tuned_tiles(config) -> str:
    """A tuned configuration as ``BLOCK_N=64 w4 s2`` (``-`` for the interpreter's fixed one)."""
    if config is None:
        return "-"
    tiles = " ".join(f"{k}={v}" for k, v in config.kwargs.items())
    return f"{tiles} w{config.num_warps} s{config.num_stages}"


def _mark(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "MISS")


def decode_rows(
    head_shapes: dict[str, tuple[int, int, int]],
    batches: list[int],
    contexts: list[int],
    device: torch.device,
    copy_gbps: float,
) -> list[str]:
    rows = [
        "heads  batch  context  splits  tuned tiles          graph ms  eager ms   GB/s  of copy  goal  "
        "vs SDPA  goal  rel err"
    ]
    for name, (q_heads, kv_heads, head_dim) in head_shapes.items():
        for batch in batches:
            for context in contexts:
                r = decode_kernel_bandwidth(
                    batch, context, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, device=device,
                    copy_gbps=copy_gbps,
                )  # fmt: skip
                bandwidth_goal = r["meets_goal"] if batch >= 16 and context >= 2048 else None
                vs_sdpa = r["ms"] / r["sdpa_ms"]
                latency_goal = vs_sdpa <= LATENCY_GOAL if batch == 1 else None
                rows.append(
                    f"{name:5s} {batch:6d} {context:8d} {r['num_splits']:7d}  {r['config']:20s} "
                    f"{r['ms']:8.3f} "
                    f"{r['eager_ms']:9.3f} {r['gbps']:6.0f} {r['fraction']:8.0%}  {_mark(bandwidth_goal):4s} "
                    f"{vs_sdpa:7.2f}x {_mark(latency_goal):4s} {r['rel_err']:8.1e}"
                )
                print(rows[-1], flush=True)
    return rows


def prefill_rows(
    shapes: list[tuple[int, int, int]], num_seqs: int, seq_len: int, device: torch.device
) -> list[str]:
    """The varlen prefill table: a row per (query heads, KV heads, head dim) of ``shapes``."""
    _require(device)
    rows = [
        "seqs x len   heads(q/kv/D)  tuned tiles                  ours TF/s  sdpa TF/s  ours/sdpa  goal"
        "  rel err"
    ]
    for heads in shapes:
        rows.append(_prefill_row(num_seqs, seq_len, *heads, device))
        print(rows[-1], flush=True)
    return rows


def _prefill_row(
    num_seqs: int, seq_len: int, q_heads: int, kv_heads: int, head_dim: int, device: torch.device
) -> str:
    """Causal bf16 prefill of ``num_seqs`` fresh sequences of ``seq_len`` tokens: our varlen paged kernel (K/V
    read through block tables of 16) against torch SDPA on the same K/V stored densely (heads repeated for
    SDPA, outside the timing): TFLOP/s, the ratio beside its goal, the tuned tiles, ours' error vs SDPA's."""
    torch.manual_seed(0)
    k_cache, v_cache, block_table = random_paged_cache(
        num_seqs, seq_len, kv_heads, head_dim, 16, torch.bfloat16, device
    )
    q = torch.randn(num_seqs * seq_len, q_heads, head_dim, device=device, dtype=torch.bfloat16)
    starts = torch.arange(0, num_seqs * seq_len + 1, seq_len, device=device, dtype=torch.int32)
    seq_lens = torch.full((num_seqs,), seq_len, device=device, dtype=torch.int32)
    dense_q = q.view(num_seqs, seq_len, q_heads, head_dim).transpose(1, 2).contiguous()
    dense_k, dense_v = (
        _dense(cache, block_table, seq_len).repeat_interleave(q_heads // kv_heads, dim=1).contiguous()
        for cache in (k_cache, v_cache)
    )
    ours = lambda: paged_attention(
        q, k_cache, v_cache, block_table, starts, seq_lens, max_query_len=seq_len, max_seq_len=seq_len
    )
    sdpa = lambda: F.scaled_dot_product_attention(dense_q, dense_k, dense_v, is_causal=True)
    theirs = sdpa().transpose(1, 2).reshape(q.shape).double()
    rel_err = ((ours().double() - theirs).norm() / theirs.norm()).item()
    work = num_seqs * flops(1, q_heads, seq_len, seq_len, head_dim, causal=True)
    ours_tflops, sdpa_tflops = (work / (median_ms(fn, device, 3) * 1e-3) / 1e12 for fn in (ours, sdpa))
    ratio = ours_tflops / sdpa_tflops
    config = tuned_tiles(_paged_prefill_tuned.last_config if device.type == "cuda" else None)
    return (
        f"{num_seqs:4d} x {seq_len:<5d} {q_heads:>5d}/{kv_heads}/{head_dim:<5d} {config:28s} "
        f"{ours_tflops:9.1f} {sdpa_tflops:10.1f} {ratio:10.2f}  {_mark(ratio >= PREFILL_GOAL):4s}"
        f" {rel_err:8.1e}"
    )
