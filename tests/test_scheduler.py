"""Lab 3: the continuous-batching scheduler, tested without a model.

A tiny simulator plays the runner: every scheduled token is "computed", and a request that reaches the end
of its tokens gains one output token. Requests finish after ``max_tokens`` outputs.
"""

from __future__ import annotations

import random

import pytest

pytestmark = pytest.mark.lab3

BLOCK = 4


@pytest.fixture
def make(load):
    request_mod = load("engine.request")
    params_mod = load("sampling_params")
    scheduler_mod = load("engine.scheduler")
    manager_mod = load("cache.kv_cache_manager")

    def build(num_blocks=64, max_num_seqs=4, budget=16, max_model_len=64, prefix_caching=True):
        kv = manager_mod.KVCacheManager(num_blocks, BLOCK, prefix_caching)
        return scheduler_mod.Scheduler(kv, max_num_seqs, budget, max_model_len)

    counter = iter(range(10**6))

    def request(prompt_len: int, max_tokens: int = 4, first_token: int | None = None):
        start = next(counter) * 1000 if first_token is None else first_token
        params = params_mod.SamplingParams(temperature=0, max_tokens=max_tokens)
        group = request_mod.RequestGroup(
            f"r{start}", None, list(range(start, start + prompt_len)), params, 0.0
        )
        r = request_mod.Request(group.request_id, group, 0, detokenizer=None)
        group.requests.append(r)
        return r

    return build, request


def run_step(scheduler, finished: list) -> object:
    """Play the runner and the engine's update for one planned step (checking that a step which preempted
    admitted nobody)."""
    running_before = {r.request_id for r in scheduler.running}
    plan = scheduler.schedule()
    admitted = [r.request_id for r in plan.scheduled if r.request_id not in running_before]
    assert not (plan.preempted and admitted), (
        f"the step preempted {[r.request_id for r in plan.preempted]} and admitted {admitted} from "
        "the waiting queue: a step that had to preempt admits nobody (the cache is full; "
        "re-admitting a victim thrashes)"
    )
    for r in plan.scheduled:
        r.num_computed += plan.num_scheduled_tokens[r.request_id]
        if r.num_computed == r.num_tokens:
            r.output_token_ids.append(7)
            if len(r.output_token_ids) >= r.params.max_tokens:
                scheduler.finish(r)
                finished.append(r)
            else:
                scheduler.kv.cache_full_blocks(r)
    return plan


def check_plan(scheduler, plan) -> None:
    assert plan.total_tokens <= scheduler.max_num_batched_tokens, (
        f"the step runs {plan.total_tokens} tokens, over max_num_batched_tokens="
        f"{scheduler.max_num_batched_tokens}: each request may take only what is left of the budget"
    )
    assert len(plan.scheduled) <= scheduler.max_num_seqs, (
        f"{len(plan.scheduled)} sequences scheduled, over max_num_seqs={scheduler.max_num_seqs}"
    )
    assert all(n >= 1 for n in plan.num_scheduled_tokens.values()), (
        "a scheduled request must run at least 1 token"
    )
    assert len(scheduler.running) <= scheduler.max_num_seqs, "more running requests than max_num_seqs"


def test_decodes_run_first_and_prompts_fill_the_rest_in_chunks(make):
    build, request = make
    scheduler = build(budget=16)
    long_prompt, short = request(40), request(3)
    scheduler.add(long_prompt)
    scheduler.add(short)
    plan = scheduler.schedule()
    assert plan.num_scheduled_tokens == {long_prompt.request_id: 16}, (
        "the first waiting request takes the whole budget (its prompt is chunked); nothing else fits"
    )
    long_prompt.num_computed += 16
    plan = scheduler.schedule()
    assert plan.num_scheduled_tokens[long_prompt.request_id] == 16, (
        "a running prefill continues with its next chunk"
    )


def test_a_step_mixes_decodes_and_a_prefill_chunk_decodes_first(make):
    build, request = make
    scheduler = build(budget=8)
    a = request(3)
    scheduler.add(a)
    finished: list = []
    run_step(scheduler, finished)  # a's prompt is computed and it gains a token: now it decodes
    b = request(20)
    scheduler.add(b)
    plan = scheduler.schedule()
    assert [r.request_id for r in plan.scheduled] == [a.request_id, b.request_id], (
        "decodes come first in the plan"
    )
    assert plan.num_scheduled_tokens == {a.request_id: 1, b.request_id: 7}, (
        "a decode takes one token and the waiting prompt gets what is left of the budget"
    )


