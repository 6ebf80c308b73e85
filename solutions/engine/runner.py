"""The model runner owns a step: ``run_step`` turns a ``SchedulerOutput`` (its only input: the requests,
their token counts, the block tables that changed) into one flat batch, runs the model once, verifies drafts
(the speculator's callback) and draws the other rows' next tokens, and returns them.

For the step's ``T`` tokens (decodes first, then prefill chunks and draft verifications) the persistent input
batch (``input_batch.py``) builds::

    input_ids [T], positions [T], slot_mapping [T]         one entry per token
    query_start_loc [B + 1], seq_lens [B], block_table [B, max_blocks]   one row per request
    logits_indices [N]                                      the rows whose next-token logits are wanted

and sends them to the device with one non-blocking copy. A request gets logits only when its step reaches its
last known token: one row for a decode or a final prefill chunk, ``1 + k`` rows when it verifies ``k`` draft
tokens, none for an unfinished prefill chunk. When graphs were captured (``capture_decode_graphs``), a step
whose every token wants its logits (decodes, and requests verifying draft chains) replays the smallest bucket
that holds it, each token a sequence of its own; every other step (prefill chunks, draft trees) runs eagerly.
``read_tokens`` is the step's one device-to-host copy: the sampled token ids. ``execute`` alone is the
forward (tests and tools call it for logits).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..cache.paged_kv_cache import AttentionMetadata, PagedAttention, PagedKVCache
from ..kernels.attention_backend import resolve_backend
from ..kernels.paged_attention import eager_decode_shapes, tune_decode
from ..kernels.sampling import filtered_probs, sample
from ..model.llama import LlamaModel
from ..speculative.tree import TreeAttention, tree_attention_mask, tree_positions
from .cuda_graphs import CudaGraph, DecodeGraphs, GraphOutputs, batch_buckets
from .input_batch import InputBatch, StagingBuffer, StepInputs
from .request import Request
from .sampling_batch import SamplingBatch
from .scheduler import SchedulerOutput


@dataclass
class ModelOutput:
    """``logits`` ``[N, vocab]`` float32; request ``r``'s rows are ``logits[logits_spans[r.request_id]]`` (its
    span is absent when its prefill is unfinished). ``hidden`` ``[T, hidden]`` (before the final norm) when
    asked for. A replayed graph's logits are its static output: read them before the next step."""

    logits: torch.Tensor
    logits_spans: dict[str, slice]
    hidden: torch.Tensor | None = None


@dataclass
class StepOutput:
    """``run_step``'s result: each advancing request's new tokens (the drawn ones, then the verified runs),
    the forward's ``model`` output, and the verified runs by request id."""

    tokens: list[tuple[Request, list[int]]]
    model: ModelOutput
    verified: dict[str, list[int]]


@dataclass
class LaunchedStep:
    """A step sent to the device whose draws the host has not read yet (``launch``; ``collect`` reads them).
    ``drawers[i]`` drew ``drawn[i]`` (on the device; None when nothing was drawn); ``accepted`` are the
    verified runs, already on the host; ``copy`` is the draws' copy to the host (pinned buffer and event)."""

    plan: SchedulerOutput
    model: ModelOutput
    verified: dict[str, list[int]]
    drawers: list[Request]
    accepted: list[tuple[Request, list[int]]]
    drawn: torch.Tensor | None
    copy: tuple[torch.Tensor, torch.cuda.Event] | None = None


