"""What ``python -m solutions bench kernels`` measures with (``cli/bench/kernels.py``): each fused layer op
(``kernels/fused_ops.py``) beside the plain torch chain it replaces, graph-replayed, with the bytes it moves
against copy bandwidth; one decoder layer's decode step with each ops set, and the kernels it launches."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..cache.paged_kv_cache import AttentionMetadata, PagedAttention, PagedKVCache
from ..kernels import fused_ops
from ..kernels.blocks import cache_slots, cdiv
from ..kernels.store_kv import store_kv
from ..model.config import ModelConfig
from ..model.layer_ops import triton_layer_ops
from ..model.llama import PLAIN_OPS, DecoderLayer, use_layer_ops
from .paged_attention import graphed
from .timing import median_ms

# (hidden, query heads, KV heads, head dim, intermediate)
SHAPES = {"135M": (576, 9, 3, 64, 1536), "1.7B": (2048, 32, 32, 64, 8192)}
LAUNCH_GOAL = 10  # kernels per decoder layer in a decode step, at most


def op_calls(
    shape: tuple[int, int, int, int, int], tokens: int, dtype: torch.dtype, device: torch.device
) -> dict[str, tuple[Callable, Callable, int]]:
    """Per fused op at ``shape`` and ``tokens`` rows: (fused call, plain call, bytes the fused one moves)."""
    hidden, q_heads, kv_heads, head_dim, inter = shape
    element = torch.finfo(dtype).bits // 8
    x, residual = torch.randn(2, tokens, hidden, device=device, dtype=dtype)
    weight = torch.randn(hidden, device=device, dtype=dtype)
    qkv = torch.randn(tokens, q_heads + 2 * kv_heads, head_dim, device=device, dtype=dtype)
    cos, sin = torch.randn(2, tokens, head_dim, device=device, dtype=dtype)
    block_size = 16
    k_cache, v_cache = torch.zeros(
        2, cdiv(tokens, block_size) + 1, block_size, kv_heads, head_dim, device=device, dtype=dtype
    )
    slots = torch.arange(block_size, block_size + tokens, device=device)  # block 0 is the null block
    gate_up = torch.randn(tokens, 2 * inter, device=device, dtype=dtype)
    rotated = q_heads + kv_heads

    def plain_rope_store() -> torch.Tensor:
        q, k = PLAIN_OPS.rope(qkv[:, :rotated], cos, sin).split([q_heads, kv_heads], dim=1)
        store_kv(k, qkv[:, rotated:], k_cache, v_cache, slots)
        return q

    return {
        "add_rms_norm": (
            lambda: fused_ops.add_rms_norm(x, residual, weight, 1e-5)[0],
            lambda: PLAIN_OPS.add_rms_norm(x, residual, weight, 1e-5)[0],
            (4 * tokens * hidden + hidden) * element,
        ),
        "rope_store_kv": (
            lambda: fused_ops.rope_store_kv(qkv, cos, sin, k_cache, v_cache, slots),
            plain_rope_store,
            # reads q, k, v, cos, sin; writes q, and k and v into the cache
            (tokens * (2 * q_heads + 4 * kv_heads) * head_dim + 2 * tokens * head_dim) * element,
        ),
        "silu_mul": (
            lambda: fused_ops.silu_mul(gate_up),
            lambda: PLAIN_OPS.silu_mul(gate_up),
            3 * tokens * inter * element,
        ),
    }


def op_rows(
    shapes: dict, token_counts: list[int], dtype: torch.dtype, device: torch.device, copy_gbps: float
) -> list[str]:
    """Per op and shape: fused vs plain time, and the fused kernel's GB/s against copy bandwidth."""
    rows = ["shape  tokens  op              fused us  plain us  plain/fused    GB/s  of copy"]
    for name, shape in shapes.items():
        for tokens in token_counts:
            for op, (fused, plain, moved) in op_calls(shape, tokens, dtype, device).items():
                fused_ms = median_ms(graphed(fused, device), device, 3)
                plain_ms = median_ms(graphed(plain, device), device, 3)
                gbps = moved / (fused_ms * 1e-3) / 1e9
                rows.append(
                    f"{name:5s} {tokens:7d}  {op:14s} {fused_ms * 1e3:9.1f} {plain_ms * 1e3:9.1f} "
                    f"{plain_ms / fused_ms:11.2f}x {gbps:7.0f} {gbps / copy_gbps:8.0%}"
                )
                print(rows[-1], flush=True)
    return rows


