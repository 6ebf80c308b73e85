"""Engine v0's scheduler: static batching.

Each step either prefills a new batch (when nothing is running) or decodes every running request
by one token. New requests wait until the whole batch has finished, so a batch runs as long as its
longest request while finished slots sit idle: the waste that Lesson 3's continuous batching removes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .request import Request, Status


@dataclass
class ScheduledBatch:
    requests: list[Request]
    is_prefill: bool


class StaticBatchScheduler:
    def __init__(self, num_slots: int):
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_slots = list(range(num_slots))

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        """This step's batch: every running request (decode), or as many waiting ones as fit (prefill)."""
        if self.running:
            return ScheduledBatch(list(self.running), is_prefill=False)
        while self.waiting and self.free_slots:
            request = self.waiting.popleft()
            request.slot = self.free_slots.pop(0)
            request.status = Status.RUNNING
            self.running.append(request)
        return ScheduledBatch(list(self.running), is_prefill=True) if self.running else None

    def abort(self, request: Request) -> None:
        if request in self.waiting:
            self.waiting.remove(request)
        else:
            self.finish(request)
        request.status = Status.FINISHED

    def finish(self, request: Request) -> None:
        self.running.remove(request)
        self.free_slots.append(request.slot)
        self.free_slots.sort()
        request.slot = None