def test_max_num_seqs_limits_admission(make):
    build, request = make
    scheduler = build(max_num_seqs=2, budget=100)
    for _ in range(3):
        scheduler.add(request(5))
    plan = scheduler.schedule()
    assert len(plan.scheduled) == 2 and len(scheduler.waiting) == 1, (
        f"{len(plan.scheduled)} scheduled and {len(scheduler.waiting)} waiting with max_num_seqs=2 and 3 "
        "requests: admit only while fewer than max_num_seqs are running"
    )


def test_running_out_of_blocks_preempts_the_newest_request(make):
    build, request = make
    # 6 usable blocks of 4 tokens: two prompts of 8 tokens hold 4 of them; growing needs more.
    scheduler = build(num_blocks=7, budget=32, max_num_seqs=4, max_model_len=24)
    old, new = request(8, max_tokens=12), request(8, max_tokens=12)
    scheduler.add(old)
    scheduler.add(new)
    finished: list = []
    preempted = []
    for _ in range(60):
        plan = run_step(scheduler, finished)
        check_plan(scheduler, plan)
        preempted.extend(plan.preempted)
        if not scheduler.has_unfinished():
            break
    assert preempted, "the cache was too small for both requests: one must have been preempted"
    assert all(r is new for r in preempted), (
        "the victim must be the most recently admitted request, never the oldest"
    )
    assert {r.request_id for r in finished} == {old.request_id, new.request_id}, (
        "every request must still finish"
    )
    assert scheduler.kv.num_used_blocks == 0, "finished requests must return every block"


def test_preempted_request_goes_back_to_the_front_of_the_queue(make):
    build, request = make
    scheduler = build(num_blocks=7, budget=32, max_num_seqs=4, max_model_len=24)
    a, b, c = request(8, max_tokens=12), request(8, max_tokens=12), request(4, max_tokens=2)
    for r in (a, b):
        scheduler.add(r)
    finished: list = []
    while True:
        plan = run_step(scheduler, finished)
        if plan.preempted:
            break
    scheduler.add(c)
    assert scheduler.waiting[0] is b, "a preempted request is recomputed before requests that arrived later"
    assert b.num_computed == 0, "a preempted request is recomputed from scratch (or from the prefix cache)"
    assert scheduler.kv.num_used_blocks == len(scheduler.kv.block_table(a.request_id)), (
        "preemption frees all its blocks"
    )


@pytest.mark.parametrize("seed", range(8), ids=lambda s: f"seed{s}")
def test_random_workloads_respect_the_limits_and_everything_finishes(make, seed):
    """Mixed prompt and output lengths under a small cache: limits hold every step, nobody waits forever."""
    build, request = make
    rng = random.Random(seed)
    scheduler = build(num_blocks=rng.randint(9, 40), budget=rng.choice([4, 8, 16, 33]), max_model_len=32)
    requests = [request(rng.randint(1, 20), max_tokens=rng.randint(1, 12)) for _ in range(12)]
    pending = list(requests)
    finished: list = []
    steps = 0
    while steps < 2000:
        steps += 1
        if pending and rng.random() < 0.5:
            scheduler.add(pending.pop(0))
        plan = run_step(scheduler, finished)
        check_plan(scheduler, plan)
        if not pending and not scheduler.has_unfinished():
            break
    assert len(finished) == len(requests), (
        f"only {len(finished)} of {len(requests)} requests finished in {steps} steps"
    )
    assert scheduler.kv.num_used_blocks == 0, (
        f"{scheduler.kv.num_used_blocks} blocks still in use after every request finished: a block was leaked"
    )


def test_finish_of_a_waiting_request_removes_it(make):
    build, request = make
    scheduler = build(max_num_seqs=1)
    a, b = request(3), request(3)
    scheduler.add(a)
    scheduler.add(b)
    scheduler.schedule()
    scheduler.finish(b)  # an abort while it waits
    scheduler.finish(a)  # an abort while it runs
    assert not scheduler.has_unfinished() and scheduler.kv.num_used_blocks == 0, (
        "finish must take a request out of waiting or running and free the blocks of a running one"
    )


def test_a_step_that_preempts_admits_nobody(make):
    """Two requests outgrow a small cache while a third waits. The step that preempts one must not even try to
    admit a waiting request: the cache has just run out, and the front of the queue is the victim just sent
    back, which would take back the blocks its preemption freed and be preempted again the next step."""
    build, request = make
    scheduler = build(num_blocks=7, budget=32, max_num_seqs=2, max_model_len=24)
    old, new, late = request(8, max_tokens=12), request(8, max_tokens=12), request(4, max_tokens=2)
    for r in (old, new, late):
        scheduler.add(r)
    tried: list[str] = []
    lookup = scheduler.kv.lookup_prefix
    scheduler.kv.lookup_prefix = lambda r: tried.append(r.request_id) or lookup(r)
    finished: list = []
    preempting_steps = 0
    for _ in range(80):
        tried.clear()
        plan = run_step(scheduler, finished)
        if plan.preempted:
            preempting_steps += 1
            assert not tried, (
                f"the step preempted {[r.request_id for r in plan.preempted]} and then tried to admit "
                f"{tried} (lookup_prefix): a step that had to preempt admits nobody"
            )
        if not scheduler.has_unfinished():
            break
    assert preempting_steps, "the cache was too small for both requests: one must have been preempted"
    assert len(finished) == 3, f"{len(finished)} of 3 requests finished"


