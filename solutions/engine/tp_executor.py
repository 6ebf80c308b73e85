"""Rank 0's side of tensor parallelism: start the workers, build rank 0's shard, send every step, stop them.

    TensorParallelExecutor(config, weights)    check that the model splits (before any process starts),
                                               open the store, spawn ranks 1 .. N-1, join the group, build
                                               rank 0's shard
    start(cache, runner)                       once the engine has sized its KV cache: each worker allocates
                                               the same blocks for its KV heads; the runner then calls
                                               broadcast_step
    broadcast_step(block_copies, inputs, buf)  each step, before rank 0's forward: check that the workers are
                                               alive, send the step's header through each pipe, broadcast
                                               the packed inputs
    shutdown()                                 tell the workers to stop, wait, terminate what is left

Rank 0 keeps the scheduler, the KV block manager, the sampler and the detokenizer: the workers only run
forwards. No process outlives the engine: ``shutdown`` runs when ``LLM.shutdown()`` is called, when the
executor is garbage collected, and at interpreter exit; a worker whose rank 0 died sees its pipe close and
exits; a worker that dies makes the next step (or the collective in flight) raise a ``TensorParallelError``
naming it, and the executor then stops the others. Workers are spawned, so a script that builds a
tensor-parallel ``LLM`` at import time must do it under ``if __name__ == "__main__":`` (spawn imports the main
module again in each worker).
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

import torch
import torch.distributed as dist

from ..cache.paged_kv_cache import PagedKVCache
from ..config import EngineConfig
from ..model.loader import LoadedWeights
from ..parallel.group import COLLECTIVE_TIMEOUT, TensorParallelError, TensorParallelGroup, rank_device
from ..parallel.shard import check_shardable
from ..parallel.sharded_model import build_shard
from .input_batch import StepInputs
from .runner import ModelRunner
from .tp_step import StepHeader
from .tp_worker import WorkerSetup, run_worker

log = logging.getLogger("fastmode")
# Loading a large shard takes a while; a worker that dies during start-up is noticed at once regardless.
STARTUP_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 10.0  # a worker told to stop gets this long before it is terminated


class TensorParallelExecutor:
    """Rank 0 of ``config.tensor_parallel_size`` ranks. ``model`` is rank 0's shard; ``processes`` the
    workers'.

    Invariant: while the executor runs, every worker has run exactly the steps rank 0 has, in the same order;
    once anything fails (``failure``), no further step is sent and every worker is stopped."""

    def __init__(self, config: EngineConfig, weights: LoadedWeights):
        world = config.tensor_parallel_size
        check_shardable(weights.config, world)  # before any process starts: a bad size fails at once
        self.failure: str | None = None
        self.processes: list[BaseProcess] = []
        self.conns: list[Connection] = []
        # Port 0: the system picks a free one, so two engines on one machine never race for a port.
        self.store = dist.TCPStore(
            "127.0.0.1", 0, world, is_master=True, wait_for_workers=False, timeout=COLLECTIVE_TIMEOUT
        )
        self._grace = {"seconds": STOP_TIMEOUT_S}  # 0 once the workers are known to be stuck or gone
        self._stop = weakref.finalize(self, stop_workers, self.processes, self.conns, self._grace)
        context = torch.multiprocessing.get_context("spawn")
        try:
            for rank in range(1, world):
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=run_worker,
                    args=(rank, config, self.store.port, theirs),
                    name=f"fastmode-tp-rank-{rank}",
                    daemon=True,  # multiprocessing also ends daemons when this process exits
                )
                process.start()
                theirs.close()
                self.processes.append(process)
                self.conns.append(ours)
            self._expect("joining")
            self.group = TensorParallelGroup.join_store(0, world, self.store, rank_device(config.device, 0))
            self.group.describe_peers = functools.partial(describe_workers, self.processes)
            self.model = build_shard(config, weights, self.group)
            self._expect("loaded")
        except BaseException:
            self.shutdown()
            raise
        log.info("tensor parallelism: %d ranks on %s, workers %s", world, self.group.device, self.worker_pids)

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def start(self, cache: PagedKVCache, runner: ModelRunner) -> None:
        """Give every worker rank 0's KV cache size and dtype (each allocates the same blocks for its own KV
        heads), wait until all are ready, then have ``runner`` send each step to them."""
        setup = WorkerSetup(
            cache.num_blocks,
            cache.k.dtype,
            runner.max_model_len,
            dict(getattr(self.model, "linear_decisions", {})),
        )
        try:
            for conn in self.conns:
                conn.send(setup)
            self._expect("ready")
        except BaseException:
            self.shutdown()
            raise
        self.group.alone = False
        runner.step_broadcast = self.broadcast_step

    def broadcast_step(
        self, block_copies: list[tuple[int, int]], inputs: StepInputs, buffer: torch.Tensor
    ) -> None:
        """Send one step to every worker: its header through each pipe, then the packed inputs (``buffer``,
        whose first ``inputs.layout.total`` entries they are) over the process group."""
        self._check_workers()
        header = StepHeader.of(inputs, block_copies)
        try:
            for conn in self.conns:
                conn.send(header)
        except OSError:  # a worker's end of the pipe closed: it is gone
            self._check_workers(dying=True)
        self.group.step_open = True
        self.group.broadcast(buffer[: header.layout.total])

    def shutdown(self) -> None:
        """Stop every worker and leave the process group (idempotent)."""
        self._stop()
        self.failure = self.failure or "this engine's tensor-parallel workers were shut down"

    # -- watching the workers --------------------------------------------------------------------------------

    def _check_workers(self, dying: bool = False) -> None:
        """Raise (and stop the rest) if a worker has exited, an earlier collective failed or rank 0's previous
        step stopped half-way: the ranks would be out of step. ``dying``: a pipe just closed, so give its
        process a moment to be reaped."""
        if self.failure is None and self.group.failure is not None:
            self.failure = self.group.failure
        if self.failure is None and self.group.step_open:  # the workers still wait in its collectives
            self.failure = "rank 0's previous step stopped before its end (an error in its forward pass)"
        if self.failure is None and dying:
            deadline = time.monotonic() + 1.0
            while all(p.is_alive() for p in self.processes) and time.monotonic() < deadline:
                time.sleep(0.01)
        if self.failure is None and not all(p.is_alive() for p in self.processes):
            self.failure = f"a tensor-parallel worker exited ({describe_workers(self.processes)})"
        if self.failure is not None:
            self._grace["seconds"] = 0.0  # the workers wait in a collective or are gone: nobody reads "stop"
            self.shutdown()
            raise TensorParallelError(f"{self.failure}: this LLM cannot run; create a new one")

    def _expect(self, stage: str) -> None:
        """Wait until every worker has reported ``stage``. Raise, with the worker's traceback when it sent
        one, if a worker fails, dies or stays silent for ``STARTUP_TIMEOUT_S``."""
        rank_of = {conn: rank for rank, conn in enumerate(self.conns, start=1)}
        waiting = set(self.conns)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while waiting:
            sentinels = [p.sentinel for p in self.processes]
            ready = wait([*waiting, *sentinels], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                ranks = sorted(rank_of[c] for c in waiting)
                raise TensorParallelError(
                    f"tensor-parallel workers {ranks} did not report {stage!r} within "
                    f"{STARTUP_TIMEOUT_S:.0f} s"
                )
            for conn in [c for c in ready if c in waiting]:
                try:
                    kind, detail = conn.recv()
                except EOFError:
                    continue  # the process died: its sentinel says so below
                if kind == "error":
                    raise TensorParallelError(
                        f"tensor-parallel worker rank {rank_of[conn]} failed:\n{detail}"
                    )
                if kind != stage:
                    raise TensorParallelError(
                        f"worker rank {rank_of[conn]} reported {kind!r}, expected {stage!r}"
                    )
                waiting.discard(conn)
            if any(s in ready for s in sentinels):
                raise TensorParallelError(
                    f"a tensor-parallel worker exited before {stage!r} ({describe_workers(self.processes)})"
                )


def describe_workers(processes: list[BaseProcess]) -> str:
    """Each worker's state: "rank 1 running, rank 2 exited with code -9"."""
    states = []
    for rank, process in enumerate(processes, start=1):
        code = process.exitcode
        states.append(f"rank {rank} " + ("running" if code is None else f"exited with code {code}"))
    return ", ".join(states)


def stop_workers(processes: list[BaseProcess], conns: list[Connection], grace: dict[str, float]) -> None:
    """Tell each worker to stop, wait ``grace["seconds"]``, terminate (then kill) what is left, and leave the
    group. Runs once per executor (``weakref.finalize``): at shutdown, garbage collection or interpreter
    exit."""
    for conn in conns:
        try:
            conn.send(None)
        except OSError:
            pass
    deadline = time.monotonic() + grace["seconds"]
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for end in ("terminate", "kill"):
        for process in processes:
            if process.is_alive():
                getattr(process, end)()
                process.join(1.0)
    for conn in conns:
        conn.close()
    if dist.is_initialized():
        dist.destroy_process_group()