def decode_layer(
    shape: tuple[int, int, int, int, int], batch: int, context: int, dtype: torch.dtype, device: torch.device
) -> tuple[DecoderLayer, Callable[[], torch.Tensor]]:
    """One random decoder layer of ``shape`` and a decode step's inputs for it (``batch`` sequences of
    ``context`` tokens over a paged cache): returns ``(layer, run)``, ``run()`` calling the layer once."""
    hidden, q_heads, kv_heads, head_dim, inter = shape
    config = ModelConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=inter, num_layers=1, num_heads=q_heads,
        num_kv_heads=kv_heads, head_dim=head_dim, rope_theta=10000.0, rms_norm_eps=1e-5,
        max_position_embeddings=context + 1, tie_word_embeddings=True,
    )  # fmt: skip
    layer = DecoderLayer(config, 0).to(device=device, dtype=dtype)
    for linear in (m for m in layer.modules() if isinstance(m, torch.nn.Linear)):  # unit-variance outputs
        linear.weight.data.mul_(linear.in_features**-0.5 / linear.weight.std())
    block_size = 16
    blocks_per_seq = cdiv(context + 1, block_size)
    cache = PagedKVCache(1, batch * blocks_per_seq + 1, block_size, kv_heads, head_dim, dtype, device)
    block_table = (torch.arange(batch * blocks_per_seq, device=device) + 1).view(batch, -1).int()
    positions = torch.full((batch,), context, device=device)
    slots = cache_slots(block_table.long(), positions, block_size, rows=torch.arange(batch, device=device))
    meta = AttentionMetadata(
        slot_mapping=slots,
        block_table=block_table,
        query_start_loc=torch.arange(batch + 1, device=device, dtype=torch.int32),
        seq_lens=torch.full((batch,), context + 1, device=device, dtype=torch.int32),
        max_query_len=1,
        max_seq_len=context + 1,
    )
    attend = PagedAttention(cache, meta, backend="triton")
    hidden_in, residual = torch.randn(2, batch, hidden, device=device, dtype=dtype)
    angles = positions[:, None].float() * torch.rand(head_dim, device=device)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def run() -> torch.Tensor:
        return layer(hidden_in, residual, cos, sin, attend)[0]

    return layer, run


class _OperatorLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:  # a view computes nothing: it reinterprets its input's memory
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def dispatched_ops(fn: Callable[[], object]) -> list[str]:
    """The aten operators one call of ``fn`` runs, in order, views left out: in eager torch on a GPU each is
    one kernel launch and one pass over its tensors (any device; a Triton kernel is not an aten operator)."""
    with _OperatorLog() as log:
        fn()
    return log.names


def count_kernels(run: Callable[[], torch.Tensor]) -> int:
    """Device kernels one call of ``run`` launches (torch.profiler, CUDA only)."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def layer_rows(
    shapes: dict, batches: list[int], context: int, dtype: torch.dtype, device: torch.device
) -> list[str]:
    """One decoder layer of a decode step with PLAIN_OPS and with the Triton set: time, kernels launched."""
    rows = ["shape  batch  ops      layer us  kernels  goal"]
    for name, shape in shapes.items():
        for batch in batches:
            layer, run = decode_layer(shape, batch, context, dtype, device)
            for ops in (PLAIN_OPS, triton_layer_ops()):
                use_layer_ops(layer, ops)
                # The first eager call tunes the attention for this shape, before any graph is captured.
                kernels = count_kernels(run) if device.type == "cuda" else None
                ms = median_ms(graphed(run, device), device, 3)
                met = None if kernels is None or ops is PLAIN_OPS else kernels <= LAUNCH_GOAL
                rows.append(
                    f"{name:5s} {batch:6d}  {ops.name:7s} {ms * 1e3:9.1f} {kernels or '-':>8}  "
                    f"{'-' if met is None else ('met' if met else 'MISS')}"
                )
                print(rows[-1], flush=True)
    return rows