def test_admission_reuses_the_prefix_cache(make):
    build, request = make
    scheduler = build(num_blocks=16, budget=32)
    first = request(12, max_tokens=1)
    scheduler.add(first)
    run_step(
        scheduler, []
    )  # computes the prompt, samples its one token, finishes: its 3 full blocks stay cached
    second = request(
        15, max_tokens=1, first_token=first.prompt_token_ids[0]
    )  # the same 12 tokens, then 3 more
    scheduler.add(second)
    plan = scheduler.schedule()
    scheduled = plan.num_scheduled_tokens.get(second.request_id)
    assert scheduled == 3 and second.num_computed == 12, (
        "the second request shares its first 12 tokens (3 full blocks) with a finished one, yet it starts at "
        f"token {second.num_computed} and runs {scheduled} tokens, not 3: on admission look the prompt up "
        "(prefix = self.kv.lookup_prefix(request)), pass the prefix to allocate_slots with the tokens after "
        "it, then set request.num_computed = prefix.num_tokens, so prefix-cache hits are not recomputed"
    )


def test_a_failed_admission_leaves_the_request_waiting_with_nothing(make):
    build, request = make
    scheduler = build(num_blocks=7, budget=16, max_num_seqs=4)  # 6 usable blocks of 4 tokens
    first = request(8, max_tokens=1)
    scheduler.add(first)
    run_step(scheduler, [])  # finishes at once: its 2 full blocks stay cached (evictable)
    long_runner = request(12, max_tokens=20)
    scheduler.add(long_runner)
    run_step(scheduler, [])  # 3 blocks; 1 free block and the 2 cached ones left
    # hits 2 blocks, then needs 3 more
    sharer = request(20, max_tokens=1, first_token=first.prompt_token_ids[0])
    scheduler.add(sharer)
    plan = scheduler.schedule()
    assert sharer.request_id not in plan.num_scheduled_tokens, (
        "12 more tokens need 3 blocks with 1 free: no room"
    )
    assert sharer.num_computed == 0 and scheduler.waiting[0] is sharer, (
        f"a request that allocate_slots did not admit waits at the front of the queue with nothing computed "
        f"(num_computed {sharer.num_computed}): set request.num_computed = prefix.num_tokens only once "
        "allocate_slots admits it"
    )
    running_blocks = sum(len(scheduler.kv.block_table(r.request_id)) for r in scheduler.running)
    assert scheduler.kv.num_used_blocks == running_blocks and not scheduler.kv.holds(sharer.request_id), (
        f"{scheduler.kv.num_used_blocks} blocks in use, {running_blocks} of them by running requests, after "
        "an admission that failed: a refused allocate_slots takes nothing, so there is nothing to give back"
    )


def test_a_speculating_decode_is_scheduled_with_its_drafts(make):
    """With speculative decoding on, a decode verifies its drafts in the same step: 1 + len(spec_token_ids)
    tokens, the drafts trimmed where they would pass max_model_len."""
    build, request = make
    for max_model_len, want in ((64, 4), (9, 3)):
        scheduler = build(budget=16, max_model_len=max_model_len)
        r = request(6)
        scheduler.add(r)
        r.num_computed += scheduler.schedule().num_scheduled_tokens[r.request_id]
        r.output_token_ids.append(7)
        r.spec_token_ids = [11, 12, 13]
        got = scheduler.schedule().num_scheduled_tokens.get(r.request_id)
        assert got == want, (
            f"a decode with 3 drafts at {r.num_tokens - 3} tokens (max_model_len {max_model_len}) was "
            f"scheduled {got} tokens, expected {want}: it runs its new token and verifies its drafts in one "
            "step, self._tokens_needed(request) (the drafts trimmed at max_model_len), not only "
            "num_tokens - num_computed"
        )


def test_an_admitted_request_is_marked_running(make):
    """The engine caches a request's full blocks for the prefix cache only while its status is RUNNING."""
    build, request = make
    scheduler = build()
    r = request(6)
    scheduler.add(r)
    scheduler.schedule()
    assert r.status is type(r.status).RUNNING, (
        f"an admitted request's status is {r.status}: set request.status = Status.RUNNING when it moves to "
        "running (the engine caches a request's full blocks for the prefix cache only while it is RUNNING)"
    )
