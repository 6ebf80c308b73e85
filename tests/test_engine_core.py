"""The engine core on the real model: paged KV cache, prefix caching, parallel sampling (Lesson 2) and
continuous batching with chunked prefill and preemption (Lesson 3). Greedy output is the invariant: however
requests are batched, chunked, cached or preempted, each gets the tokens it gets alone."""

from __future__ import annotations

import pytest
import torch

PROMPTS = [
    "The capital of France is",
    "def quicksort(items):",
    "Write a haiku about the sea.",
    "In 1969, the first humans",
    "List three prime numbers:",
    "The mitochondria is",
]
BLOCK_BYTES = 2 * 30 * 16 * 3 * 64 * 4  # K and V of one 16-token block, every layer, float32


@pytest.fixture(scope="module")
def sp(load):
    return load("sampling_params").SamplingParams


@pytest.fixture(scope="module")
def alone(llm, sp):
    """Each prompt's greedy tokens when it runs by itself."""
    params = sp(temperature=0, max_tokens=24, ignore_eos=True)
    return [llm.generate(p, params)[0].outputs[0].token_ids for p in PROMPTS]


def make_llm(load, **options):
    return load("llm").LLM(device="cpu", dtype="float32", **options)


def test_a_cache_too_small_for_one_sequence_fails_naming_the_fix(load):
    with pytest.raises(
        ValueError, match=r"needs [\d,]+ bytes .*raise kv_cache_memory .* or lower max_model_len"
    ):
        make_llm(load, max_model_len=1024, kv_cache_memory=10 * BLOCK_BYTES)


def test_batched_paged_output_equals_each_prompt_alone(llm, sp, alone):
    outs = llm.generate(PROMPTS, sp(temperature=0, max_tokens=24, ignore_eos=True))
    for prompt, out, expected in zip(PROMPTS, outs, alone):
        assert out.outputs[0].token_ids == expected, prompt


def test_preemption_under_a_small_cache_changes_no_token(load, sp, alone):
    """Nine usable blocks cannot hold six sequences of two blocks each:
    requests are preempted and recomputed."""
    small = make_llm(load, max_model_len=128, max_num_seqs=6, kv_cache_memory=10 * BLOCK_BYTES)
    outs = small.generate(PROMPTS, sp(temperature=0, max_tokens=24, ignore_eos=True))
    assert sum(o.metrics.num_preemptions for o in outs) > 0, "the budget was meant to force preemption"
    for prompt, out, expected in zip(PROMPTS, outs, alone):
        assert out.outputs[0].token_ids == expected, prompt
    assert small.engine.stats().kv_blocks_used == 0


def test_chunked_prefill_equals_one_shot_prefill(load, sp, llm):
    """A 7-token budget splits every prompt into chunks; logits and tokens stay the same."""
    prompt = "Chunked prefill computes a long prompt a few tokens at a time, across several steps."
    chunked = make_llm(load, max_model_len=256, max_num_batched_tokens=7, enable_prefix_caching=False)
    params = sp(temperature=0, max_tokens=12, ignore_eos=True)
    assert (
        chunked.generate(prompt, params)[0].outputs[0].token_ids
        == llm.generate(prompt, params)[0].outputs[0].token_ids
    )
    ids = llm.tokenizer.encode(prompt)
    expected = llm.engine.model.sequence_logits(torch.tensor(ids))[-1]
    engine = chunked.engine
    (request_id,) = engine.add_requests([prompt], [sp(temperature=0, max_tokens=1)])
    logits = None
    while logits is None:
        plan = engine.scheduler.schedule()
        assert plan.total_tokens <= 7
        out = engine.runner.execute(plan)
        for r in plan.scheduled:
            r.num_computed += plan.num_scheduled_tokens[r.request_id]
        if request_id in out.logits_spans:
            logits = out.logits[out.logits_spans[request_id].start]
    engine.abort(request_id)
    assert float((logits - expected).norm() / expected.norm()) < 1e-5


def test_a_request_joining_mid_flight_shares_steps_without_changing_tokens(llm, sp, alone):
    """Continuous batching: B arrives while A decodes; their steps mix A's decodes with B's prefill."""
    engine = llm.engine
    params = sp(temperature=0, max_tokens=24, ignore_eos=True)
    a = engine.add_request(PROMPTS[0], params)
    for _ in range(5):
        engine.step()
    b = engine.add_request(PROMPTS[3], params)
    plans = []
    schedule = engine.scheduler.schedule
    engine.scheduler.schedule = lambda: plans.append(schedule()) or plans[-1]
    final = {}
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    final[out.request_id] = out.outputs[0].token_ids
    finally:
        del engine.scheduler.schedule
    assert plans[0].num_scheduled_tokens == {a: 1, b: len(llm.tokenizer.encode(PROMPTS[3]))}, "one mixed step"
    assert final[a] == alone[0] and final[b] == alone[3]


