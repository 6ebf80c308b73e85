"""Paged-attention kernels on a GPU: the decode kernel's achieved bandwidth against the device's measured copy
bandwidth (goal: at least 60%), and the varlen prefill kernel's TFLOP/s beside torch SDPA.

Decode is memory-bound: each step reads every sequence's whole K/V once, so the figure of merit is bytes
moved (K/V read, q read, output written) per second, set against a large device-to-device tensor copy
(read + write) timed the same way. Prefill of fresh sequences is compute-bound: TFLOP/s as in
``bench attention`` (4 * Lq * Lk * D per head, halved for causal), beside SDPA on the same sequences stored
densely. Times are ``triton.testing.do_bench`` medians (L2 flushed between runs). Triton and the kernels are
imported only inside the functions, so this module imports anywhere; ``bench kv`` calls
``decode_kernel_bandwidth`` when a GPU is there. Run alone: ``python -m solutions.bench.paged_attention``.
``device="cpu"`` runs the same code through the Triton interpreter with wall-clock medians: a check of this
code on tiny shapes, never a figure (``TRITON_INTERPRET=1`` must be set before the kernels are imported).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

COPY_BYTES = 1 << 30
BANDWIDTH_GOAL = 0.6
NO_CUDA = (
    "The paged-attention GPU benchmark needs CUDA, and this machine has none: nothing was timed. On CPU the "
    "kernels run (slowly) through the Triton interpreter for correctness: pytest tests/test_paged_attention.py"
)


def _require(device: torch.device) -> None:
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(NO_CUDA)


def _median_ms(fn, device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (Triton interpreter)"


def copy_bandwidth_gbps(num_bytes: int = COPY_BYTES, device: str | torch.device = "cuda") -> float:
    """Device copy bandwidth: a ``num_bytes`` tensor copied on the device, read + write bytes per second / 1e9."""
    device = torch.device(device)
    _require(device)
    src = torch.empty(num_bytes // 2, device=device, dtype=torch.float16).normal_()
    dst = torch.empty_like(src)
    return 2 * num_bytes / (_median_ms(lambda: dst.copy_(src), device) * 1e-3) / 1e9


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
    blocks_per_seq = -(-context // block_size)
    num_blocks = num_seqs * blocks_per_seq + 1
    k_cache, v_cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    block_table = (torch.randperm(num_blocks - 1, device=device) + 1).view(num_seqs, blocks_per_seq).int()
    return k_cache, v_cache, block_table


def _dense(cache: torch.Tensor, block_table: torch.Tensor, context: int) -> torch.Tensor:
    """Sequences' K or V read through their tables into ``[num_seqs, Hkv, context, D]``."""
    gathered = cache[block_table.long()].flatten(1, 2)[:, :context]
    return gathered.transpose(1, 2)


def decode_kernel_bandwidth(
    batch: int = 64,
    context: int = 2048,
    *,
    q_heads: int = 9,
    kv_heads: int = 3,
    head_dim: int = 64,
    block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cuda",
    copy_bytes: int = COPY_BYTES,
) -> dict:
    """Time one decode step of ``batch`` sequences of ``context`` tokens (SmolLM2's heads by default).

    Returns ``device``, the shape, ``num_splits``, ``ms`` (median), ``bytes`` (K/V read + q read + output
    written), ``gbps``, ``copy_gbps`` (measured in the same run), ``fraction`` (gbps / copy_gbps), ``goal``
    (0.6), ``meets_goal``, and ``rel_err`` of the kernel's output against a float64 reference on two sequences.
    Raises RuntimeError naming the problem when asked for CUDA without one.
    """
    device = torch.device(device)
    _require(device)
    from ..kernels.paged_attention import decode_num_splits, paged_attention
    from ..kernels.reference import reference_attention

    torch.manual_seed(0)
    k_cache, v_cache, block_table = random_paged_cache(batch, context, kv_heads, head_dim, block_size, dtype, device)
    q = torch.randn(batch, q_heads, head_dim, device=device, dtype=dtype)
    query_start_loc = torch.arange(batch + 1, device=device, dtype=torch.int32)
    seq_lens = torch.full((batch,), context, device=device, dtype=torch.int32)

    def step() -> torch.Tensor:
        return paged_attention(
            q, k_cache, v_cache, block_table, query_start_loc, seq_lens, max_query_len=1, max_seq_len=context
        )

    out = step()
    checked = min(batch, 2)
    heads_first = q[:checked, :, None].double()
    k, v = (_dense(cache, block_table[:checked], context).double() for cache in (k_cache, v_cache))
    ref = reference_attention(heads_first, k, v, causal=True)[:, :, 0]
    rel_err = ((out[:checked].double() - ref).norm() / ref.norm()).item()

    ms = _median_ms(step, device)
    element = torch.finfo(dtype).bits // 8
    moved = (2 * batch * context * kv_heads * head_dim + 2 * batch * q_heads * head_dim) * element
    gbps = moved / (ms * 1e-3) / 1e9
    copy_gbps = copy_bandwidth_gbps(copy_bytes, device)
    return {
        "device": _device_name(device),
        "batch": batch,
        "context": context,
        "q_heads": q_heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "block_size": block_size,
        "dtype": str(dtype).removeprefix("torch."),
        "num_splits": decode_num_splits(batch, kv_heads, context, q.device),
        "ms": ms,
        "bytes": moved,
        "gbps": gbps,
        "copy_gbps": copy_gbps,
        "fraction": gbps / copy_gbps,
        "goal": BANDWIDTH_GOAL,
        "meets_goal": gbps / copy_gbps >= BANDWIDTH_GOAL,
        "rel_err": rel_err,
    }


