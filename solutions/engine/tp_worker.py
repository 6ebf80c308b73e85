"""A worker: ranks 1 .. N-1 of a tensor-parallel engine, each in its own process, started by the executor.

    run_worker(rank):  "joining" -> join the process group -> load this rank's shard -> "loaded"
                       <- WorkerSetup (rank 0's KV cache size and dtype, its CPU linear choices)
                       allocate this rank's KV cache (its KV heads, the same blocks as rank 0's) -> "ready"
                       loop: <- StepHeader; receive the packed inputs (broadcast); copy blocks; forward
                       <- None: leave the group and return

A worker holds no scheduler, block manager or sampler: rank 0 decides everything and the worker runs the same
forward as rank 0 over the same inputs, on its own shard. It ends when told, when rank 0's process ends (its
end of the pipe closes, so the wait for the next step raises ``EOFError``), and when anything fails: it
reports the traceback through the pipe and exits with code 1, which closes its sockets, so the other ranks'
collectives fail at once instead of waiting.
"""

from __future__ import annotations

import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from ..cache.paged_kv_cache import PagedKVCache
from ..config import EngineConfig
from ..kernels.cpu_linear import use_linear_decisions
from ..model.loader import load_weights
from ..parallel.group import TensorParallelGroup, rank_device
from ..parallel.sharded_model import build_shard
from .runner import ModelRunner


@dataclass(frozen=True)
class WorkerSetup:
    """What rank 0 settles after loading, for every rank to match: the KV cache's blocks and dtype, the
    context limit, and (on a CPU) the linear paths rank 0 measured for the shards' shapes."""

    num_blocks: int
    cache_dtype: torch.dtype
    max_model_len: int
    linear_decisions: dict[str, dict]


def run_worker(rank: int, config: EngineConfig, store_port: int, conn: Connection) -> None:
    """The process body of worker ``rank`` (``torch.multiprocessing`` spawn target)."""
    # Ctrl-C in a terminal reaches every process of the group: rank 0 handles it and tells the workers to
    # stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # N processes share the machine's cores: one thread each unless told, so they do not oversubscribe them.
    torch.set_num_threads(config.num_threads or 1)
    device = rank_device(config.device, rank)
    try:
        conn.send(("joining", None))
        group = TensorParallelGroup.join(rank, config.tensor_parallel_size, store_port, device)
        weights = load_weights(config.model, load_tokenizer=False)
        model = build_shard(config, weights, group)
        conn.send(("loaded", None))
        setup: WorkerSetup = conn.recv()
        if device.type == "cpu":  # rank 0's measured paths: the shards have rank 0's shapes
            use_linear_decisions(model, setup.linear_decisions)
        cache = PagedKVCache(
            model.config.num_layers,
            setup.num_blocks,
            config.kv_block_size,
            model.config.num_kv_heads,
            model.config.head_dim,
            setup.cache_dtype,
            device,
        )
        runner = ModelRunner(
            model,
            cache,
            config.max_num_seqs,
            setup.max_model_len,
            config.max_num_batched_tokens,
            config.attention_backend,
        )
        group.alone = False
        conn.send(("ready", None))
        serve_steps(conn, group, runner)
    except EOFError:
        return  # rank 0's process is gone: nobody is left to serve
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        # Exit without leaving the group (a collective with a dead peer could wait): exiting closes the
        # sockets.
        sys.exit(1)
    group.leave()


@torch.inference_mode()
def serve_steps(conn: Connection, group: TensorParallelGroup, runner: ModelRunner) -> None:
    """Run rank 0's steps on this rank's shard until rank 0 sends None."""
    buffer = runner.batch.staging.device
    while (header := conn.recv()) is not None:
        inputs = header.step_inputs(group.broadcast(buffer[: header.layout.total]))
        runner.cache.copy_blocks(list(header.block_copies))
        runner.forward(inputs)