def test_abort_mid_flight_returns_every_block(llm, sp):
    engine = llm.engine
    ids = [engine.add_request(p, sp(max_tokens=50)) for p in PROMPTS]
    for _ in range(3):
        engine.step()
    assert engine.stats().kv_blocks_used > 0
    engine.abort(ids)
    assert not engine.has_unfinished_requests()
    assert engine.stats().kv_blocks_used == 0
    assert engine.kv.num_free_blocks == engine.kv.num_blocks - 1, (
        "every block but the null block is free again"
    )


def test_seeded_sampling_ignores_what_else_is_batched(llm, sp):
    params = sp(temperature=0.9, top_p=0.95, top_k=50, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate(PROMPTS[2], params)[0].outputs[0].token_ids
    others = sp(temperature=1.0, max_tokens=16, ignore_eos=True)
    crowd = llm.generate([PROMPTS[0], PROMPTS[2], PROMPTS[4]], [others, params, others])
    assert crowd[1].outputs[0].token_ids == alone


def test_prefix_caching_reuses_blocks_and_changes_no_token(load, sp):
    system = "You are a careful assistant. Answer in one short sentence. " * 6
    prompts = [system + "What is the capital of Italy?", system + "What is the boiling point of water?"]
    params = sp(temperature=0, max_tokens=12, ignore_eos=True)
    cached = make_llm(load, max_model_len=512)
    plain = make_llm(load, max_model_len=512, enable_prefix_caching=False)
    first = cached.generate(prompts[0], params)[0]
    second = cached.generate(prompts[1], params)[0]
    assert first.metrics.num_cached_tokens == 0
    shared = len(cached.tokenizer.encode(system)) // 16 * 16
    assert second.metrics.num_cached_tokens >= shared - 16, (
        "the shared system prompt's full blocks must be reused"
    )
    for prompt, out in zip(prompts, (first, second)):
        assert out.outputs[0].token_ids == plain.generate(prompt, params)[0].outputs[0].token_ids


def test_parallel_sampling_returns_n_completions_sharing_the_prompt(llm, sp):
    params = sp(temperature=1.0, n=4, max_tokens=10, seed=7, ignore_eos=True)
    (out,) = llm.generate("Name a colour:", params)
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 10 and c.finish_reason == "length" for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "four samples at temperature 1 should differ"
    again = llm.generate("Name a colour:", params)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs], (
        "seeded n > 1 reproduces"
    )
    assert out.metrics.num_output_tokens == 40
    greedy = llm.generate("Name a colour:", sp(temperature=0, n=3, max_tokens=10, ignore_eos=True))[0]
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids == greedy.outputs[2].token_ids


def test_stop_string_spanning_two_tokens_never_leaks_into_the_stream(llm, sp):
    free = (
        llm.generate("Count: 1, 2, 3,", sp(temperature=0, max_tokens=30, ignore_eos=True))[0].outputs[0].text
    )
    stop = free[2:7]  # a stop string that several tokens make up
    streamed = ""
    for snapshot in llm.stream(
        "Count: 1, 2, 3,", sp(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop])
    ):
        streamed += snapshot.outputs[0].delta_text
        assert stop not in streamed
    assert streamed == free[: free.find(stop)], (
        "text streamed before the stop string was found must not include it"
    )


def test_overlap_scheduling_drops_the_token_launched_after_a_stop_string(llm, sp):
    """Overlap scheduling (tests/test_overlap_scheduling.py; here for the tokenizer: stop strings match
    text) with the shared engine switched to it: the step after the stop string was already running, and its
    token is not emitted."""
    params = sp(temperature=0, max_tokens=30, ignore_eos=True, stop=[" 5,"])
    prompts = ["Count: 1, 2, 3,", "Say hello."]
    expected = llm.generate(prompts, params)
    engine = llm.engine
    engine.overlap = True
    try:
        overlap = llm.generate(prompts, params)
    finally:
        engine.overlap = False
    assert [(o.outputs[0].text, o.outputs[0].finish_reason) for o in overlap] == [
        (o.outputs[0].text, o.outputs[0].finish_reason) for o in expected
    ]
    assert expected[0].outputs[0].finish_reason == "stop", "the stop string never came: the test proves less"
    assert engine.in_flight is None and engine.kv.num_used_blocks == 0


