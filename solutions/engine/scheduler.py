"""Continuous batching (Orca's iteration-level scheduling, as vLLM's scheduler does it).

Every step is planned afresh within two limits: ``max_num_batched_tokens`` tokens and ``max_num_seqs``
sequences. Running requests go first, oldest first: a decode needs one token (plus its draft tokens when
speculating), a prefill still in progress needs its next chunk. What is left of the token budget admits
waiting requests first-come-first-served, their prompts chunked to fit. When the KV cache has no block for
a running request, the most recently admitted running request is preempted: its blocks are freed and it goes
back to the front of the waiting queue, to be recomputed later (mostly from the prefix cache). So a full cache
slows the engine but never fails a request, and since the oldest request is never the victim of a younger
one, every request finishes.

The scheduler decides and the runner executes: ``schedule()`` returns a plain record and touches no tensor.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..cache.kv_cache_manager import KVCacheManager
from .request import Request, Status


@dataclass
class SchedulerOutput:
    """This step's plan. ``scheduled`` lists single-token requests (decodes) first, then the rest; request
    ``r`` runs ``num_scheduled_tokens[r.request_id]`` tokens: ``all_token_ids[r.num_computed:]`` then its
    draft tokens. ``block_copies`` are copy-on-write ``(src, dst)`` pairs to apply before the forward pass.
    ``block_tables`` holds the block table of every request whose table was created, changed or freed since
    the previous plan (by this schedule, or by the last step's finishes, forks and rolled-back drafts, or an
    abort): the cache manager's live list (read it, never change it), or None once the request holds no
    blocks. It is all the runner learns of the cache manager."""

    scheduled: list[Request] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    block_tables: dict[str, list[int] | None] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


class Scheduler:
    """Invariants: a request is in exactly one of ``waiting`` (holds no blocks) or ``running`` (holds blocks
    for its ``num_computed`` tokens); ``running`` is in admission order."""

    def __init__(
        self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int
    ):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """Plan one step: running requests first, then waiting ones FCFS; preempt when blocks run out."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # BEGIN SOLUTION Lab 3: running requests first, oldest first: each gets
        #  min(tokens it still needs, budget); preempt the newest running request while allocate_slots fails;
        #  then admit waiting requests FCFS while budget and max_num_seqs allow
        # HINT: Each step is planned afresh within a token budget and max_num_seqs. Running requests go
        #  first, oldest first (a decode needs one token, an unfinished prompt its next chunk); what is
        #  left of the budget admits waiting requests in order. When blocks run out the newest running
        #  request is preempted, never the oldest.
        # HINT: Walk self.running with an index: num_new = min(self._tokens_needed(request), budget); while
        #  self.kv.allocate_slots(request, num_new) fails, preempt self.running[-1] (self._preempt, and
        #  record it in out.preempted), giving up when the victim is the request itself; on success
        #  record num_new and spend it. Then, only if nothing was preempted, admit from the front of
        #  self.waiting while budget and max_num_seqs allow.
        # HINT: Admitting: prefix = self.kv.lookup_prefix(request) (the cached blocks that start its prompt: a
        #  look-up, nothing taken yet); self.kv.allocate_slots(request, num_new, prefix) with num_new =
        #  min(the tokens after the prefix, budget) takes them and any fresh blocks, all or nothing. If it
        #  refuses, stop admitting: nothing was taken, so nothing needs undoing. Else set
        #  request.num_computed = prefix.num_tokens, popleft, status RUNNING, append to running, record
        #  its tokens.
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(self._tokens_needed(request), budget)
            while not self.kv.allocate_slots(request, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                out.num_scheduled_tokens[request.request_id] = num_new
                budget -= num_new
                index += 1
        # A step that had to preempt admits nobody: the cache is full.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            request = self.waiting[0]
            prefix = self.kv.lookup_prefix(request)
            num_new = min(request.num_tokens - prefix.num_tokens, budget)
            if not self.kv.allocate_slots(request, num_new, prefix):
                break
            request.num_computed = prefix.num_tokens
            self.waiting.popleft()
            request.status = Status.RUNNING
            self.running.append(request)
            out.num_scheduled_tokens[request.request_id] = num_new
            budget -= num_new
        # END SOLUTION
        scheduled = [r for r in self.running if r.request_id in out.num_scheduled_tokens]
        out.scheduled = sorted(scheduled, key=lambda r: out.num_scheduled_tokens[r.request_id] != 1)
        out.block_copies = self.kv.take_copies()
        if out.scheduled:  # a plan that runs nothing reaches no runner: its changes wait for the next one
            kv = self.kv
            out.block_tables = {
                request_id: kv.block_table_view(request_id) if kv.holds(request_id) else None
                for request_id in kv.take_changed_tables()
            }
        return out

    def _tokens_needed(self, request: Request) -> int:
        """Uncomputed tokens (a token drawn but not read yet, ``num_pending``, counts as known) plus drafts to
        verify, within the context limit."""
        drafts = min(len(request.spec_token_ids), self.max_model_len - request.num_tokens)
        return request.num_tokens + request.num_pending - request.num_computed + drafts

    def _preempt(self, request: Request) -> None:
        """Recompute later: free every block and go back to the front of the queue."""
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed = 0
        request.spec_token_ids = []
        request.status = Status.WAITING
        request.group.metrics.num_preemptions += 1
        self.waiting.appendleft(request)

    def add_running(self, request: Request, after: Request) -> None:
        """Place a request forked from ``after`` (parallel sampling) right behind it in the running list; it
        shares the prompt's computed blocks (``KVCacheManager.fork``), and its first token is its own draw."""
        request.num_computed = len(request.prompt_token_ids)
        request.status = Status.RUNNING
        self.running.insert(self.running.index(after) + 1, request)

    def finish(self, request: Request) -> None:
        """A request that ended (stop rule or abort): free its blocks if it holds any."""
        if request in self.running:
            self.running.remove(request)
            self.kv.free(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = Status.FINISHED
