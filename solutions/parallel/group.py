"""The tensor-parallel process group: this process's rank, the world size, and the collectives that the
sharded layers and the step broadcast use, over ``torch.distributed`` (gloo on CPUs, NCCL on GPUs)::

    all_reduce(t)        each rank ends with the sum of every rank's t       row-parallel outputs, embeddings
    gather_to_first(t)   rank 0 gets every rank's t, joined on the last dim  the LM head's vocabulary shards
    broadcast(t)         every rank gets rank 0's t                          a step's packed inputs

The ranks run on 127.0.0.1 and meet through rank 0's ``TCPStore`` (on a port the system picks, so two engines
never race for one). Every collective has a timeout (``COLLECTIVE_TIMEOUT``). A collective that fails raises a
``TensorParallelError`` naming this rank and, on rank 0, what became of the others: a rank that died closes
its sockets and gloo fails at once; a rank that hangs is given up on after the timeout. On NCCL a step's
collectives are queued on the GPU and a dead peer shows only when the host next waits on the GPU, after the
timeout, when torch's NCCL watchdog ends the process (its default); the executor's check before each step
catches a worker that died between steps on either backend.

At ``world_size`` 1 nothing here runs: the engine builds the plain model and starts no process group.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

COLLECTIVE_TIMEOUT = timedelta(seconds=60)  # a hung rank is given up on after this long; a dead one at once


class TensorParallelError(RuntimeError):
    """A tensor-parallel collective or worker failed: the engine that owns it cannot run another step."""


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def rank_device(device: str, rank: int) -> torch.device:
    """The device of ``rank``: the CPU, or GPU ``rank`` (rank ``r`` owns ``cuda:r``)."""
    return torch.device("cpu") if device == "cpu" else torch.device("cuda", rank)


class TensorParallelGroup:
    """This process's place in the group, and the collectives over it (torch.distributed's default group).

    Invariant: every rank calls the same collectives in the same order with tensors of the same shapes; the
    sharded layers keep it by running one forward pass on every rank over the same step inputs.

    ``alone``: True until the executor starts the workers' step loop; meanwhile each collective leaves its
    tensor as it is, so rank 0 can run a forward by itself at start-up (the engine's memory profile on CUDA:
    shapes right, values not). ``describe_peers`` (rank 0) says what became of the other ranks when a
    collective fails; ``failure`` keeps the first failure's message: the ranks are out of step after it, for
    good. ``step_open`` (rank 0): a step was sent to the workers and its last collective, the logits gather,
    has not completed yet.
    """

    def __init__(self, rank: int, world_size: int, device: torch.device):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.alone = True
        self.describe_peers: Callable[[], str] | None = None
        self.failure: str | None = None
        self.step_open = False

    @classmethod
    def join(cls, rank: int, world_size: int, store_port: int, device: torch.device) -> TensorParallelGroup:
        """Join the group of ``world_size`` ranks whose store rank 0 holds on ``store_port`` (workers); blocks
        until every rank has joined, at most ``COLLECTIVE_TIMEOUT``."""
        store = dist.TCPStore(
            "127.0.0.1", store_port, world_size, is_master=False, timeout=COLLECTIVE_TIMEOUT
        )
        return cls.join_store(rank, world_size, store, device)

    @classmethod
    def join_store(
        cls, rank: int, world_size: int, store: dist.Store, device: torch.device
    ) -> TensorParallelGroup:
        if dist.is_initialized():
            raise TensorParallelError(
                "this process already belongs to a torch.distributed group: one tensor-parallel engine per "
                "process at a time (shut the other one down first: llm.shutdown())"
            )
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend_for(device),
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=COLLECTIVE_TIMEOUT,
            device_id=device if device.type == "cuda" else None,
        )
        return cls(rank, world_size, device)

    def leave(self) -> None:
        """Destroy the process group (idempotent); the ranks' sockets close."""
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- collectives -----------------------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it."""
        if not self.alone:
            self._run(dist.all_reduce, tensor)
        return tensor

    def gather_to_first(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """On rank 0: every rank's ``tensor`` (same shape everywhere), joined in rank order on the last dim;
        on the other ranks: None (they only send)."""
        if self.alone:
            return tensor
        if self.rank != 0:
            self._run(dist.gather, tensor.contiguous(), None, 0)
            return None
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._run(dist.gather, tensor.contiguous(), parts, 0)
        self.step_open = False  # the forward's last collective: every rank has finished this step
        return torch.cat(parts, dim=-1)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's ``tensor`` into every rank's ``tensor`` (contiguous, same shape), in place; returns it."""
        self._run(dist.broadcast, tensor, 0)
        return tensor

    def _run(self, collective: Callable, *args) -> None:
        try:
            collective(*args)
        except RuntimeError as error:  # gloo's and NCCL's errors (DistBackendError is one)
            peers = f"; {self.describe_peers()}" if self.describe_peers else ""
            self.failure = (
                f"tensor-parallel {collective.__name__} failed on rank {self.rank} of {self.world_size} "
                f"(another rank died, or hung past {COLLECTIVE_TIMEOUT.total_seconds():.0f} s){peers}: "
                f"{error}"
            )
            raise TensorParallelError(self.failure) from error
