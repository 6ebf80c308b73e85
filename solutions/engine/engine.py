"""The engine loop: ``add_request`` queues work; each ``step()`` schedules, runs the model once, samples,
appends, and returns what advanced.

    step():  plan = scheduler.schedule()           which requests run how many tokens (no tensors)
             out = runner.execute(plan)            one flat forward pass over every scheduled token
             tokens = sampler(out.logits)          one batched draw on the device (or a verifier, Lesson 4),
                                                   read back with the step's one device-to-host copy
             update(request, tokens)               append any number of tokens, stop rules, free blocks
             return snapshots of the requests that advanced
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass

import torch

from ..cache.kv_cache_manager import KVCacheManager
from ..cache.paged_kv_cache import PagedKVCache
from ..config import EngineConfig
from ..kernels.attention_backend import backend_for_model, resolve_backend
from ..kernels.blocks import cdiv
from ..kernels.cpu_linear import decisions_line, use_fastest_linears
from ..kernels.sampling import filtered_probs, sample
from ..model.cpu_decode_layers import decode_layers
from ..model.layer_ops import select_layer_ops
from ..model.llama import LlamaModel
from ..model.loader import load_weights
from ..quant.cpu_int4_layer import int4_decode_layers
from ..quant.model import quantize_named_model
from ..sampling_params import SamplingParams
from .detokenizer import IncrementalDetokenizer, NullDetokenizer
from .outputs import OUTPUT_KINDS, OutputKind, RequestOutput
from .request import Request, RequestGroup, Status
from .runner import ModelOutput, ModelRunner
from .sampling_batch import SamplingBatch
from .scheduler import Scheduler, SchedulerOutput
from .speculator import Speculator
from .tp_executor import TensorParallelExecutor

log = logging.getLogger("fastmode")
CPU_KV_CACHE_BYTES = 1 << 30  # a laptop holds 1 GiB of KV cache: 23k tokens of SmolLM2-135M in float32


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
        if self.device.type == "cpu":  # each float linear runs the matrix product measured fastest here
            log.info(decisions_line(use_fastest_linears(self.model)))
        if self.workers is None:
            self.model.use_ops(select_layer_ops(self.device, self.model))  # fused kernels where they pay
        cache = self._allocate_kv_cache()
        if self.workers is None and self.device.type == "cpu":  # a lone decode's layers without module calls
            model, dtype = self.model, cache.k.dtype
            model.fused_decode = int4_decode_layers(model, dtype) or decode_layers(model, dtype)
        self.kv = KVCacheManager(cache.num_blocks, cache.block_size, config.enable_prefix_caching)
        self.runner = ModelRunner(
            self.model,
            cache,
            self.kv,
            config.max_num_seqs,
            self.max_model_len,
            config.max_num_batched_tokens,
            config.attention_backend,
        )
        # every worker allocates the same KV blocks; each step reaches them first
        if self.workers is not None:
            self.workers.start(cache, self.runner)
        if self.device.type == "cuda" and not config.enforce_eager:
            if resolve_backend(config.attention_backend, self.device) == "triton":
                self.runner.capture_decode_graphs(config.max_graph_rows)
            else:  # the torch path reads each step's lengths on the host: a graph cannot hold that
                log.info("decode steps run eagerly: CUDA graphs need the Triton attention backend")
        self.scheduler = Scheduler(
            self.kv, config.max_num_seqs, config.max_num_batched_tokens, self.max_model_len
        )
        # Lesson 4: drafts before each step, verifies after it.
        self.sampling = SamplingBatch(self.model_config.vocab_size, self.device)
        self.speculator = (
            Speculator(config, self.model, self.kv, cache, self.sampling) if config.speculative else None
        )
        self.groups: dict[str, RequestGroup] = {}  # unfinished requests by id
        self._ids = itertools.count()

    def _allocate_kv_cache(self) -> PagedKVCache:
        """Size the paged cache from the budget; fail now if one ``max_model_len`` sequence cannot fit.

        The cache holds the model's dtype, except a bfloat16 model on a CPU keeps a float32 cache:
        torch's fused CPU attention runs several times slower in bfloat16 than in float32 for one decode
        query over 64-1024 keys, and the K/V are a small share of a decode step's bytes at this model's size.
        Its heads are the model's own: under tensor parallelism, this rank's KV heads (every rank holds
        the same blocks)."""
        c, cfg = self.model.config, self.config
        dtype = self.model.norm.weight.dtype
        if dtype == torch.bfloat16 and not cfg.device.startswith("cuda"):
            dtype = torch.float32
        per_block = PagedKVCache.bytes_per_block(
            c.num_layers, cfg.kv_block_size, c.num_kv_heads, c.head_dim, dtype
        )
        budget = cfg.kv_cache_memory
        if budget is None and cfg.device.startswith("cuda"):
            free, total = torch.cuda.mem_get_info(torch.device(cfg.device))
            # What the steps themselves will hold: an eager step's activations, and the decode graphs' pool.
            activations = self._activation_bytes(cfg.max_num_batched_tokens, cfg.max_logits_rows)
            rows = cfg.max_graph_rows
            graphs = 0 if cfg.enforce_eager else self._activation_bytes(rows, rows)
            budget = int(free - (1 - cfg.gpu_memory_utilization) * total) - activations - graphs
            log.info(
                "GPU memory held back from the KV cache: "
                "%.0f MiB for a step's activations, %.0f MiB for graphs",
                activations / 2**20,
                graphs / 2**20,
            )
        elif budget is None:
            budget = CPU_KV_CACHE_BYTES
        num_blocks = budget // per_block
        blocks_per_seq = cdiv(self.max_model_len, cfg.kv_block_size)
        if num_blocks < blocks_per_seq + 1:  # + the null block
            needed = (blocks_per_seq + 1) * per_block
            raise ValueError(
                f"the KV cache budget of {budget:,} bytes holds {num_blocks} blocks, but one sequence "
                f"of max_model_len={self.max_model_len} tokens needs {needed:,} bytes ({blocks_per_seq} "
                f"blocks of {cfg.kv_block_size} tokens, {per_block:,} bytes each, plus the null block): "
                f"raise kv_cache_memory to at least {needed:,} or lower max_model_len"
            )
        log.info(
            "KV cache: %d blocks of %d tokens (%.0f MiB); %.1f sequences of max_model_len=%d fit",
            num_blocks,
            cfg.kv_block_size,
            num_blocks * per_block / 2**20,
            (num_blocks - 1) / blocks_per_seq,
            self.max_model_len,
        )
        return PagedKVCache(
            c.num_layers,
            num_blocks,
            cfg.kv_block_size,
            c.num_kv_heads,
            c.head_dim,
            dtype,
            self.model.norm.weight.device,
        )

    @torch.inference_mode()
    def _activation_bytes(self, num_tokens: int, num_logits: int) -> int:
        """Peak CUDA memory one eager forward of ``num_tokens`` tokens, ``num_logits`` of them wanting logits,
        takes beyond what is allocated now (its attention stands in for the kernels, which write into the
        cache and allocate only their output)."""
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        ids = torch.zeros(num_tokens, dtype=torch.int32, device=self.device)
        positions = torch.arange(num_tokens, dtype=torch.int32, device=self.device) % self.max_model_len
        hidden = self.model(ids, positions, lambda layer, q, k, v: q.clone())
        self.model.logits(hidden[-num_logits:])
        del hidden
        return torch.cuda.max_memory_allocated(self.device) - before

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
        """Validate every prompt, then queue them all: a bad prompt raises before any is queued."""
        if output_kind not in OUTPUT_KINDS:
            raise ValueError(f"output_kind must be one of {', '.join(OUTPUT_KINDS)}; got {output_kind!r}")
        ids = request_ids or [None] * len(prompts)
        now = time.perf_counter() if arrival_time is None else arrival_time
        groups = [self._new_group(*args, now) for args in zip(prompts, params, ids, strict=True)]
        for group in groups:
            group.output_kind = output_kind
        if len({g.request_id for g in groups}) != len(groups):
            raise ValueError("request ids must be unique")
        for group in groups:
            self.groups[group.request_id] = group
            self.scheduler.add(self._new_request(group, 0))
        return [g.request_id for g in groups]

    def _new_group(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None, now: float
    ) -> RequestGroup:
        """Validate one prompt (text or token ids). Raises ValueError naming what is wrong."""
        if self.tokenizer is None and (isinstance(prompt, str) or getattr(params, "stop", None)):
            raise ValueError(
                "this engine has no tokenizer (skip_tokenizer_init=True): "
                "give prompts as token ids, without stop strings"
            )
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: give at least one character or token id")
            text, token_ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, token_ids = None, list(prompt)
            vocab = self.model_config.vocab_size
            if not token_ids:
                raise ValueError("prompt token id list is empty")
            bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt is {len(token_ids)} tokens, but the context limit (max_model_len) is "
                f"{self.max_model_len} and one token must be left to generate"
            )
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if request_id is None:
            request_id = str(next(self._ids))
        elif request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
        stop_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else self.eos_token_ids
        )
        return RequestGroup(request_id, text, token_ids, params, now, stop_ids)

    def _new_request(self, group: RequestGroup, index: int) -> Request:
        request_id = group.request_id if index == 0 else f"{group.request_id}#{index}"
        if self.tokenizer is None:
            detokenizer = NullDetokenizer()
        else:
            detokenizer = IncrementalDetokenizer(
                self.tokenizer.backend, group.prompt_token_ids, group.params.stop
            )
        request = Request(request_id, group, index, detokenizer)
        group.requests.append(request)
        return request

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

    # -- one iteration -----------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return an output of every streamed request that advanced in it (its deltas and
        text so far), and of every request that finished in it."""
        spec = self.speculator
        if spec is not None:
            spec.propose(self.scheduler.running)  # sets spec_token_ids: the scheduler plans 1 + k tokens
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            return []
        now = time.perf_counter()
        for request in plan.scheduled:
            metrics = request.group.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
                metrics.num_cached_tokens = request.num_computed
        computed_before = {r.request_id: r.num_computed for r in plan.scheduled} if spec is not None else {}
        out = self.runner.execute(
            plan,
            return_hidden=spec is not None and spec.needs_hidden,
            trees=spec.tree_parents() if spec is not None else None,
        )
        counts = plan.num_scheduled_tokens
        for request in plan.scheduled:
            request.num_computed += counts[request.request_id]
        # Verified drafts: accepted runs (the speculator rolls back the rejected drafts' K/V).
        verified = spec.verify(plan, out, computed_before) if spec is not None else {}
        new_tokens = self._sample(plan, out, skip=verified.keys())
        new_tokens += [(r, verified[r.request_id]) for r in plan.scheduled if r.request_id in verified]
        advanced: dict[str, RequestGroup] = {}
        for request, tokens in new_tokens:
            self._update(request, tokens)
            advanced[request.group.request_id] = request.group
        for request in plan.scheduled:
            if request.status is Status.RUNNING:
                self.kv.cache_full_blocks(request)
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

    def _sample(
        self, plan: SchedulerOutput, out: ModelOutput, skip: Collection[str] = ()
    ) -> list[tuple[Request, list[int]]]:
        """New tokens for each request that reached the end of its tokens. A group whose prompt has just been
        computed forks its other ``n - 1`` completions here, each sampling from the same logits row."""
        rows, requests = [], []
        forked = False
        for request in plan.scheduled:
            span = out.rows.get(request.request_id)
            if span is None or request.request_id in skip:
                continue
            rows.append(span.stop - 1)
            requests.append(request)
            group = request.group
            if len(group.requests) < group.params.n:
                forked = True
                for index in range(1, group.params.n):
                    child = self._new_request(group, index)
                    self.kv.fork(request, child)
                    child.num_computed = request.num_computed
                    self.scheduler.add_running(child, after=request)
                    rows.append(span.stop - 1)
                    requests.append(child)
        if not rows:
            return []
        logits = out.logits
        in_order = not forked and len(rows) == logits.shape[0]  # the rows are exactly the logits, in order
        if all(r.params.greedy for r in requests):
            if not in_order:
                logits = logits.index_select(0, self.sampling.logits_index(rows))
            token_ids = logits.argmax(dim=-1)
        else:
            drawn = self.sampling.sample_rows(requests, rows)
            if not in_order:
                logits = logits.index_select(0, drawn.logits_index)
            token_ids = sample(filtered_probs(logits, drawn.settings), drawn.uniform)
        tokens = self.runner.read_tokens(token_ids)
        return [(r, [token]) for r, token in zip(requests, tokens)]

    def _update(self, request: Request, tokens: list[int]) -> None:
        """The one update path: append any number of accepted tokens, apply the stop rules, and free a
        finished request's blocks."""
        request.append_tokens(tokens, request.group.stop_token_ids, self.max_model_len)
        if request.status is Status.FINISHED:
            self.scheduler.finish(request)
