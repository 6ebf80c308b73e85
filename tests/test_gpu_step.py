"""The GPU step's host side, checked on a CPU through stand-ins for what CUDA does asynchronously: a staging
buffer is never written while its last copy may still be reading it (issue 33, item 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from solutions.engine.input_batch import StagingBuffer
from solutions.sampling_params import SamplingParams


def make_llm(folder: Path, **options):
    from solutions import LLM

    defaults = dict(skip_tokenizer_init=True, dtype="float32", max_num_seqs=4, max_model_len=256)
    return LLM(model=str(folder), device="cpu", **{**defaults, **options})


class InFlightStaging(StagingBuffer):
    """A pinned buffer's timing on a CPU: ``send`` leaves its copy in flight (a CUDA copy reads the host side
    when the stream reaches it) until ``wait``; a host write in between is a race, counted in ``races``. The
    device side gets the values at send time, so the forward that follows still computes."""

    def __init__(self, like: StagingBuffer):
        self.on_cuda = False
        self.host = like.host.clone()
        self.numpy = self.host.numpy()
        self.device = like.host.clone()
        self.in_flight: np.ndarray | None = None  # what the copy in flight must read
        self.races = 0
        self.sends = 0

    def send(self, n: int) -> torch.Tensor:
        self._check()
        self.device[:n] = self.host[:n]
        self.in_flight = self.numpy[:n].copy()
        self.sends += 1
        return self.device[:n]

    def wait(self) -> None:
        self._check()
        self.in_flight = None

    def _check(self) -> None:
        if self.in_flight is not None and not np.array_equal(
            self.numpy[: len(self.in_flight)], self.in_flight
        ):
            self.races += 1


def test_no_step_writes_the_staging_buffer_while_its_last_copy_is_in_flight(tiny_folder):
    """A prompt chunked over three steps wants no logits until its last chunk, so nothing is read back
    between those steps: the input batch itself must wait for the last copy before it writes the next."""
    llm = make_llm(tiny_folder, max_num_batched_tokens=16)
    engine = llm.engine
    staging = engine.runner.batch.staging = InFlightStaging(engine.runner.batch.staging)
    engine.add_request(list(range(3, 43)), SamplingParams(temperature=0, max_tokens=2), request_id="r")
    for _ in range(3):  # 16 + 16 + 8 prompt tokens: no logits wanted in the first two
        plan = engine.scheduler.schedule()
        engine.runner.execute(plan)
        for request in plan.scheduled:
            request.num_computed += plan.num_scheduled_tokens[request.request_id]
    staging.send(0)  # the last step's copy checked too
    assert staging.sends == 4 and staging.races == 0


def test_the_kv_budget_holds_back_exactly_the_bytes_the_graphs_keep(tiny_folder):
    """Every bucket's graph writes into the first rows of one shared output pair, so what the graphs keep past
    capture is that pair alone, and it is what ``kv_sizing`` counts (on a CPU a 256-token context is one
    split: no scratch)."""
    from solutions.engine.cuda_graphs import RecordedCall
    from solutions.engine.kv_sizing import graph_bytes

    llm = make_llm(tiny_folder, max_num_seqs=8)
    runner, config = llm.engine.runner, llm.engine.config
    runner.capture_decode_graphs(config.max_graph_rows, RecordedCall)
    kept = {}
    for graph in runner.graphs.graphs.values():
        for tensor in graph.outputs:
            storage = tensor.untyped_storage()
            kept[storage.data_ptr()] = storage.nbytes()
    model = runner.model
    counted = graph_bytes(model.config, model.norm.weight.dtype, config.max_graph_rows, 256, runner.device)
    assert len(runner.graphs.buckets) > 1 and len(kept) == 2  # one logits and one hidden buffer in all
    assert sum(kept.values()) == runner.graph_outputs.nbytes == counted


def test_the_runner_learns_block_tables_from_the_plan_alone(tiny_folder):
    """The runner holds no cache manager (issue 47): each plan carries the tables created, changed or freed
    since the last one, and with them every scheduled request's row holds exactly the manager's table, through
    joins, n = 2 forks, preemption (a cache of 9 blocks), finishes and an abort."""
    from solutions.cache.kv_cache_manager import KVCacheManager

    block_bytes = 2 * 2 * 16 * 2 * 16 * 4  # K and V x layers x block_size x KV heads x head_dim x float32
    llm = make_llm(tiny_folder, kv_cache_memory=10 * block_bytes, max_model_len=128)
    engine, batch = llm.engine, llm.engine.runner.batch
    holders = [engine.runner, batch]
    assert not any(isinstance(v, KVCacheManager) for h in holders for v in vars(h).values())
    checked, prepare = [], batch.prepare

    def checked_prepare(scheduled, num_scheduled, block_tables, **kw):
        inputs = prepare(scheduled, num_scheduled, block_tables, **kw)
        for request in scheduled:
            row = batch.row_of[request.request_id]
            rows_table = batch.block_table[row, : batch.num_blocks[row]].tolist()
            assert rows_table == engine.kv.block_table(request.request_id), (
                f"{request.request_id}'s row is stale"
            )
        checked.append(len(scheduled))
        return inputs

    batch.prepare = checked_prepare
    preempted, preempt = [], engine.scheduler._preempt
    engine.scheduler._preempt = lambda request: preempted.append(request) or preempt(request)
    g = torch.Generator().manual_seed(3)
    for i in range(5):
        prompt = torch.randint(0, 101, (9 + 11 * i,), generator=g).tolist()
        n = 2 if i == 1 else 1
        params = SamplingParams(temperature=0.9, seed=i, n=n, max_tokens=20 + 7 * i, ignore_eos=True)
        engine.add_request(prompt, params, request_id=f"r{i}")
    for step in range(400):
        if step == 12:
            engine.abort("r3")
        engine.step()
        if not engine.has_unfinished_requests():
            break
    assert preempted and max(checked) > 1, "the schedule never preempted or batched: the test proves less"
    assert engine.stats().kv_blocks_used == 0
    assert engine.step() == [], "nothing to run: a plan with nothing scheduled, which no runner sees"
    engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=1), request_id="last")
    engine.step()  # its plan also carries the frees of the steps before it
    assert set(batch.tables) == set(batch.row_of) == {"last"}, "a freed table or row outlived its request"