Verify = Callable[[SchedulerOutput, ModelOutput], dict[str, list[int]]]


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        cache: PagedKVCache,
        max_num_seqs: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        attention_backend: str = "auto",
        sampling: SamplingBatch | None = None,
    ):
        self.model, self.cache = model, cache
        self.sampling = sampling  # the draw's per-request settings (None on a tensor-parallel worker)
        self.attention_backend = attention_backend
        self.device = model.norm.weight.device
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len
        self.batch = InputBatch(
            max_num_seqs, max_model_len, cache.block_size, max_num_batched_tokens, self.device
        )
        self.graphs: DecodeGraphs | None = None
        # What start-up spent before the first step: decode tuning (seconds, calls) and the graphs' captures.
        self.startup: dict = {"tune_s": 0.0, "tuned_calls": 0}
        self.graph_outputs: GraphOutputs | None = None
        on_cuda = self.device.type == "cuda"
        # Two pinned buffers for the draws' copies, taken in turn: with overlap scheduling a step's copy is
        # queued before the previous step's is read.
        self._tokens_host = [
            torch.empty(max_num_batched_tokens, dtype=torch.int64, pin_memory=on_cuda) for _ in range(2)
        ]
        self._tokens_ready = [torch.cuda.Event() for _ in range(2)] if on_cuda else None
        self._copies = 0
        # The latest launched step's draws, still on the device, and who drew each: the next step's input id
        # of a request whose token the host has not read yet (``Request.num_pending``) comes from there.
        self._last_draws: tuple[torch.Tensor, dict[str, int]] | None = None
        self._pending_inputs = StagingBuffer(2 * max_num_batched_tokens, torch.int64, self.device)
        # Lesson 9: under tensor parallelism, sends each step (its block copies, inputs,
        # packed buffer) to the workers.
        self.step_broadcast: Callable[[list[tuple[int, int]], StepInputs, torch.Tensor], None] | None = None

    @torch.inference_mode()
    def execute(
        self,
        plan: SchedulerOutput,
        return_hidden: bool = False,
        trees: dict[str, list[int]] | None = None,
    ) -> ModelOutput:
        """Run the planned tokens of every scheduled request.

        ``trees`` (Lesson 4): for a request verifying a draft tree, its node parents (root first); its drafts
        sit at their depth's position and attend to the context and their ancestors only."""
        self.cache.copy_blocks(plan.block_copies)
        scheduled, counts = plan.scheduled, plan.num_scheduled_tokens
        # A graph holds the step if every token wants its logits: each request runs from its last known token
        # on (a decode, or that token and the draft chain it verifies; no prefill chunk, no tree).
        bucket = None
        graphable = self.graphs is not None and not trees
        if graphable and all(r.num_computed == r.num_tokens + r.num_pending - 1 for r in scheduled):
            num_tokens = sum(counts[r.request_id] for r in scheduled)
            bucket = self.graphs.bucket_for(num_tokens)
        if bucket is not None:
            inputs = self.batch.prepare(scheduled, counts, plan.block_tables, bucket=bucket)
            self._feed_pending(inputs)
            logits, hidden = self.graphs.replay(bucket)
            hidden = hidden[:num_tokens] if return_hidden else None
            return ModelOutput(logits[:num_tokens], inputs.logits_spans, hidden)
        tree_parents, positions = {}, {}
        for request in scheduled if trees else []:
            if request.request_id in trees:  # a token budget may cut a tree short: a prefix is still a tree
                parents = tree_parents[request.request_id] = trees[request.request_id][
                    : counts[request.request_id]
                ]
                positions[request.request_id] = tree_positions(parents, request.num_computed).numpy()
        inputs = self.batch.prepare(scheduled, counts, plan.block_tables, tree_positions=positions)
        self._feed_pending(inputs)
        if self.step_broadcast is not None:  # the other ranks run this same forward on their shards
            self.step_broadcast(plan.block_copies, inputs, self.batch.staging.device)
        tree_specs = self._tree_specs(plan, inputs, tree_parents) if tree_parents else None
        logits, hidden = self.forward(inputs, tree_specs)
        return ModelOutput(logits, inputs.logits_spans, hidden if return_hidden else None)

    def run_step(
        self,
        plan: SchedulerOutput,
        verify: Verify = lambda plan, out: {},
        return_hidden: bool = False,
        trees: dict[str, list[int]] | None = None,
    ) -> StepOutput:
        """The whole step (nano-vllm's ``run``, vLLM v1's execute and sample): ``launch`` it, then ``collect``
        its draws. Invariant: it reads the device back before it returns (the draws, even none, or the
        verify's verdicts), so no copy it sent from a staging buffer is still in flight when the next step
        writes its inputs."""
        return self.collect(self.launch(plan, verify, return_hidden, trees))

    def launch(
        self,
        plan: SchedulerOutput,
        verify: Verify = lambda plan, out: {},
        return_hidden: bool = False,
        trees: dict[str, list[int]] | None = None,
    ) -> LaunchedStep:
        """Everything of a step but the host's read of its draws: ``execute`` the plan, advance each
        scheduled request's ``num_computed`` by its planned tokens, ``verify`` (the speculator's: the accepted
        runs of drafts, read back; nothing when not speculating), then draw, on the device, one token for
        every other request that reached the end of its tokens and, at its first token, for each unforked
        completion of its group (n > 1: they draw from the first one's row, and follow it; with overlap
        scheduling the first one's next step is launched before they fork), and queue the draws' copy.
        Each drawer's ``num_pending`` counts the token until ``collect`` reads it; the draws stay on the
        device for the next step's inputs (overlap scheduling)."""
        out = self.execute(plan, return_hidden=return_hidden, trees=trees)
        for request in plan.scheduled:
            request.num_computed += plan.num_scheduled_tokens[request.request_id]
        verified = verify(plan, out)
        drawers, rows, accepted = [], [], []
        for request in plan.scheduled:
            span = out.logits_spans.get(request.request_id)
            if request.request_id in verified:
                accepted.append((request, verified[request.request_id]))
            elif span is not None:
                first_token = not request.output_token_ids and not request.num_pending
                for draw in (request, *request.group.unforked) if first_token else (request,):
                    drawers.append(draw)
                    rows.append(span.stop - 1)
        if not rows and verified:  # the verify's read ends the step's device work
            return LaunchedStep(plan, out, verified, [], accepted, None)
        drawn = self._draw(out.logits, drawers, rows)
        for request in drawers:
            request.num_pending += 1
        self._last_draws = (drawn, {r.request_id: i for i, r in enumerate(drawers)})
        return LaunchedStep(plan, out, verified, drawers, accepted, drawn, self._queue_copy(drawn))

    def collect(self, step: LaunchedStep) -> StepOutput:
        """A launched step's new tokens on the host, in plan order (the drawn ones, then the verified runs):
        the read of its draws (even none: a prompt chunk alone) ends the step's device work."""
        tokens = [] if step.drawn is None else self.read_tokens(step.drawn, step.copy)
        for request in step.drawers:
            request.num_pending -= 1
        drawn = [(r, [token]) for r, token in zip(step.drawers, tokens, strict=True)]
        return StepOutput(drawn + step.accepted, step.model, step.verified)

    def _feed_pending(self, inputs: StepInputs) -> None:
        """Overlap scheduling: a request whose newest token is still on the device (drawn by the step before,
        not read yet) takes its input id from the previous step's draws, gathered on the device (the host
        wrote a placeholder there). A step of requests whose tokens the host holds does nothing here."""
        if not inputs.pending_at:
            return
        drawn, index_of = self._last_draws
        at, n = inputs.pending_at, len(inputs.pending_at)
        self._pending_inputs.wait()
        self._pending_inputs.numpy[:n] = at
        self._pending_inputs.numpy[n : 2 * n] = [index_of[request_id] for request_id in inputs.pending_ids]
        sent = self._pending_inputs.send(2 * n)
        inputs.input_ids.index_copy_(0, sent[:n], drawn.index_select(0, sent[n:]).to(inputs.input_ids.dtype))

    def _queue_copy(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event] | None:
        """On CUDA: queue the draws' copy into the next pinned buffer and record its event (None on a CPU,
        where the draws are on the host already)."""
        if self._tokens_ready is None:
            return None
        turn = self._copies % 2
        self._copies += 1
        host, ready = self._tokens_host[turn][: token_ids.shape[0]], self._tokens_ready[turn]
        ready.synchronize()  # the copy this buffer held two steps ago has been read (at once, as a rule)
        host.copy_(token_ids, non_blocking=True)
        ready.record()
        return host, ready

    def _draw(self, logits: torch.Tensor, requests: list[Request], rows: list[int]) -> torch.Tensor:
        """One token id per request, ``requests[i]`` drawing from ``logits[rows[i]]`` on the device."""
        if not rows:
            return torch.empty(0, dtype=torch.int64, device=logits.device)
        in_order = rows == list(range(logits.shape[0]))  # the rows are exactly the logits, in order
        if all(r.params.greedy for r in requests):
            if not in_order:
                logits = logits.index_select(0, self.sampling.logits_index(rows))
            return logits.argmax(dim=-1)
        drawn = self.sampling.sample_rows(requests, rows)
        if not in_order:
            logits = logits.index_select(0, drawn.logits_index)
        return sample(filtered_probs(logits, drawn.settings), drawn.uniform)

    def forward(
        self, inputs: StepInputs, tree_specs: list | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager forward pass over prepared inputs: ``(logits [N, vocab] float32, hidden [T, hidden])``.
        ``tree_specs``: ``TreeAttention``'s per-tree rows, context slots and masks (Lesson 4)."""
        meta = AttentionMetadata(
            inputs.slot_mapping,
            inputs.block_table,
            inputs.query_start_loc,
            inputs.seq_lens,
            inputs.max_query_len,
            inputs.max_seq_len,
        )
        attend = PagedAttention(self.cache, meta, self.attention_backend)
        if tree_specs:
            attend = TreeAttention(attend, self.cache.k, self.cache.v, tree_specs)
        hidden = self.model(inputs.input_ids, inputs.positions, attend)
        return self.model.logits(hidden.index_select(0, inputs.logits_indices)), hidden

    def _tree_specs(
        self, plan: SchedulerOutput, inputs: StepInputs, tree_parents: dict[str, list[int]]
    ) -> list:
        """``(the tree's tokens in the flat batch, cache slots of its context, tree mask)``
        per tree request."""
        specs = []
        starts = np.concatenate(
            [[0], np.cumsum([plan.num_scheduled_tokens[r.request_id] for r in plan.scheduled])]
        )
        for i, request in enumerate(plan.scheduled):
            parents = tree_parents.get(request.request_id)
            if parents is None:
                continue
            first = int(inputs.num_computed[i])
            context = self.batch.cache_slots(int(inputs.batch_rows[i]), np.arange(first))
            tokens = slice(int(starts[i]), int(starts[i]) + len(parents))
            context_slots = torch.from_numpy(context.astype(np.int64)).to(self.device)
            specs.append((tokens, context_slots, tree_attention_mask(parents)))
        return specs

    def read_tokens(
        self, token_ids: torch.Tensor, copy: tuple[torch.Tensor, torch.cuda.Event] | None = None
    ) -> list[int]:
        """The step's sampled ids on the host: the one device-to-host copy of a step (``_queue_copy``'s into
        pinned memory, queued when the step was launched; then wait for it alone)."""
        if copy is None:
            return token_ids.tolist()
        host, ready = copy
        ready.synchronize()
        return host.tolist()

    # -- decode graphs -------------------------------------------------------------------------------------

    @torch.inference_mode()
    def capture_decode_graphs(self, max_bucket: int, graph_type: type = CudaGraph) -> None:
        """Capture one decode graph per bucket up to ``max_bucket`` tokens (``EngineConfig.max_graph_rows``;
        ``graph_type``: ``CudaGraph`` on CUDA, ``RecordedCall`` to test the same logic on a CPU), each
        bucket's decode kernel tuned first (``_tune_decode_buckets``). Decode and chain-verifying steps then
        replay them."""
        if graph_type is CudaGraph and self.device.type != "cuda":
            raise ValueError(
                "CUDA graphs need a CUDA device; on a CPU pass graph_type=RecordedCall to test them"
            )
        buckets = batch_buckets(min(max_bucket, self.batch.max_num_tokens))
        self._tune_decode_buckets(buckets)
        c = self.model.config
        dtype = self.model.norm.weight.dtype
        self.graph_outputs = GraphOutputs(buckets[-1], c.vocab_size, c.hidden_size, dtype, self.device)
        self.graphs = DecodeGraphs(buckets, self._decode_forward, self._pad_bucket, graph_type)
        self.startup["captures"] = self.graphs.captures

    def _tunes_decode(self) -> bool:
        """Whether the decode kernel is autotuned: the Triton backend on CUDA (elsewhere nothing is tuned)."""
        return self.device.type == "cuda" and resolve_backend(self.attention_backend, self.device) == "triton"

    def tune_eager_decode(self) -> None:
        """Autotune the decode kernel for every call an eager decode step can make (``eager_decode_shapes``:
        up to ``max_num_seqs`` sequences, contexts up to ``max_model_len``), at start-up: a step never waits
        on a tuning run, and no timed run includes one. (Only a step of more decodes than ``max_num_seqs``,
        which n > 1 forks can make, may still meet an untuned key.) Does nothing where nothing is tuned."""
        if self._tunes_decode():
            c = self.model.config
            shapes = eager_decode_shapes(self.max_num_seqs, self.max_model_len, c.num_kv_heads, self.device)
            self._tune_decode_calls(shapes)

    def _tune_decode_buckets(self, buckets: list[int]) -> None:
        """Autotune the decode kernel for each bucket the graphs will capture, once, before any capture: a
        graph keeps the configuration its capture ran, and a warm-up step cannot tune it (its padding rows
        have no context to time). Each bucket runs ``max_model_len`` contexts, the bound its graph uses."""
        if self._tunes_decode():
            self._tune_decode_calls([(bucket, self.max_model_len) for bucket in buckets])

    def _tune_decode_calls(self, shapes: list[tuple[int, int]]) -> None:
        """``tune_decode`` for each ``(batch, max_seq_len)``, its time and count added to ``startup``."""
        start = time.perf_counter()
        for batch, max_seq_len in shapes:
            tune_decode(
                self.cache.k[0],
                self.cache.v[0],
                batch=batch,
                max_seq_len=max_seq_len,
                q_heads=self.model.config.num_heads,
            )
        self.startup["tune_s"] += time.perf_counter() - start
        self.startup["tuned_calls"] += len(shapes)

    def _pad_bucket(self, bucket: int) -> None:
        """Fill a bucket's static inputs with padding only (a valid batch that touches no live slot)."""
        self.batch.prepare([], {}, {}, bucket=bucket)

    def _decode_forward(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The model over a bucket's static inputs, every row a decode (one query, its logits wanted): logits
        ``[bucket, vocab]`` and hidden states ``[bucket, hidden]`` (an EAGLE drafter's features), written into
        the first ``bucket`` rows of the shared ``graph_outputs``. The
        attention kernel's launch depends on the bucket alone: the context bound is ``max_model_len``."""
        layout = self.batch.decode_layout(bucket)
        ids, positions, slots, _, query_start, seq_lens, table = layout.split(self.batch.staging.device)
        meta = AttentionMetadata(slots, table, query_start, seq_lens, 1, self.max_model_len)
        hidden = self.model(ids, positions, PagedAttention(self.cache, meta, self.attention_backend))
        return self.graph_outputs.write(self.model.logits(hidden), hidden)
