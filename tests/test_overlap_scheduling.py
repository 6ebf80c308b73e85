"""Overlap scheduling (``async_scheduling``, engine/engine.py): step N+1 is planned and launched before step N
is read, and the tokens equal synchronous scheduling's in every case where the two could part: requests
joining and finishing, preemption, an abort, a stop string, n > 1 completions, seeded sampling,
log-probabilities and speculative chains. On a CPU the device is the host, so nothing overlaps in time, but
the code path is the one CUDA runs: the host's view one step behind, each pending token's input id gathered
from the previous step's draws, the tokens of a request that ended one step earlier dropped. ``RecordedCall``
stands in for the CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from solutions.engine.cuda_graphs import RecordedCall
from solutions.sampling_params import SamplingParams
from tests.test_cuda_graphs import BLOCK_BYTES, arrivals, make_llm, run_schedule

SMALL_CACHE = 32 << 20  # KV cache bytes per engine, plenty here (a CPU engine takes 1 GiB by default)


def synchronous(folder, **options):
    return make_llm(folder, **{"kv_cache_memory": SMALL_CACHE, **options})


def overlapped(folder, graphs: bool = False, **options):
    """An engine with overlap scheduling on (the CPU's default is off), and the count of its steps whose
    inputs took a token still on the device."""
    llm = synchronous(folder, async_scheduling=True, **options)
    runner = llm.engine.runner
    if graphs:
        runner.capture_decode_graphs(llm.engine.config.max_graph_rows, RecordedCall)
    fed, feed = [], runner._feed_pending
    runner._feed_pending = lambda inputs: fed.append(len(inputs.pending_at)) or feed(inputs)
    return llm, fed


def test_overlap_is_on_by_default_on_cuda_only(tiny_folder):
    assert synchronous(tiny_folder).engine.overlap is False, "on a CPU nothing overlaps: off by default"
    assert synchronous(tiny_folder, async_scheduling=True).engine.overlap is True


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_overlapped_steps_equal_synchronous_ones_through_joins_finishes_and_preemption(tiny_folder, graphs):
    """Five requests, two joining later, of lengths that finish at different steps, in a cache of 17 usable
    blocks (the schedule preempts: test_cuda_graphs checks it)."""
    budget = dict(kv_cache_memory=18 * BLOCK_BYTES)
    expected = run_schedule(make_llm(tiny_folder, **budget), arrivals(5))
    llm, fed = overlapped(tiny_folder, graphs, **budget)
    assert run_schedule(llm, arrivals(5)) == expected
    assert sum(n > 0 for n in fed) > 20, "few steps took a token from the device: the test proves less"
    assert llm.engine.in_flight is None and llm.engine.kv.num_used_blocks == 0


def test_an_abort_while_a_step_is_in_flight_drops_its_token(tiny_folder):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    prompts = [[3, 4, 5], [6, 7, 8, 9], [10, 11]]

    def run(llm):
        engine = llm.engine
        ids = [engine.add_request(p, params) for p in prompts]
        final = {}
        for step in range(200):
            if step == 6:
                engine.abort(ids[1])
            for out in engine.step():
                if out.finished:
                    final[out.request_id] = [c.token_ids for c in out.outputs]
            if not engine.has_unfinished_requests():
                break
        assert engine.kv.num_used_blocks == 0
        return final, ids

    (expected, sync_ids), (overlap, overlap_ids) = (
        run(synchronous(tiny_folder)),
        run(overlapped(tiny_folder)[0]),
    )
    assert [expected[i] for i in sync_ids if i in expected] == [
        overlap[i] for i in overlap_ids if i in overlap
    ]
    assert overlap_ids[1] not in overlap and len(overlap) == 2


def test_parallel_and_seeded_sampling_draw_the_same_tokens(tiny_folder):
    """n = 3 forks after the first token (drawn in a step whose successor was already launched); seeded draws
    count from the position of the token they draw, the pending one included."""
    prompts = [list(range(5, 17)), [9, 8, 7]]
    params = [
        SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=20, seed=3, max_tokens=15, ignore_eos=True),
    ]
    expected = synchronous(tiny_folder).generate(prompts, params)
    llm, fed = overlapped(tiny_folder)
    overlap = llm.generate(prompts, params)
    assert [[c.token_ids for c in o.outputs] for o in overlap] == [
        [c.token_ids for c in o.outputs] for o in expected
    ]
    assert any(fed) and llm.engine.kv.num_used_blocks == 0


def test_logprobs_and_speculative_steps_are_read_before_the_next_is_planned(tiny_folder):
    """Both read what a step computed (its logits; the verify's verdicts): such a step is collected at
    once, and the tokens and log-probabilities equal synchronous scheduling's."""
    g = torch.Generator().manual_seed(1)
    phrase = torch.randint(0, 101, (5,), generator=g).tolist()
    prompts = [phrase * 3, [4, 5, 6]]
    asks = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    expected = synchronous(tiny_folder).generate(prompts, asks)
    overlap = overlapped(tiny_folder)[0].generate(prompts, asks)
    for a, b in zip(overlap, expected, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs and a.prompt_logprobs == b.prompt_logprobs
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = synchronous(tiny_folder).generate(prompts, greedy)
    llm, fed = overlapped(tiny_folder, speculative="ngram", num_speculative_tokens=3)
    spec = llm.generate(prompts, greedy)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
    assert not any(fed) and llm.engine.speculator.mean_acceptance_length > 1
