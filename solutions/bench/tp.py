"""What ``python -m solutions bench tp`` measures and predicts with (``cli/bench/tp.py``; notebook 09 uses the
same): the traffic of one decode token at N ranks (bytes all-reduced, weight bytes each rank reads,
collectives per step), the tensor-parallel sizes a model splits into, and a bandwidth model of batch-1 decode
on N H200s over NVLink or PCIe (kernel launches left out)::

    step = W / (N HBM) + (2L + 1) (latency + 2 (N-1)/N hidden bytes / link)
                       + latency + (N-1)/N logits bytes / link

The bandwidths are the parts' specifications; the latency of one small collective is an assumption the
caller passes (measure it on your machine: nccl-tests' ``all_reduce_perf -b 8K``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels.blocks import cdiv
from .model_shapes import ModelShape

H200_HBM_BYTES_S = 4.8e12  # H200 SXM: 4.8 TB/s of HBM3e
NVLINK_BYTES_S = 450e9  # NVLink 4 on an H200: 900 GB/s both directions, 450 GB/s each way
PCIE_BYTES_S = 64e9  # PCIe Gen5 x16: 128 GB/s both directions, 64 GB/s each way


@dataclass(frozen=True)
class Traffic:
    """What one decode token costs a rank at ``world_size`` ranks: weight bytes it reads, bytes it all-reduces
    (the messages' size, before the ring's ``2 (N - 1) / N``), and the collectives per step."""

    weight_bytes: int
    all_reduce_bytes: int
    gather_bytes: int
    collectives: int


def traffic(shape: ModelShape, world_size: int, itemsize: int) -> Traffic:
    """Per token at batch 1: each rank reads its shard of every linear and of the LM head, and every norm
    whole; the embedding lookup reads one row. All-reduces: the embedding and two per layer, ``hidden`` values
    each; the gather brings rank 0 the other ranks' ``V / N`` logits."""
    h, d, n = shape.hidden_size, shape.head_dim, world_size
    q, kv, inter = shape.num_heads * d, shape.num_kv_heads * d, shape.intermediate_size
    per_layer = (q + 2 * kv) * h + h * q + 2 * inter * h + inter * h
    linear = shape.num_layers * per_layer // n + cdiv(shape.vocab_size, n) * h
    norms = (2 * shape.num_layers + 1) * h
    all_reduced = (2 * shape.num_layers + 1) * h if n > 1 else 0
    gather = (n - 1) * cdiv(shape.vocab_size, n) if n > 1 else 0
    collectives = 2 * shape.num_layers + 2 if n > 1 else 0
    return Traffic((linear + norms + h) * itemsize, all_reduced * itemsize, gather * itemsize, collectives)


def predicted_tokens_per_s(
    shape: ModelShape,
    world_size: int,
    link_bytes_s: float,
    latency_s: float,
    hbm_bytes_s: float = H200_HBM_BYTES_S,
) -> float:
    """Batch-1 decode tokens/s of ``shape`` in bfloat16 on ``world_size`` GPUs (H200s unless ``hbm_bytes_s``
    says otherwise) joined by a link of ``link_bytes_s`` each way: the weights from HBM, then each all-reduce
    (a ring: every GPU sends ``2 (N - 1) / N`` of the message) and the logits gather, each also paying
    ``latency_s``."""
    t = traffic(shape, world_size, 2)
    step = t.weight_bytes / hbm_bytes_s
    if world_size > 1:
        ring = 2 * (world_size - 1) / world_size
        all_reduces = 2 * shape.num_layers + 1
        step += all_reduces * latency_s + ring * t.all_reduce_bytes / link_bytes_s
        step += latency_s + t.gather_bytes / link_bytes_s
    return 1 / step


@dataclass
class Measured:
    model: str
    world_size: int
    tokens_per_s: float
    ms_per_step: float
    traffic: Traffic


def tensor_parallel_sizes(shape: ModelShape, most: int = 8) -> list[int]:
    """The sizes up to ``most`` that split the shape into whole heads."""
    fits = lambda n: (
        shape.num_heads % n == 0 and shape.num_kv_heads % n == 0 and shape.intermediate_size % n == 0
    )  # noqa: E731
    return [n for n in range(1, most + 1) if fits(n)]