def prefill_kernel_tflops(
    num_seqs: int = 4,
    seq_len: int = 2048,
    *,
    q_heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cuda",
) -> dict:
    """Causal prefill of ``num_seqs`` fresh sequences of ``seq_len`` tokens: our varlen paged kernel (K/V read
    through block tables) against torch SDPA on the same K/V stored densely (heads repeated for SDPA, outside
    the timing). Returns ``ours_tflops``, ``sdpa_tflops``, ``ratio`` (ours / SDPA) and ``rel_err`` (ours vs
    SDPA's output). Raises RuntimeError naming the problem when asked for CUDA without one."""
    device = torch.device(device)
    _require(device)
    import torch.nn.functional as F

    from ..kernels.flash_attention import flops
    from ..kernels.paged_attention import paged_attention

    torch.manual_seed(0)
    k_cache, v_cache, block_table = random_paged_cache(num_seqs, seq_len, kv_heads, head_dim, block_size, dtype, device)
    q = torch.randn(num_seqs * seq_len, q_heads, head_dim, device=device, dtype=dtype)
    query_start_loc = torch.arange(0, num_seqs * seq_len + 1, seq_len, device=device, dtype=torch.int32)
    seq_lens = torch.full((num_seqs,), seq_len, device=device, dtype=torch.int32)
    dense_q = q.view(num_seqs, seq_len, q_heads, head_dim).transpose(1, 2).contiguous()
    group = q_heads // kv_heads
    dense_k, dense_v = (
        _dense(cache, block_table, seq_len).repeat_interleave(group, dim=1).contiguous() for cache in (k_cache, v_cache)
    )

    def ours() -> torch.Tensor:
        return paged_attention(
            q, k_cache, v_cache, block_table, query_start_loc, seq_lens, max_query_len=seq_len, max_seq_len=seq_len
        )

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(dense_q, dense_k, dense_v, is_causal=True)

    theirs = sdpa().transpose(1, 2).reshape(q.shape).double()
    rel_err = ((ours().double() - theirs).norm() / theirs.norm()).item()
    work = num_seqs * flops(1, q_heads, seq_len, seq_len, head_dim, causal=True)
    ours_tflops = work / (_median_ms(ours, device) * 1e-3) / 1e12
    sdpa_tflops = work / (_median_ms(sdpa, device) * 1e-3) / 1e12
    return {
        "device": _device_name(device),
        "num_seqs": num_seqs,
        "seq_len": seq_len,
        "q_heads": q_heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "dtype": str(dtype).removeprefix("torch."),
        "ours_tflops": ours_tflops,
        "sdpa_tflops": sdpa_tflops,
        "ratio": ours_tflops / sdpa_tflops,
        "rel_err": rel_err,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m solutions.bench.paged_attention", description=__doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA)
        return 0
    decode_rows = ["batch  context  heads(q/kv/D)  splits      ms     GB/s  copy GB/s  of copy  goal  rel err"]
    for batch in args.batches:
        for context in args.contexts:
            r = decode_kernel_bandwidth(batch, context)
            decode_rows.append(
                f"{batch:5d} {context:8d}  {r['q_heads']:>5d}/{r['kv_heads']}/{r['head_dim']:<5d} {r['num_splits']:6d} "
                f"{r['ms']:7.3f} {r['gbps']:8.0f} {r['copy_gbps']:10.0f} {r['fraction']:8.0%}  "
                f"{'met' if r['meets_goal'] else 'MISS'} {r['rel_err']:8.1e}"
            )
            print(decode_rows[-1], flush=True)
    prefill_rows = ["seqs x len   heads(q/kv/D)  ours TF/s  sdpa TF/s  ours/sdpa  rel err"]
    for q_heads, kv_heads, head_dim in ((9, 3, 64), (32, 8, 128)):
        r = prefill_kernel_tflops(q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim)
        prefill_rows.append(
            f"{r['num_seqs']:4d} x {r['seq_len']:<5d} {q_heads:>5d}/{kv_heads}/{head_dim:<5d} "
            f"{r['ours_tflops']:10.1f} {r['sdpa_tflops']:10.1f} {r['ratio']:10.2f} {r['rel_err']:8.1e}"
        )
        print(prefill_rows[-1], flush=True)
    print(
        f"\nPaged decode (bf16, block 16, goal >= {BANDWIDTH_GOAL:.0%} of copy bandwidth) on {torch.cuda.get_device_name()}:"
    )
    print("\n".join(decode_rows))
    print("\nVarlen paged prefill, causal, bf16, beside torch SDPA:")
    print("\n".join(prefill_rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
