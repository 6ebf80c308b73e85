"""The persistent input batch: what the runner knows about each running request, kept across steps, and the
pinned buffers a step's inputs travel to the device in (vLLM's ``InputBatch`` and ``CpuGpuBuffer``).

Each running request owns one row of host arrays that live as long as it runs::

    token_ids    [rows, max_model_len]     its prompt and output tokens (written once each)
    block_table  [rows, max_blocks]        its KV blocks, rewritten only when the cache manager changed them

A step writes only what changed (the tokens sampled since the last step, a table the cache manager touched),
then derives the step's flat arrays with a few numpy operations, never a Python loop over tokens::

    input_ids[T] positions[T] slot_mapping[T] logits_indices[N] |
    query_start_loc[B+1] seq_lens[B] block_table[B, W]

All of them are int32 and packed, in that order, at the front of one pinned host buffer, so one
non-blocking copy sends the step's inputs to the device (on a CPU the "device" buffer is the host
buffer itself: no copy at all).

Words:  row          a persistent-batch row, one running request's (``row_of``, ``free_rows``, ``batch_rows``)
        logits span  the slice of a step's logits one request draws from (``StepInputs.logits_spans``)
        bucket       a decode graph's size: the tokens it holds, each wanting its logits, padding included
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..kernels.blocks import cache_slots, cdiv

if TYPE_CHECKING:
    from .request import Request


class StagingBuffer:
    """A host buffer (pinned when the device is CUDA) and its device twin.

    Write the host side through ``numpy`` (a view, no copy), then ``send(n)`` copies its first ``n``
    entries with one non-blocking copy and returns the device view. A non-blocking copy reads the host
    side when the stream reaches it, not when it is queued, so invariant: the host side is written only
    after ``wait()``, which blocks until the last ``send``'s copy has run (an event recorded after each
    copy; on a CPU the device side is the host side and there is nothing to wait for).
    """

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device):
        self.on_cuda = device.type == "cuda"
        self.host = torch.zeros(size, dtype=dtype, pin_memory=self.on_cuda)
        self.numpy = self.host.numpy()
        self.device = torch.zeros(size, dtype=dtype, device=device) if self.on_cuda else self.host
        self._sent = torch.cuda.Event() if self.on_cuda else None

    def send(self, n: int) -> torch.Tensor:
        if self.on_cuda:
            self.device[:n].copy_(self.host[:n], non_blocking=True)
            self._sent.record()
        return self.device[:n]

    def wait(self) -> None:
        """Block until the last ``send``'s copy has read the host side (at once when it has: after a step's
        read, the usual case)."""
        if self._sent is not None:
            self._sent.synchronize()


@dataclass(frozen=True)
class StepLayout:
    """Where each of a step's arrays sits in the packed buffer, for ``T`` tokens, ``N`` logits rows, ``B``
    sequences and block tables ``W`` wide. The decode graph of bucket ``b`` always uses
    ``StepLayout(b, b, b, max_blocks)`` (``InputBatch.decode_layout``)."""

    num_tokens: int
    num_logits: int
    num_seqs: int
    width: int

    @property
    def sizes(self) -> tuple[int, ...]:
        t, b = self.num_tokens, self.num_seqs
        return t, t, t, self.num_logits, b + 1, b, b * self.width

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def split(self, buffer: np.ndarray | torch.Tensor) -> list:
        """The arrays (views of ``buffer``): ids, positions, slots, logits indices,
        query starts, seq lens, table."""
        views, start = [], 0
        for size in self.sizes:
            views.append(buffer[start : start + size])
            start += size
        table = views[-1]
        views[-1] = table.reshape(self.num_seqs, self.width)
        return views


@dataclass
class StepInputs:
    """One step's inputs on the model's device (views of the packed buffer) and what the host keeps of them.

    ``logits_spans[request_id]`` is the slice of ``logits`` rows (the ``logits_indices`` order) of a request
    whose step reaches its last known token: one row for a decode or a final prefill chunk, ``1 + k`` when
    verifying ``k`` drafts. ``batch_rows`` and ``num_computed`` stay on the host (the speculative path reads
    them).
    """

    layout: StepLayout
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    logits_indices: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    max_query_len: int
    max_seq_len: int
    logits_spans: dict[str, slice]
    batch_rows: np.ndarray  # [B] each scheduled request's row of the persistent batch
    num_computed: np.ndarray  # [B] tokens each request had computed before this step
    pending_at: list[int]  # the flat index of each token the host does not hold yet (a placeholder id)
    pending_ids: list[str]  # whose token each one is


@dataclass
class _Gathered:
    """What ``InputBatch._gather`` read of the scheduled requests, in step order (``[B]`` int64 arrays)."""

    rows: np.ndarray  # each request's row of the persistent batch
    computed: np.ndarray  # tokens it had computed before this step
    counts: np.ndarray  # tokens it runs in this step
    totals: np.ndarray  # tokens it knows (its drafts included)
    logits_spans: dict[str, slice]
    num_logits: int
    trees: list[tuple[int, np.ndarray]]  # (index in the step, positions) of each request verifying a tree
    num_tokens: int  # counts.sum()
    pending_at: list[int]  # flat index of each token still on the device (``Request.num_pending``)
    pending_ids: list[str]

    @property
    def seq_lens(self) -> np.ndarray:
        return self.computed + self.counts

    @property
    def query_end(self) -> np.ndarray:
        return np.cumsum(self.counts)

    def per_token(self) -> tuple[np.ndarray, np.ndarray]:
        """Each token's row and cache position (its request's tokens consecutive, from ``computed`` on)."""
        if self.num_tokens == len(self.rows):  # one token per request
            return self.rows, self.computed
        owner = np.repeat(np.arange(len(self.rows)), self.counts)  # token -> index of its request
        query_end = self.query_end
        cache_positions = self.computed[owner] + np.arange(self.num_tokens) - (query_end - self.counts)[owner]
        return self.rows[owner], cache_positions


class InputBatch:
    """One row per running request, kept across steps; ``prepare`` turns a plan into ``StepInputs``.

    Invariants: ``row_of`` maps each request with a row to it, and ``free_rows`` holds the rest; a row's
    ``token_ids[:num_tokens_written]`` are its request's first tokens; ``tables`` holds the block table (the
    cache manager's live list, handed over in a plan's ``block_tables``) of every request holding blocks;
    ``block_table[row, :num_blocks]`` equals its request's table, and the rest of the row is 0 (the null
    block), once the step's table changes are applied (first thing in ``prepare``).
    """

    def __init__(
        self,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        max_num_tokens: int,
        device: torch.device,
    ):
        self.block_size = block_size
        self.max_blocks = cdiv(max_model_len, block_size)
        self.token_ids = np.zeros((max_num_seqs, max_model_len), dtype=np.int32)
        self.block_table = np.zeros((max_num_seqs, self.max_blocks), dtype=np.int32)
        self.num_blocks = [0] * max_num_seqs
        self.num_tokens_written = [0] * max_num_seqs
        self.row_of: dict[str, int] = {}
        self.tables: dict[str, list[int]] = {}
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.max_num_tokens = max_num_tokens
        # A step holds at most one sequence per token; the running requests (forks of n > 1 completions may
        # outnumber max_num_seqs) grow the rows as needed, one doubling at a time.
        largest = StepLayout(
            max_num_tokens, max_num_tokens, max(max_num_seqs, max_num_tokens), self.max_blocks
        )
        self.staging = StagingBuffer(largest.total, torch.int32, device)
        self._arange = np.arange(largest.num_seqs + 1, dtype=np.int32)
        self._layout_views: dict[StepLayout, tuple[list, list]] = {}

    # -- the persistent rows -----------------------------------------------------------------------------

    def sync_tables(self, changed: dict[str, list[int] | None]) -> None:
        """Apply a plan's table changes (``SchedulerOutput.block_tables``): keep each new table, rewrite the
        rows of requests whose table changed, release the rows of requests that hold no blocks any more
        (finished, aborted, preempted)."""
        for request_id, table in changed.items():
            if table is None:
                self.tables.pop(request_id, None)
            else:
                self.tables[request_id] = table
            row = self.row_of.get(request_id)
            if row is None:
                continue
            if table is None:
                del self.row_of[request_id]
                self.free_rows.append(row)
                self.block_table[row, : self.num_blocks[row]] = 0
                self.num_blocks[row] = self.num_tokens_written[row] = 0
            else:
                self._write_table(row, table)

    def _write_table(self, row: int, table: list[int]) -> None:
        old = self.num_blocks[row]
        self.block_table[row, : len(table)] = table
        if old > len(table):
            self.block_table[row, len(table) : old] = 0
        self.num_blocks[row] = len(table)

    def _new_row(self, request: Request) -> int:
        """Give a request its row (with its whole table) the first time it is scheduled."""
        table = self.tables.get(request.request_id)
        if table is None:
            raise RuntimeError(f"request {request.request_id!r} is scheduled; no plan gave its block table")
        if not self.free_rows:
            self._grow()
        row = self.row_of[request.request_id] = self.free_rows.pop()
        self._write_table(row, table)
        return row

    def _grow(self) -> None:
        """Twice the rows (more requests running than rows: the forks of n > 1 completions)."""
        rows = len(self.num_blocks)
        self.token_ids = np.concatenate([self.token_ids, np.zeros_like(self.token_ids)])
        self.block_table = np.concatenate([self.block_table, np.zeros_like(self.block_table)])
        self.num_blocks += [0] * rows
        self.num_tokens_written += [0] * rows
        self.free_rows += range(2 * rows - 1, rows - 1, -1)

    def _write_tokens(self, row: int, request: Request, end: int, num_tokens: int) -> None:
        """Make ``token_ids[row, :end]`` hold the request's tokens (drafts past ``num_tokens`` included:
        they are rewritten each step, since a rejected draft's position later holds another token)."""
        written = self.num_tokens_written[row]
        if end - written == 1 and end == num_tokens:  # a decode: its newest token
            outputs = request.output_token_ids
            self.token_ids[row, written] = outputs[-1] if outputs else request.prompt_token_ids[-1]
        else:
            self.token_ids[row, written:end] = request.token_ids(written, end)
        self.num_tokens_written[row] = min(end, num_tokens)

    def _views(self, layout: StepLayout) -> tuple[list, list]:
        """The host and device arrays of ``layout`` (made once per layout:
        a decode step reuses its bucket's)."""
        views = self._layout_views.get(layout)
        if views is None:
            if len(self._layout_views) > 512:
                self._layout_views.clear()
            views = self._layout_views[layout] = (
                layout.split(self.staging.numpy),
                layout.split(self.staging.device),
            )
        return views

    def cache_slots(self, row: int | np.ndarray, positions: np.ndarray) -> np.ndarray:
        """The cache slots of ``positions`` of the request in ``row`` (or of each position's own row)."""
        return cache_slots(self.block_table, positions, self.block_size, rows=row)

    # -- one step ------------------------------------------------------------------------------------------

    def prepare(
        self,
        scheduled: list[Request],
        num_scheduled: dict[str, int],
        block_tables: dict[str, list[int] | None],
        tree_positions: dict[str, np.ndarray] | None = None,
        bucket: int | None = None,
    ) -> StepInputs:
        """Write the step's inputs for the scheduled requests (decodes first) and send them to the device.

        ``block_tables``: the plan's table changes (``SchedulerOutput.block_tables``), applied first.
        ``tree_positions[request_id]``: RoPE positions of a request verifying a draft tree (depth-based; its
        slots stay consecutive). ``bucket``: lay the step out as the decode graph of that bucket
        (``decode_layout``): every token must want its logits (decodes, chains being verified). A step of one
        token per request, each wanting its logits, takes the same decode path without padding; any other
        (prefill chunks, drafts verified eagerly, trees) the mixed one."""
        self.sync_tables(block_tables)
        step = self._gather(scheduled, num_scheduled, tree_positions)
        if step.num_tokens > self.max_num_tokens:
            raise ValueError(f"a step of {step.num_tokens} tokens exceeds the batch's {self.max_num_tokens}")
        every_token_wants_logits = step.num_tokens == step.num_logits
        if bucket is not None:
            if not every_token_wants_logits:
                raise ValueError("a decode graph's step holds tokens that want their logits only")
            if step.num_tokens > bucket:
                raise ValueError(
                    f"a step of {step.num_tokens} tokens does not fit the graph of bucket {bucket}"
                )
            return self._prepare_decode(step, self.decode_layout(bucket))
        if every_token_wants_logits and step.num_tokens == len(step.rows):  # one decode per request
            t, width = step.num_tokens, cdiv(int(step.seq_lens.max(initial=1)), self.block_size)
            return self._prepare_decode(step, StepLayout(t, t, t, width))
        return self._prepare_mixed(step)

    def _gather(
        self,
        scheduled: list[Request],
        num_scheduled: dict[str, int],
        tree_positions: dict[str, np.ndarray] | None,
    ) -> _Gathered:
        """The one per-request Python loop of a step: each request's row (given one the first time it is
        scheduled), the tokens new since its last step written into it, and its logits span. Invariants of
        the result: its arrays follow ``scheduled``'s order, and the spans, in that order too, tile
        ``[0, num_logits)``."""
        rows, computed, counts, totals, spans = [], [], [], [], {}
        num_logits, trees, pending_at, pending_ids, flat = 0, [], [], [], 0
        for request in scheduled:
            request_id = request.request_id
            row = self.row_of.get(request_id)
            if row is None:
                row = self._new_row(request)
            first, count, known = request.num_computed, num_scheduled[request_id], request.num_tokens
            end, total = first + count, known + request.num_pending
            if request.num_pending:  # its newest token is on the device: it starts this step's run
                if first != known:
                    raise RuntimeError(f"request {request_id!r} has a token pending and uncomputed tokens")
                pending_at.append(flat)
                pending_ids.append(request_id)
                end = min(end, known)  # the host writes the tokens it holds
            if self.num_tokens_written[row] < end:
                self._write_tokens(row, request, end, known)
            end = first + count
            if end >= total:  # reached the last known token: the next one is wanted
                spans[request_id] = slice(num_logits, num_logits + end - total + 1)
                num_logits += end - total + 1
            if tree_positions and request_id in tree_positions:
                trees.append((len(rows), tree_positions[request_id]))
            rows.append(row)
            computed.append(first)
            counts.append(count)
            totals.append(total)
            flat += count
        rows, computed, counts, totals = (
            np.array(a, dtype=np.int64) for a in (rows, computed, counts, totals)
        )
        return _Gathered(
            rows, computed, counts, totals, spans, num_logits, trees, flat, pending_at, pending_ids
        )

    def _prepare_decode(self, step: _Gathered, layout: StepLayout) -> StepInputs:
        """The decode hot path: each token a sequence of its own that ends at it, its logits wanted (a decode,
        or one token of a draft chain: causal attention over the chain). Invariants: every token wants its
        logits (``num_tokens == num_logits``) and ``layout`` has one sequence and one logits index per token,
        ``layout.num_tokens >= num_tokens``; the tokens past the step's are padding (a graph's bucket): one
        query at position 0 that reads the null block and writes no slot. The host side is written only
        after ``staging.wait()``, then sent once."""
        host_views, device_views = self._views(layout)
        self.staging.wait()  # the previous step's copy may still be reading the host side
        ids, positions, slots, logits_indices, query_start, lens, table = host_views
        n, (token_rows, cache_positions) = step.num_tokens, step.per_token()
        positions[:n] = cache_positions
        logits_indices[:n] = self._arange[:n]
        query_start[0] = 0
        query_start[1 : n + 1] = self._arange[1 : n + 1]
        lens[:n] = cache_positions + 1
        table[:n] = self.block_table[token_rows, : layout.width]
        ids[:n] = self.token_ids[token_rows, cache_positions]
        slots[:n] = self.cache_slots(token_rows, cache_positions)
        if layout.num_tokens > n:  # padding of a decode graph's bucket
            pad = slice(n, layout.num_tokens)
            ids[pad], positions[pad], slots[pad] = 0, 0, -1
            logits_indices[pad] = self._arange[pad]
            query_start[n + 1 :] = self._arange[n + 1 : layout.num_tokens + 1]
            lens[pad] = 1
            table[pad] = 0
        max_seq_len = int(lens[: layout.num_seqs].max(initial=1))
        return self._send(step, layout, device_views, 1, max_seq_len)

    def _prepare_mixed(self, step: _Gathered) -> StepInputs:
        """Any other step (prefill chunks, drafts verified eagerly, draft trees): one sequence per request,
        its tokens consecutive; its logits are its last ``end - num_tokens + 1`` tokens' (none for an
        unfinished prefill chunk); a tree's tokens take its depth-based positions (their slots stay
        consecutive). Invariants: the layout is exactly the step's (``T`` tokens, ``N`` logits, ``B``
        sequences, tables as wide as its longest sequence needs), no padding; the host side is written only
        after ``staging.wait()``, then sent once."""
        n, batch, seq_lens = step.num_tokens, len(step.rows), step.seq_lens
        width = cdiv(int(seq_lens.max(initial=1)), self.block_size)
        layout = StepLayout(n, step.num_logits, batch, width)
        host_views, device_views = self._views(layout)
        self.staging.wait()  # the previous step's copy may still be reading the host side
        ids, positions, slots, logits_indices, query_start, lens, table = host_views
        token_rows, cache_positions = step.per_token()
        query_end, counts = step.query_end, step.counts
        positions[:n] = cache_positions
        for i, tree in step.trees:
            positions[query_end[i] - counts[i] : query_end[i]] = tree
        num_wanted = np.maximum(seq_lens - step.totals + 1, 0)
        first_row = np.repeat(query_end - np.cumsum(num_wanted), num_wanted)
        logits_indices[: step.num_logits] = np.arange(step.num_logits) + first_row
        query_start[0] = 0
        query_start[1 : batch + 1] = query_end
        lens[:batch] = seq_lens
        table[:batch] = self.block_table[step.rows, :width]
        ids[:n] = self.token_ids[token_rows, cache_positions]
        slots[:n] = self.cache_slots(token_rows, cache_positions)
        return self._send(
            step, layout, device_views, int(counts.max(initial=1)), int(seq_lens.max(initial=1))
        )

    def _send(
        self, step: _Gathered, layout: StepLayout, device_views: list, max_query_len: int, max_seq_len: int
    ) -> StepInputs:
        """The step's one copy to the device, and its ``StepInputs``."""
        self.staging.send(layout.total)
        return StepInputs(
            layout,
            *device_views,
            max_query_len,
            max_seq_len,
            step.logits_spans,
            step.rows,
            step.computed,
            step.pending_at,
            step.pending_ids,
        )

    def decode_layout(self, bucket: int) -> StepLayout:
        """The layout of the decode graph of ``bucket`` tokens: the same at every replay, so its inputs sit at
        the same addresses."""
        return StepLayout(bucket, bucket, bucket, self.max_blocks)