def test_snapshots_do_not_share_mutable_state(llm, sp):
    snapshots = list(llm.stream("Hello", sp(temperature=0, max_tokens=5, ignore_eos=True)))
    assert [len(s.outputs[0].token_ids) for s in snapshots] == [1, 2, 3, 4, 5]
    assert snapshots[0].metrics.num_output_tokens == 1 and snapshots[-1].metrics.num_output_tokens == 5
    m = snapshots[-1].metrics
    assert m.queue_time >= 0 and m.ttft > 0 and len(m.itl) == 4 and m.tpot > 0


def test_the_three_output_kinds_add_up_to_the_same_completions(llm, sp):
    """ "cumulative" reports each step whole, "delta" only what each step added (text, token ids, token
    times), "final" once: for two sampled completions ended by a stop string, all three give the same
    completions."""
    engine = llm.engine
    prompt = "Count: 1, 2, 3,"  # both completions count on to ", 9", the stop string, held back as it grows
    params = sp(temperature=0.5, seed=5, n=2, max_tokens=30, ignore_eos=True, stop=[", 9"])
    kinds = ("cumulative", "delta", "final")
    ids = {engine.add_request(prompt, params, output_kind=kind): kind for kind in kinds}
    seen: dict[str, list] = {kind: [] for kind in kinds}
    while engine.has_unfinished_requests():
        for output in engine.step():
            seen[ids[output.request_id]].append(output)
    (final,) = seen["final"]
    assert [c.finish_reason for c in final.outputs] == ["stop", "stop"], (
        "the stop string was meant to end both"
    )
    assert final.finished and all(not o.finished for kind in kinds for o in seen[kind][:-1])
    for index, whole in enumerate(final.outputs):
        pieces = [c for o in seen["delta"] for c in o.outputs if c.index == index]
        assert all(c.text == c.delta_text and c.token_ids == c.delta_token_ids for c in pieces), (
            "a delta output's text and token ids are what its step added"
        )
        assert "".join(c.text for c in pieces) == whole.text, f"completion {index}: the deltas' text"
        assert [t for c in pieces for t in c.token_ids] == whole.token_ids, f"completion {index}: the ids"
        assert seen["cumulative"][-1].outputs[index].token_ids == whole.token_ids
    assert [t for o in seen["delta"] for t in o.metrics.token_times] == final.metrics.token_times
    with pytest.raises(ValueError, match="output_kind must be one of cumulative, delta, final; got 'deltas'"):
        engine.add_request(prompt, params, output_kind="deltas")


@pytest.mark.interpreter  # a CPU engine on the Triton kernels
def test_triton_backend_gives_the_same_tokens(load, sp, llm):
    """The Lesson 2 kernels (store_kv, the varlen paged prefill, the paged decode; through the interpreter on
    CPU) drive the engine to the same greedy tokens as the torch path."""
    triton_llm = make_llm(load, max_model_len=256, attention_backend="triton")
    prompts = ["The capital of France is", "The capital of France is a city"]
    params = sp(temperature=0, max_tokens=4, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in triton_llm.generate(prompts, params)] == [
        o.outputs[0].token_ids for o in llm.generate(prompts, params)
    ]


def test_a_bfloat16_cpu_engine_keeps_a_float32_kv_cache(load, sp, alone, monkeypatch):
    """torch's fused CPU attention is several times slower in bfloat16: a bfloat16 model on a CPU stores and
    attends over float32 K/V (queries cast in, outputs cast back). A wrong cast or scale would derail greedy
    decoding at once; bfloat16 rounding only flips near-ties, later (measured: 10-12 tokens agree)."""
    monkeypatch.setenv("FASTMODE_CPU_LINEAR", "linear")  # the products' paths are not what this test is about
    llm = load("llm").LLM(device="cpu", dtype="bfloat16", max_num_seqs=4, max_model_len=256)
    assert llm.engine.model.norm.weight.dtype == torch.bfloat16
    assert llm.engine.runner.cache.k.dtype == torch.float32
    params = sp(temperature=0, max_tokens=6, ignore_eos=True)
    for prompt, expected in zip(PROMPTS, alone):
        assert llm.generate(prompt, params)[0].outputs[0].token_ids == expected[:6], prompt
