"""Sizing the paged KV cache at start-up: what is left of the device's memory once the steps themselves have
what they will hold (an eager step's activations, the decode graphs' pool and their static buffers).

On a CUDA device the budget is ``free - (1 - gpu_memory_utilization) * total`` minus::

    eager step     one forward of max_num_batched_tokens tokens, measured (attention stubbed)
    graph pool     one forward of the largest bucket, measured the same way (buckets share one pool), plus
                   the decode kernel's split-K scratch of one layer at the bucket that needs the most
                   (``split_scratch_bytes``: the stub allocates none)
    graph outputs  the one static logits + hidden buffer every bucket writes into, counted exactly
                   (``GraphOutputs.bytes_for``; a test checks it against what capture allocates)

On a CPU the budget is ``CPU_KV_CACHE_BYTES`` unless ``kv_cache_memory`` names one.
"""

from __future__ import annotations

import logging

import torch

from ..cache.paged_kv_cache import PagedKVCache
from ..config import EngineConfig
from ..kernels.blocks import cdiv
from ..kernels.paged_attention import decode_num_splits
from ..model.config import ModelConfig
from ..model.llama import LlamaModel
from .cuda_graphs import GraphOutputs, batch_buckets

log = logging.getLogger("fastmode")
CPU_KV_CACHE_BYTES = 1 << 30  # a laptop holds 1 GiB of KV cache: 23k tokens of SmolLM2-135M in float32


def graph_bytes(c: ModelConfig, dtype: torch.dtype, max_bucket: int, max_model_len: int, device) -> int:
    """What the decode graphs hold beyond one stubbed forward of their largest bucket, ``max_bucket`` tokens:
    their shared outputs, and the split-K scratch (partial outputs and log-sum-exps, float32) of the bucket
    that needs most."""
    buckets = batch_buckets(max_bucket)
    outputs = GraphOutputs.bytes_for(buckets[-1], c.vocab_size, c.hidden_size, dtype)
    return outputs + max(
        split_scratch_bytes(c, b, decode_num_splits(b, c.num_kv_heads, max_model_len, device))
        for b in buckets
    )


def split_scratch_bytes(c: ModelConfig, rows: int, num_splits: int) -> int:
    """One decode attention's scratch: ``[rows, q_heads, splits, head_dim]`` partial outputs and ``[rows,
    q_heads, splits]`` log-sum-exps, float32; none with one split (the kernel writes its output)."""
    return 0 if num_splits == 1 else rows * c.num_heads * num_splits * (c.head_dim + 1) * 4


def allocate_kv_cache(model: LlamaModel, cfg: EngineConfig, max_model_len: int) -> PagedKVCache:
    """Size the paged cache from the budget; fail now if one ``max_model_len`` sequence cannot fit.

    The cache holds the model's dtype, except a bfloat16 model on a CPU keeps a float32 cache:
    torch's fused CPU attention runs several times slower in bfloat16 than in float32 for one decode
    query over 64-1024 keys, and the K/V are a small share of a decode step's bytes at this model's size.
    Its heads are the model's own: under tensor parallelism, this rank's KV heads (every rank holds
    the same blocks)."""
    c = model.config
    dtype = model.norm.weight.dtype
    if dtype == torch.bfloat16 and not cfg.device.startswith("cuda"):
        dtype = torch.float32
    per_block = PagedKVCache.bytes_per_block(
        c.num_layers, cfg.kv_block_size, c.num_kv_heads, c.head_dim, dtype
    )
    budget = cfg.kv_cache_memory
    if budget is None and cfg.device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(cfg.device))
        activations = activation_bytes(model, max_model_len, cfg.max_num_batched_tokens, cfg.max_logits_rows)
        graphs = 0
        if not cfg.enforce_eager:
            largest = min(cfg.max_graph_rows, cfg.max_num_batched_tokens)  # the runner's largest bucket
            graphs = activation_bytes(model, max_model_len, largest, largest)
            graphs += graph_bytes(
                c, model.norm.weight.dtype, largest, max_model_len, model.norm.weight.device
            )
        budget = int(free - (1 - cfg.gpu_memory_utilization) * total) - activations - graphs
        log.info(
            "GPU memory held back from the KV cache: %.0f MiB for a step's activations, %.0f MiB for graphs",
            activations / 2**20,
            graphs / 2**20,
        )
    elif budget is None:
        budget = CPU_KV_CACHE_BYTES
    num_blocks = budget // per_block
    blocks_per_seq = cdiv(max_model_len, cfg.kv_block_size)
    if num_blocks < blocks_per_seq + 1:  # + the null block
        needed = (blocks_per_seq + 1) * per_block
        raise ValueError(
            f"the KV cache budget of {budget:,} bytes holds {num_blocks} blocks, but one sequence "
            f"of max_model_len={max_model_len} tokens needs {needed:,} bytes ({blocks_per_seq} "
            f"blocks of {cfg.kv_block_size} tokens, {per_block:,} bytes each, plus the null block): "
            f"raise kv_cache_memory to at least {needed:,} or lower max_model_len"
        )
    log.info(
        "KV cache: %d blocks of %d tokens (%.0f MiB); %.1f sequences of max_model_len=%d fit",
        num_blocks,
        cfg.kv_block_size,
        num_blocks * per_block / 2**20,
        (num_blocks - 1) / blocks_per_seq,
        max_model_len,
    )
    device = model.norm.weight.device
    return PagedKVCache(
        c.num_layers, num_blocks, cfg.kv_block_size, c.num_kv_heads, c.head_dim, dtype, device
    )


@torch.inference_mode()
def activation_bytes(model: LlamaModel, max_model_len: int, num_tokens: int, num_logits: int) -> int:
    """Peak CUDA memory one eager forward of ``num_tokens`` tokens, ``num_logits`` of them wanting logits,
    takes beyond what is allocated now (its attention stands in for the kernels, which write into the
    cache and allocate only their output)."""
    device = model.norm.weight.device
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    ids = torch.zeros(num_tokens, dtype=torch.int32, device=device)
    positions = torch.arange(num_tokens, dtype=torch.int32, device=device) % max_model_len
    hidden = model(ids, positions, lambda layer, q, k, v: q.clone())
    model.logits(hidden[-num_logits:])
    del hidden
    return torch.cuda.max_memory_allocated(device) - before
