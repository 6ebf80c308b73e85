"""Decode steps replayed from CUDA graphs (nano-vllm's ``capture_cudagraph``, SGLang's ``cuda_graph_runner``).

A decode step launches hundreds of small kernels; launched one by one from Python, the GPU waits for the host
between them. A CUDA graph records the launches of one forward pass once and replays them with one call. Its
inputs and outputs are fixed addresses, so each graph serves one number of tokens, its bucket: graphs are
captured at start-up for a few buckets (1, 2, 4, 8, then steps of 8 up to 64 and of 16 beyond, up to the most
tokens a step may replay, ``EngineConfig.max_graph_rows``), largest first into one shared memory pool, and a
step of ``n`` tokens replays the smallest bucket ``>= n`` with ``bucket - n`` padding tokens (which write no
cache slot and read only the null block; their outputs are dropped).

Each of a bucket's tokens is one query that wants its logits, a sequence of its own: a decode, or one token
of a draft chain being verified (a request verifying ``k`` drafts fills ``1 + k`` of them, each attending to
the context up to its own position, which is causal attention over the chain). So speculative steps that
verify chains replay the same graphs.

The capture and replay logic does not depend on CUDA: ``RecordedCall`` stands in for ``torch.cuda.CUDAGraph``
on a CPU (capture records the function over the static buffers, replay calls it again), so tests check that
graphs replay exactly what eager steps compute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

log = logging.getLogger("fastmode")


def batch_buckets(max_bucket: int) -> list[int]:
    """The bucket sizes that get a graph: 1, 2, 4, 8, 16, 24, ..., 64, 80, 96, ..., ending at
    ``max_bucket``."""
    buckets = [b for b in (1, 2, 4) if b < max_bucket]
    size = 8
    while size < max_bucket:
        buckets.append(size)
        size += 8 if size < 64 else 16
    return [*buckets, max_bucket]


Outputs = tuple[torch.Tensor, ...]


class GraphOutputs:
    """The one pair of static outputs every decode graph writes into (nano-vllm's ``outputs[:bs]``): logits
    ``[max_bucket, vocab]`` float32 and hidden states ``[max_bucket, hidden]``; bucket ``b`` writes the first
    ``b`` rows of each. Its own temporaries then die with its capture, so the graphs' shared pool holds one
    forward's activations, not every bucket's outputs. Invariant: ``nbytes == bytes_for(...)`` of its shape,
    which is what the KV sizing holds back for it (``kv_sizing``)."""

    def __init__(self, max_bucket: int, vocab: int, hidden: int, dtype: torch.dtype, device: torch.device):
        self.logits = torch.empty(max_bucket, vocab, dtype=torch.float32, device=device)
        self.hidden = torch.empty(max_bucket, hidden, dtype=dtype, device=device)

    @staticmethod
    def bytes_for(max_bucket: int, vocab: int, hidden: int, dtype: torch.dtype) -> int:
        return max_bucket * (vocab * 4 + hidden * dtype.itemsize)

    @property
    def nbytes(self) -> int:
        return self.logits.nbytes + self.hidden.nbytes

    def write(self, logits: torch.Tensor, hidden: torch.Tensor) -> Outputs:
        """Copy one bucket's results into its first rows and return those rows (views: valid until the next
        replay)."""
        bucket = logits.shape[0]
        self.logits[:bucket].copy_(logits)
        self.hidden[:bucket].copy_(hidden)
        return self.logits[:bucket], self.hidden[:bucket]


class CudaGraph:
    """A captured forward pass on CUDA: ``capture(fn)`` records ``fn``'s launches into ``pool``, ``replay()``
    relaunches them and returns the same output tensors, now holding the new results."""

    def __init__(self, pool):
        self.pool = pool
        self.graph = torch.cuda.CUDAGraph()
        self.outputs: Outputs = ()

    def capture(self, fn: Callable[[], Outputs]) -> Outputs:
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.outputs = fn()
        return self.outputs

    def replay(self) -> Outputs:
        self.graph.replay()
        return self.outputs


class RecordedCall:
    """The CPU stand-in for ``CudaGraph``: capture keeps ``fn`` and its output tensors;
    replay runs ``fn`` again (reading the same static input buffers) and writes the results into those
    same tensors, as a graph would."""

    def __init__(self, pool=None):
        self.fn: Callable[[], Outputs] | None = None
        self.outputs: Outputs = ()

    def capture(self, fn: Callable[[], Outputs]) -> Outputs:
        self.fn = fn
        self.outputs = fn()
        return self.outputs

    def replay(self) -> Outputs:
        for static, new in zip(self.outputs, self.fn()):
            static.copy_(new)
        return self.outputs


class DecodeGraphs:
    """One captured decode forward per bucket. ``forward(bucket)`` runs the model on the static inputs
    of that bucket and returns its outputs (the runner's: the first ``bucket`` rows of its ``GraphOutputs``);
    ``warm_up(bucket)`` fills the inputs with a valid batch (padding only) first, since a graph records
    the kernels its first run chooses. ``captures`` says what each bucket's capture cost, in capture order:
    ``{"bucket", "seconds", "MiB"}`` (device memory it added; None for the CPU stand-in)."""

    def __init__(
        self,
        buckets: list[int],
        forward: Callable[[int], Outputs],
        warm_up: Callable[[int], None],
        graph_type: type = CudaGraph,
    ):
        self.buckets = sorted(buckets)
        self.graphs: dict[int, CudaGraph | RecordedCall] = {}
        self.captures: list[dict] = []
        on_cuda = graph_type is CudaGraph
        pool = torch.cuda.graph_pool_handle() if on_cuda else None
        for bucket in reversed(self.buckets):  # largest first: smaller graphs reuse its pool memory
            start = time.perf_counter()
            used_before = torch.cuda.memory_allocated() if on_cuda else 0
            warm_up(bucket)
            forward(bucket)  # eager first: kernels compile outside the capture
            graph = graph_type(pool)
            graph.capture(lambda bucket=bucket: forward(bucket))
            self.graphs[bucket] = graph
            if on_cuda:
                torch.cuda.synchronize()
            mib = (torch.cuda.memory_allocated() - used_before) / 2**20 if on_cuda else None
            self.captures.append({"bucket": bucket, "seconds": time.perf_counter() - start, "MiB": mib})
        log.info(
            "captured %d decode graphs (batch %s) in %.1f s, %s MiB of graph memory",
            len(self.buckets),
            ",".join(map(str, self.buckets)),
            self.capture_seconds,
            "-" if not on_cuda else f"{sum(c['MiB'] for c in self.captures):.0f}",
        )

    @property
    def capture_seconds(self) -> float:
        return sum(c["seconds"] for c in self.captures)

    def bucket_for(self, num_tokens: int) -> int | None:
        """The smallest bucket that holds ``num_tokens`` tokens, or None when they are more than every graph
        holds."""
        return next((b for b in self.buckets if b >= num_tokens), None)

    def replay(self, bucket: int) -> Outputs:
        """The outputs of the tokens now in the bucket's static inputs (valid until the next replay)."""
        return self.graphs[bucket].replay()
