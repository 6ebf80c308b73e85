"""The engine loop: ``add_request`` queues work; each ``step()`` schedules, runs the model once, samples,
appends, and returns what advanced.

    step():  spec.propose(running)                 drafts, when speculating (speculator.py; else nothing)
             plan = scheduler.schedule()           which requests run how many tokens (no tensors), and the
                                                   block tables that changed
             runner.launch(plan, verify)           the runner's step: one flat forward pass over every
                                                   scheduled token; the verify's accepted runs of drafts
                                                   (Lesson 4); one batched draw on the device for the other
                                                   rows, its copy to the host queued
             runner.collect(step)                  the step's one device-to-host read: the drawn ids
             _update(plan, tokens)                 fork n > 1 completions, append any number of tokens,
                                                   stop rules, free blocks
             _outputs(advanced)                    metrics, and snapshots of the requests that advanced

Overlap scheduling (``async_scheduling``; vLLM's async scheduling, mini-sglang's overlap loop): step N+1 is
planned and launched before step N is collected, so the host's work (reading, stop rules, detokenizing,
planning) runs while the device computes the next step. The host's view runs one step behind: a request
whose token is still on the device counts it in ``num_pending``, the scheduler plans as if it were known,
and the next step's input id is gathered from the device's draws (``ModelRunner._feed_pending``). A request
that ended in step N (a stop token, a stop string, its length, an abort) was already launched in step N+1:
that token is dropped, never emitted. Steps that speculate or want log-probabilities are collected before
the next one is planned.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import torch

from ..cache.kv_cache_manager import KVCacheManager
from ..config import EngineConfig
from ..kernels.attention_backend import backend_for_model, resolve_backend
from ..kernels.cpu_linear import decisions_line, use_fastest_linears
from ..model.cpu_decode_layers import decode_layers
from ..model.layer_ops import select_layer_ops
from ..model.llama import LlamaModel
from ..model.loader import load_weights
from ..quant.cpu_int4_layer import int4_decode_layers
from ..quant.linear import use_fastest_int4
from ..quant.model import quantize_named_model
from ..sampling_params import SamplingParams
from . import logprobs
from .kv_sizing import allocate_kv_cache
from .outputs import OUTPUT_KINDS, OutputKind, RequestOutput
from .request import Request, RequestGroup, Status
from .runner import LaunchedStep, ModelRunner
from .sampling_batch import SamplingBatch
from .scheduler import Scheduler, SchedulerOutput
from .speculator import NO_SPECULATION, Speculator
from .tp_executor import TensorParallelExecutor

log = logging.getLogger("fastmode")


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        weights = load_weights(config.model, load_tokenizer=not config.skip_tokenizer_init)
        self.model_config = weights.config
        config.attention_backend = backend_for_model(
            config.attention_backend, torch.device(config.device), weights.config.head_dim
        )
        self.tokenizer = None if config.skip_tokenizer_init else weights.tokenizer
        # Lesson 9: with tensor_parallel_size > 1, the other ranks' processes; rank 0's shard is this model.
        self.workers = TensorParallelExecutor(config, weights) if config.tensor_parallel_size > 1 else None
        if self.workers is not None:
            self.model = self.workers.model
        else:
            self.model = LlamaModel.from_state_dict(
                weights.config, weights.state_dict, config.device, config.torch_dtype
            )
            if config.quantization:  # a shard is quantized as it is built
                quantize_named_model(
                    self.model, weights.source.stem, config.quantization, config.w_bit, config.group_size
                )
        self.max_model_len = min(config.max_model_len, weights.config.max_position_embeddings)
        self.eos_token_ids = frozenset((self.tokenizer or weights.config).eos_token_ids)
        self.device = self.model.norm.weight.device
        if self.device.type == "cpu":  # each linear runs the matrix product measured fastest here
            log.info(decisions_line(use_fastest_linears(self.model)))
            use_fastest_int4(self.model)
        if self.workers is None:
            self.model.use_ops(select_layer_ops(self.device, self.model))  # fused kernels where they pay
        cache = allocate_kv_cache(self.model, config, self.max_model_len)
        if self.workers is None and self.device.type == "cpu":  # a lone decode's layers without module calls
            model, dtype = self.model, cache.k.dtype
            model.fused_decode = int4_decode_layers(model, dtype) or decode_layers(model, dtype)
        self.kv = KVCacheManager(cache.num_blocks, cache.block_size, config.enable_prefix_caching)
        self.sampling = SamplingBatch(self.model_config.vocab_size, self.device)
        self.runner = ModelRunner(
            self.model,
            cache,
            config.max_num_seqs,
            self.max_model_len,
            config.max_num_batched_tokens,
            config.attention_backend,
            self.sampling,
        )
        # every worker allocates the same KV blocks; each step reaches them first
        if self.workers is not None:
            self.workers.start(cache, self.runner)
        self.runner.tune_eager_decode()  # on CUDA: every decode key a step can meet, before the first step
        if self.device.type == "cuda" and not config.enforce_eager:
            if resolve_backend(config.attention_backend, self.device) == "triton":
                self.runner.capture_decode_graphs(config.max_graph_rows)
            else:  # the torch path reads each step's lengths on the host: a graph cannot hold that
                log.info("decode steps run eagerly: CUDA graphs need the Triton attention backend")
        self.scheduler = Scheduler(
            self.kv, config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len
        )
        # Lesson 4: drafts before each step, verifies after it.
        self.speculator = (
            Speculator(config, self.model, self.kv, cache, self.sampling) if config.speculative else None
        )
        self.groups: dict[str, RequestGroup] = {}  # unfinished requests by id
        self._ids = itertools.count()
        # Overlap scheduling: the launched step the host has not read yet (None when every step is read).
        self.overlap = bool(config.async_scheduling) and self.workers is None
        self.in_flight: LaunchedStep | None = None

    # -- one iteration -----------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return an output of every streamed request that advanced in it (its deltas and
        text so far), and of every request that finished in it. With overlap scheduling the step planned and
        launched here is read in the next call, after that call has launched its own: the outputs are the
        previous step's. Invariant: every launched step is read back before the step after the next one is
        planned, so a staging buffer's host side is never rewritten while a copy from it may be in flight."""
        spec = self.speculator or NO_SPECULATION
        spec.propose(self.scheduler.running)  # drafts: the scheduler then plans 1 + k tokens for a request
        plan = self.scheduler.schedule()
        launched = self._launch(plan, spec) if plan.scheduled else None
        outputs = self._finish(self.in_flight, spec) if self.in_flight else []
        self.in_flight = launched
        if launched is not None and not (self.overlap and self._may_overlap(plan, spec)):
            outputs += self._finish(launched, spec)
            self.in_flight = None
        elif self.in_flight is not None and not self.groups:  # every request ended: nothing to launch after
            self._finish(self.in_flight, spec)
            self.in_flight = None
        return outputs

    def _launch(self, plan: SchedulerOutput, spec) -> LaunchedStep:
        """The runner's step up to its read: forward, the verify (accepted runs; rejected drafts' K/V rolled
        back), the draw on the device and its copy to the host, queued."""
        self._start_metrics(plan)
        hidden = spec.needs_hidden or logprobs.wants_prompt_logprobs(plan)
        return self.runner.launch(plan, spec.verify, return_hidden=hidden, trees=spec.tree_parents())

    def _finish(self, launched: LaunchedStep, spec) -> list[RequestOutput]:
        """Read a launched step's tokens, update its requests, and report them."""
        step = self.runner.collect(launched)
        plan = launched.plan
        advanced = self._update(plan, step.tokens)
        if logprobs.wants_prompt_logprobs(plan, advanced=True):  # engine/logprobs.py: only when asked
            logprobs.record_prompt(plan, step.model, self.model, self.tokenizer)
        if logprobs.wants_logprobs(plan):
            logprobs.record_sampled(step.model, step.verified, step.tokens, self.tokenizer, spec.token_rows)
        return self._outputs(advanced)

    def _may_overlap(self, plan: SchedulerOutput, spec) -> bool:
        """Whether the next step may be launched before this one is read: not when speculating (the next
        drafts need this step's verdicts), nor when a request wants log-probabilities (they read this step's
        logits, which a replayed graph's next step overwrites)."""
        return spec is NO_SPECULATION and not logprobs.asks_for_logprobs(plan)

    def _start_metrics(self, plan: SchedulerOutput) -> None:
        """A request scheduled for the first time: when, and how much of its prompt the prefix cache held."""
        now = time.perf_counter()
        for request in plan.scheduled:
            metrics = request.group.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
                metrics.num_cached_tokens = request.num_computed

    def _update(
        self, plan: SchedulerOutput, new_tokens: list[tuple[Request, list[int]]]
    ) -> dict[str, RequestGroup]:
        """The one update path: append any number of accepted tokens to each request, apply the stop rules,
        free a finished request's blocks; a group's first token forks its other completions first (they
        follow it in ``new_tokens``). Then the full blocks of every request still running join the prefix
        cache. Returns the groups that advanced, by id."""
        advanced: dict[str, RequestGroup] = {}
        for request, tokens in new_tokens:
            if request.finished:  # ended (a stop rule, an abort) while this step ran: its token is dropped
                continue
            group = request.group
            if group.unforked:  # only the first completion runs before it has a token
                self._fork(request)
            request.append_tokens(tokens, group.stop_token_ids, self.max_model_len)
            if request.status is Status.FINISHED:
                self.scheduler.finish(request)
            advanced[group.request_id] = group
        for request in plan.scheduled:
            if request.status is Status.RUNNING:
                self.kv.cache_full_blocks(request)
        return advanced

    def _fork(self, first: Request) -> None:
        """Parallel sampling: the group's other completions share ``first``'s blocks and run behind it."""
        group = first.group
        for child in group.unforked:
            self.kv.fork(first, child)
            self.scheduler.add_running(child, after=first)
        group.requests += group.unforked
        group.unforked = []

    def _outputs(self, advanced: dict[str, RequestGroup]) -> list[RequestOutput]:
        """Each advanced group's metrics, and its output unless it reports only when finished; a finished
        group leaves ``groups``."""
        now = time.perf_counter()
        outputs = []
        for group in advanced.values():
            metrics = group.metrics
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.token_times.append(now)
            metrics.num_output_tokens = sum(len(r.output_token_ids) for r in group.requests)
            finished = group.finished
            if finished:
                metrics.finished_time = now
                del self.groups[group.request_id]
            if finished or group.output_kind != "final":
                outputs.append(group.output(finished))
        return outputs

    # -- submitting work ---------------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
        output_kind: OutputKind = "cumulative",
    ) -> str:
        """Queue one request; returns its id (``request_id`` if given: it must not be in use).
        ``arrival_time`` (``time.perf_counter()`` seconds, default now) is when the request
        reached the system, for its metrics. ``output_kind`` (``outputs.OutputKind``): "cumulative", ``step``
        reports the request each time it gains tokens, whole; "delta", only what each step added; "final",
        only once finished."""
        return self.add_requests([prompt], [params], [request_id], arrival_time, output_kind)[0]

    def add_requests(
        self,
        prompts: list[str | list[int]],
        params: list[SamplingParams],
        request_ids: list[str | None] | None = None,
        arrival_time: float | None = None,
        output_kind: OutputKind = "cumulative",
    ) -> list[str]:
        """Validate every prompt (``RequestGroup.create``), then queue them all: a bad prompt raises before
        any is queued."""
        if output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {', '.join(OUTPUT_KINDS)}; got {output_kind!r}")
        ids = request_ids or [None] * len(prompts)
        now = time.perf_counter() if arrival_time is None else arrival_time
        groups = []
        for prompt, sampling, request_id in zip(prompts, params, ids, strict=True):
            if request_id is not None and request_id in self.groups:
                raise ValueError(f"request id {request_id!r} is already in use")
            groups.append(
                RequestGroup.create(
                    prompt,
                    sampling,
                    request_id,
                    now,
                    self._ids,
                    self.tokenizer,
                    self.model_config.vocab_size,
                    self.max_model_len,
                    self.eos_token_ids,
                )
            )
        for group in groups:
            group.output_kind = output_kind
        if len({g.request_id for g in groups}) != len(groups):
            raise ValueError("request ids must be unique")
        for group in groups:
            self.groups[group.request_id] = group
            self.scheduler.add(group.requests[0])
        return [g.request_id for g in groups]

    def abort(self, request_ids: str | list[str]) -> None:
        """Drop unfinished requests (a stream closed early, a client gone) and
        free all their blocks at once."""
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            group = self.groups.pop(request_id, None)
            for request in group.requests if group else []:
                if not request.finished:
                    request.finish_reason = "abort"
                    self.scheduler.finish(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    def stats(self) -> EngineStats:
        """What a metrics endpoint reports: queue lengths and KV cache use, right now."""
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_blocks_used=self.kv.num_used_blocks,
            kv_blocks_total=self.kv.num_blocks - 1,
        )
