"""The GPU step: decode graphs replay exactly what eager steps compute, and a steady-state step reads the
device once. The graph logic runs on a CPU through ``RecordedCall`` (capture keeps the function over the
static buffers, replay calls it again); the same checks with real CUDA graphs, the sync count and the HF
oracle on CUDA run only where a GPU is present."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from solutions.engine.cuda_graphs import RecordedCall, batch_buckets
from solutions.sampling_params import SamplingParams

requires_cuda = pytest.mark.requires_cuda  # conftest.py skips these without a GPU
BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # K and V x layers x block_size x KV heads x head_dim x float32


def make_llm(folder: Path, device: str = "cpu", **options):
    from solutions import LLM

    defaults = dict(skip_tokenizer_init=True, dtype="float32", max_num_seqs=8, max_model_len=256)
    return LLM(model=str(folder), device=device, **{**defaults, **options})


def test_batch_buckets_cover_every_batch_size():
    assert batch_buckets(1) == [1]
    assert batch_buckets(5) == [1, 2, 4, 5]
    assert batch_buckets(32) == [1, 2, 4, 8, 16, 24, 32]
    assert batch_buckets(100) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100]


def run_schedule(llm, arrivals: list[tuple[int, list[int], SamplingParams]]) -> dict[str, list[int]]:
    """Add each ``(step, prompt, params)`` before that step; step until done; the finished token ids by id."""
    engine, final, step = llm.engine, {}, 0
    pending = sorted(arrivals, key=lambda a: a[0])
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, prompt, params = pending.pop(0)
            engine.add_request(prompt, params, request_id=f"r{len(final) + len(engine.groups)}-{step}")
        for out in engine.step():
            if out.finished:
                final[out.request_id] = [c.token_ids for c in out.outputs]
        step += 1
    return final


def arrivals(batch: int) -> list[tuple[int, list[int], SamplingParams]]:
    """``batch`` requests at first, two more joining later;
    lengths differ so requests finish at different steps."""
    g = torch.Generator().manual_seed(batch)
    out = []
    for i in range(batch + 2):
        prompt = torch.randint(0, 101, (5 + 7 * i,), generator=g).tolist()
        params = SamplingParams(temperature=0, max_tokens=12 + 9 * i, ignore_eos=True)
        out.append((0 if i < batch else 6 * (i - batch + 1), prompt, params))
    return out


@pytest.mark.parametrize("batch", [1, 3, 5])
def test_recorded_graphs_replay_what_eager_steps_compute(tiny_folder, batch):
    """Requests join, finish and (with a cache of 14 blocks) get preempted; decode steps replay graphs of
    buckets 1, 2, 4, 8 with padding rows; every token equals the eager engine's."""
    budget = dict(kv_cache_memory=18 * BLOCK_BYTES)
    eager = run_schedule(make_llm(tiny_folder, **budget), arrivals(batch))
    llm = make_llm(tiny_folder, **budget)
    engine = llm.engine
    engine.runner.capture_decode_graphs(engine.config.max_num_seqs, RecordedCall)
    replays, runner = [], engine.runner
    execute, replay = runner.execute, runner.graphs.replay
    runner.execute = lambda plan, **kw: replays.append([len(plan.scheduled)]) or execute(plan, **kw)
    runner.graphs.replay = lambda bucket: replays[-1].append(bucket) or replay(bucket)
    graphed = run_schedule(llm, arrivals(batch))
    assert graphed == eager
    replayed = [step for step in replays if len(step) == 2]
    assert replayed, "no decode step replayed a graph"
    if batch > 1:
        assert any(live < bucket for live, bucket in replayed), "no bucket ran with padding rows"
    null_block = engine.runner.cache.k[:, 0], engine.runner.cache.v[:, 0]
    assert all(float(t.abs().max()) == 0 for t in null_block), "padding rows wrote into the null block"


def test_recorded_graphs_replay_draft_verification(tiny_folder):
    """Steps verifying n-gram draft chains replay the decode graphs too, each token a row of its own that
    attends up to its position: with requests joining, finishing and preempted, the tokens equal the plain
    engine's, and steps holding drafts (more rows than requests) were replayed."""
    g = torch.Generator().manual_seed(1)
    phrase = torch.randint(0, 101, (5,), generator=g).tolist()
    schedule = [
        (2 * i, phrase * (2 + i) + [i], SamplingParams(temperature=0, max_tokens=10 + 7 * i, ignore_eos=True))
        for i in range(4)
    ]
    budget = dict(kv_cache_memory=18 * BLOCK_BYTES, max_num_seqs=4)
    plain = run_schedule(make_llm(tiny_folder, **budget), schedule)
    llm = make_llm(tiny_folder, speculative="ngram", num_speculative_tokens=3, **budget)
    engine, steps = llm.engine, []
    assert engine.config.max_graph_rows == 16
    engine.runner.capture_decode_graphs(engine.config.max_graph_rows, RecordedCall)
    execute, replay = engine.runner.execute, engine.runner.graphs.replay

    def count(plan, **kwargs):
        steps.append([len(plan.scheduled), sum(plan.num_scheduled_tokens.values())])
        return execute(plan, **kwargs)

    engine.runner.execute = count
    engine.runner.graphs.replay = lambda bucket: steps[-1].append(bucket) or replay(bucket)
    assert run_schedule(llm, schedule) == plain
    verified = [(requests, tokens) for requests, tokens, *bucket in steps if bucket and tokens > requests]
    assert verified, "no step verifying drafts replayed a graph"
    assert engine.speculator.mean_acceptance_length > 1, "no draft was accepted: the test proves less"


def test_preemption_happens_in_the_graph_schedule(tiny_folder):
    """The cache above holds 17 usable blocks: the 5-request schedule must preempt,
    or the test proves less."""
    llm = make_llm(tiny_folder, kv_cache_memory=18 * BLOCK_BYTES)
    engine = llm.engine
    engine.runner.capture_decode_graphs(engine.config.max_num_seqs, RecordedCall)
    preempted = []
    original = engine.scheduler._preempt
    engine.scheduler._preempt = lambda request: preempted.append(request.request_id) or original(request)
    run_schedule(llm, arrivals(5))
    assert preempted, "no request was preempted: shrink the cache"


def test_each_bucket_is_tuned_before_its_capture_and_padding_only_pads(tiny_folder, monkeypatch):
    """The decode kernel is tuned once per bucket the graphs capture, all before the first capture (a warm-up
    step's padding has no context to time), through ``_tune_decode_buckets`` alone: warming a bucket up only
    pads it. On a CPU nothing is tuned."""
    from solutions.engine import runner as runner_module

    llm = make_llm(tiny_folder)
    runner, events = llm.engine.runner, []
    monkeypatch.setattr(runner_module, "tune_decode", lambda *a, batch, **kw: events.append(("tune", batch)))
    runner.capture_decode_graphs(llm.engine.config.max_num_seqs, RecordedCall)
    assert events == [], "a CPU engine tuned the decode kernel"

    forward = runner._decode_forward
    monkeypatch.setattr(runner, "_tunes_decode", lambda: True)  # as on CUDA with the Triton backend
    monkeypatch.setattr(runner, "_decode_forward", lambda b: events.append(("forward", b)) or forward(b))
    runner.capture_decode_graphs(llm.engine.config.max_num_seqs, RecordedCall)
    buckets = runner.graphs.buckets
    tuned = [b for kind, b in events if kind == "tune"]
    assert sorted(tuned) == buckets, f"tuned {tuned}, captured {buckets}: each bucket once"
    first_forward = next(i for i, (kind, _) in enumerate(events) if kind == "forward")
    assert events[:first_forward] == [("tune", b) for b in tuned], f"tuned after a capture began: {events}"
    assert {b for kind, b in events if kind == "forward"} == set(buckets)
    events.clear()
    runner._pad_bucket(buckets[-1])
    assert events == [], "padding a bucket tuned it"
    captures = runner.startup["captures"]
    assert [c["bucket"] for c in captures] == buckets[::-1], "captures are recorded largest first"
    assert all(c["seconds"] >= 0 and c["MiB"] is None for c in captures), "a stand-in holds no device memory"
    assert runner.startup["tuned_calls"] == len(buckets)


def test_every_eager_decode_call_was_tuned_at_start_up(tiny_folder, monkeypatch):
    """No request waits on a tuner (issue 47): ``tune_eager_decode`` tunes one call of every decode tuning key
    an eager step can meet, so the decode calls of joins, finishes and preemption all hit tuned keys."""
    from solutions.engine import runner as runner_module
    from solutions.kernels.paged_attention import decode_tuning_key

    tuned = []
    record = lambda *a, batch, max_seq_len, **kw: tuned.append((batch, max_seq_len))
    monkeypatch.setattr(runner_module, "tune_decode", record)
    llm = make_llm(tiny_folder, max_num_seqs=5, kv_cache_memory=18 * BLOCK_BYTES)
    runner = llm.engine.runner
    assert tuned == [] and runner.startup["tuned_calls"] == 0, "a CPU engine tuned the decode kernel"
    monkeypatch.setattr(runner, "_tunes_decode", lambda: True)  # as on CUDA with the Triton backend
    runner.tune_eager_decode()
    assert runner.startup["tuned_calls"] == len(tuned) == len(set(tuned)) > 1
    kv_heads, device = llm.engine.model_config.num_kv_heads, runner.device
    keys = {decode_tuning_key(batch, kv_heads, length, device) for batch, length in tuned}
    assert len(keys) == len(tuned), "two tuning calls share a key: one was wasted"
    met, forward = [], runner.forward
    monkeypatch.setattr(
        runner,
        "forward",
        lambda inputs, *a: (
            met.append((len(inputs.seq_lens), inputs.max_seq_len, inputs.max_query_len))
            or forward(inputs, *a)
        ),
    )
    run_schedule(llm, arrivals(5))
    decodes = {(batch, length) for batch, length, queries in met if queries == 1}
    assert len({batch for batch, _ in decodes}) > 2, "the schedule met too few batch sizes to prove much"
    untuned = [(b, n) for b, n in decodes if decode_tuning_key(b, kv_heads, n, device) not in keys]
    assert not untuned, f"decode calls (batch, longest context) {untuned} would tune inside a step"


def as_on_a_gpu(llm) -> list[int]:
    """Set a CPU engine (``attention_backend="triton"``) up as a CUDA engine runs: the fused Triton ops, no
    CPU-only decode path, decode graphs captured (recorded). Returns the list each replay adds its bucket
    to."""
    from solutions.model.layer_ops import triton_layer_ops

    engine = llm.engine
    engine.model.use_ops(triton_layer_ops())
    engine.model.fused_decode = None  # the CPU's layers without module calls: not on a GPU
    engine.runner.capture_decode_graphs(engine.config.max_graph_rows, RecordedCall)
    replayed, replay = [], engine.runner.graphs.replay
    engine.runner.graphs.replay = lambda bucket: replayed.append(bucket) or replay(bucket)
    return replayed


@pytest.mark.interpreter  # a CPU engine on the Triton kernels
def test_the_gpu_step_run_on_a_cpu_equals_the_plain_engine(tiny_folder):
    """What a CUDA engine runs, run here: the Triton paged attention and the fused Triton ops (interpreted),
    decode graphs replayed (recorded), no CPU-only decode path; through joins, finishes and preemption its
    tokens equal the plain CPU engine's."""
    budget = dict(kv_cache_memory=18 * BLOCK_BYTES)
    plain = run_schedule(make_llm(tiny_folder, **budget), arrivals(5))
    llm = make_llm(tiny_folder, attention_backend="triton", **budget)
    replayed = as_on_a_gpu(llm)
    assert run_schedule(llm, arrivals(5)) == plain
    assert replayed, "no decode step replayed a graph"


@pytest.mark.interpreter  # a CPU engine on the Triton kernels
def test_the_gpu_speculative_step_run_on_a_cpu_equals_the_plain_engine(tiny_folder):
    """n-gram drafts verified as a CUDA engine verifies them (each chain's tokens rows of the recorded decode
    graphs, through the Triton paged decode kernel and the fused ops; steps with a prefill chunk eagerly,
    through the Triton prefill kernel): the plain engine's tokens."""
    g = torch.Generator().manual_seed(0)
    phrase = torch.randint(0, 101, (6,), generator=g).tolist()
    prompts = [phrase * 4, phrase[:3] * 5, torch.randint(0, 101, (9,), generator=g).tolist()]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in make_llm(tiny_folder).generate(prompts, params)]
    llm = make_llm(tiny_folder, attention_backend="triton", speculative="ngram", num_speculative_tokens=3)
    replayed = as_on_a_gpu(llm)
    outs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == plain
    assert max(o.metrics.mean_acceptance_length for o in outs) > 1, (
        "no draft was accepted: the test proves less"
    )
    # Three requests fill more than 4 rows only with drafts.
    assert max(replayed) >= 8, "no step verifying drafts replayed a graph: the test proves less"


def count_host_reads(monkeypatch, packages: tuple[str, ...] = ("engine",)) -> list[str]:
    """Patch the Tensor methods that turn device values into host values;
    record each call made from the given packages of solutions/."""
    calls: list[str] = []
    solutions = Path(__file__).resolve().parents[1] / "solutions"
    dirs = tuple(str(solutions / package) for package in packages)
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(dirs):
                calls.append(f"{_name} in {Path(caller).name}:{sys._getframe(1).f_lineno}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return calls


def reads_of_each_step(engine, calls: list[str], steps: int) -> list[list[str]]:
    """Run ``steps`` engine steps; the host reads (``count_host_reads``'s ``calls``) that each one made."""
    reads = []
    for _ in range(steps):
        before = len(calls)
        engine.step()
        reads.append(calls[before:])
    return reads


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "recorded-graphs"])
def test_a_steady_decode_step_reads_the_device_once(tiny_folder, monkeypatch, graphs):
    """The hot path (engine/: runner, input batch, sampler, engine) converts exactly one tensor to host values
    per step, the sampled ids, for greedy rows and sampled ones (temperature, top-k, top-p, min-p, seeded or
    not)."""
    llm = make_llm(tiny_folder)
    engine = llm.engine
    if graphs:
        engine.runner.capture_decode_graphs(engine.config.max_num_seqs, RecordedCall)
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=20, max_tokens=40, ignore_eos=True, seed=3),
        SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=40, ignore_eos=True, seed=5),
        SamplingParams(temperature=1.2, min_p=0.05, top_p=0.95, max_tokens=40, ignore_eos=True),
    ]
    for i, p in enumerate(params):
        engine.add_request([1 + i, 2, 3, 4, 5], p)
    for _ in range(3):  # prefill, then warm decode steps
        engine.step()
    calls = count_host_reads(monkeypatch)
    for reads in reads_of_each_step(engine, calls, 5):
        assert len(reads) == 1, f"host reads in one decode step: {reads}"
    monkeypatch.undo()
    engine.abort([g for g in list(engine.groups)])


def test_a_greedy_eagle_chain_step_reads_the_device_twice(tiny_folder, tmp_path, monkeypatch):
    """With decode graphs (recorded), a steady step of greedy requests that all draft EAGLE chains reads the
    device twice from engine/ and speculative/: the drafts (one read for the whole chain) and the target's
    choices over the verified rows. (The head here is untrained: its drafts are read, seldom accepted.)"""
    from solutions.speculative.eagle import EagleHead, save_head

    config, head = make_llm(tiny_folder).engine.model.config, tmp_path / "head.safetensors"
    save_head(EagleHead(config, torch.arange(config.vocab_size)), head, {})
    llm = make_llm(tiny_folder, speculative="eagle", num_speculative_tokens=3, eagle_head=str(head))
    engine = llm.engine
    engine.runner.capture_decode_graphs(engine.config.max_graph_rows, RecordedCall)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    for i in range(3):
        engine.add_request([1 + i, 2, 3, 4, 5], params)
    for _ in range(3):  # prefill, then warm steps
        engine.step()
    drafted, execute = [], engine.runner.execute
    engine.runner.execute = lambda plan, **kw: (
        drafted.append([len(r.spec_token_ids) for r in plan.scheduled]) or execute(plan, **kw)
    )
    calls = count_host_reads(monkeypatch, ("engine", "speculative"))
    for reads, chains in zip(reads_of_each_step(engine, calls, 5), drafted, strict=True):
        assert chains == [3, 3, 3], "every request drafts a whole chain: the test proves less"
        assert len(reads) == 2, f"host reads in one EAGLE step: {reads}"
    monkeypatch.undo()
    engine.abort(list(engine.groups))


@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
def test_a_sampled_eagle_chain_step_reads_the_device_twice(tiny_folder, tmp_path, monkeypatch, seeded):
    """Sampled requests (temperature, top-p, min-p) verifying EAGLE chains of sampled drafts read the device
    as often as greedy ones: the drafts, then the verify's verdicts (accepted counts and next tokens in one
    read); no probabilities reach the host."""
    from solutions.speculative.eagle import EagleHead, save_head

    config, head = make_llm(tiny_folder).engine.model.config, tmp_path / "head.safetensors"
    save_head(EagleHead(config, torch.arange(config.vocab_size)), head, {})
    llm = make_llm(tiny_folder, speculative="eagle", num_speculative_tokens=3, eagle_head=str(head))
    engine = llm.engine
    engine.runner.capture_decode_graphs(engine.config.max_graph_rows, RecordedCall)
    seed = 1 if seeded else None
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=60, ignore_eos=True, seed=seed),
        SamplingParams(temperature=1.0, min_p=0.05, max_tokens=60, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=60, ignore_eos=True),
    ]
    for i, p in enumerate(params):
        engine.add_request([1 + i, 2, 3, 4, 5], p)
    for _ in range(3):  # prefill, then warm steps
        engine.step()
    drafted, execute = [], engine.runner.execute
    engine.runner.execute = lambda plan, **kw: (
        drafted.append([len(r.spec_token_ids) for r in plan.scheduled]) or execute(plan, **kw)
    )
    calls = count_host_reads(monkeypatch, ("engine", "speculative"))
    for reads, chains in zip(reads_of_each_step(engine, calls, 4), drafted, strict=True):
        assert chains == [3, 3, 3], "every request drafts a whole chain: the test proves less"
        assert len(reads) == 2, f"host reads in one sampled EAGLE step: {reads}"
    monkeypatch.undo()
    engine.abort(list(engine.groups))


@pytest.mark.interpreter  # the fused Triton ops on a CPU
def test_a_head_on_the_fused_triton_ops_computes_what_the_plain_ops_do(tiny_folder, tmp_path):
    """A CUDA engine's EAGLE head runs its layer's chains through the fused Triton kernels (``load_head``
    gives it the target's ops): its features equal the plain chains' up to rounding."""
    from solutions.model.layer_ops import PLAIN_OPS, triton_layer_ops
    from solutions.model.llama import use_layer_ops
    from solutions.speculative.eagle import DraftKV, EagleHead, load_head, save_head

    model = make_llm(tiny_folder).engine.model
    config, path = model.config, tmp_path / "head.safetensors"
    save_head(EagleHead(config, torch.arange(config.vocab_size)), path, {})
    head = load_head(model, path)
    g = torch.Generator().manual_seed(0)
    features = torch.randn(6, config.hidden_size, generator=g)
    tokens = torch.randint(0, config.vocab_size, (6,), generator=g)
    outs = []
    for ops in (PLAIN_OPS, triton_layer_ops()):
        use_layer_ops(head, ops)
        outs.append(head(features, tokens, torch.arange(6), DraftKV().attend(["r"], [6])))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_forked_completions_beyond_max_num_seqs_get_rows(tiny_folder):
    """n > 1 completions fork after the prompt's prefill, so the running requests may outnumber max_num_seqs:
    the persistent batch grows its rows instead of failing."""
    llm = make_llm(tiny_folder, max_num_seqs=2)
    params = SamplingParams(temperature=0.8, n=3, max_tokens=6, ignore_eos=True, seed=1)
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = llm.generate([[3, 4, 5], [6, 7]], [params, greedy])
    assert [len(o.outputs) for o in outs] == [3, 1]
    assert all(len(c.token_ids) == 6 for o in outs for c in o.outputs)
    assert len(llm.engine.runner.batch.num_blocks) > 2, "four requests ran at once on two rows"


def test_seeded_sampling_is_the_same_alone_and_batched(tiny_folder):
    """A seeded request's tokens depend on its seed alone, not on what shares its steps."""
    llm = make_llm(tiny_folder)
    seeded = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=20, ignore_eos=True, seed=11)
    alone = llm.generate([[5, 6, 7]], seeded)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=25, ignore_eos=True)
    batched = llm.generate([[9, 9], [5, 6, 7], [1, 2, 3, 4]], [others, seeded, others])
    assert batched[1].outputs[0].token_ids == alone


# -- on a CUDA GPU -------------------------------------------------------------------------------------------


@requires_cuda
def test_cuda_graphs_equal_eager_through_preemption_and_abort(tiny_folder):
    budget = dict(kv_cache_memory=18 * BLOCK_BYTES, max_num_batched_tokens=512)
    eager = run_schedule(make_llm(tiny_folder, "cuda", enforce_eager=True, **budget), arrivals(5))
    llm = make_llm(tiny_folder, "cuda", **budget)
    assert llm.engine.runner.graphs is not None, "a CUDA engine captures decode graphs unless enforce_eager"
    assert run_schedule(llm, arrivals(5)) == eager
    engine = llm.engine
    ids = [engine.add_request([3, 4, 5], SamplingParams(temperature=0, max_tokens=50)) for _ in range(3)]
    for _ in range(4):
        engine.step()
    engine.abort(ids[1])
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats().kv_blocks_used == 0


@requires_cuda
def test_cuda_graphs_verify_draft_chains_as_eager_steps_do(tiny_folder):
    """n-gram chains verified from the CUDA graphs (each token a decode row) give the eager engine's tokens,
    and some replayed step held drafts."""
    g = torch.Generator().manual_seed(1)
    phrase = torch.randint(0, 101, (5,), generator=g).tolist()
    prompts = [phrase * 3, phrase[:3] * 4 + [7], torch.randint(0, 101, (9,), generator=g).tolist()]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    options = dict(speculative="ngram", num_speculative_tokens=3, max_num_batched_tokens=512)
    eager = make_llm(tiny_folder, "cuda", enforce_eager=True, **options).generate(prompts, params)
    llm = make_llm(tiny_folder, "cuda", **options)
    replayed, replay = [], llm.engine.runner.graphs.replay
    llm.engine.runner.graphs.replay = lambda bucket: replayed.append(bucket) or replay(bucket)
    graphed = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in graphed] == [o.outputs[0].token_ids for o in eager]
    assert max(replayed) >= 8, "no step verifying drafts replayed a graph: the test proves less"


@requires_cuda
def test_torch_attention_on_cuda_decodes_eagerly_and_equals_triton(tiny_folder):
    """The torch attention path reads each step's lengths on the host, so it gets no decode graphs (capturing
    it would fail); its greedy tokens equal the graphed Triton engine's."""
    torch_llm = make_llm(tiny_folder, "cuda", attention_backend="torch")
    assert torch_llm.engine.runner.graphs is None
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[3, 4, 5], [6, 7, 8, 9]]
    ours = [o.outputs[0].token_ids for o in torch_llm.generate(prompts, params)]
    assert ours == [o.outputs[0].token_ids for o in make_llm(tiny_folder, "cuda").generate(prompts, params)]


@requires_cuda
def test_steady_state_decode_does_not_sync_the_device_on_cuda(tiny_folder):
    """Under torch's sync debug mode any synchronising call raises; the step's one read waits on an event."""
    for enforce_eager in (True, False):
        llm = make_llm(tiny_folder, "cuda", enforce_eager=enforce_eager, max_num_batched_tokens=512)
        engine = llm.engine
        for seed in (None, 4):
            engine.add_request([1, 2, 3], SamplingParams(temperature=0.7, top_k=10, seed=seed, max_tokens=30))
        engine.add_request([4, 5, 6], SamplingParams(temperature=0, max_tokens=30))
        for _ in range(3):
            engine.step()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(5):
                engine.step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        engine.abort(list(engine.groups))


def hf_greedy(
    folder: Path, prompt: list[int], new_tokens: int, dtype: torch.dtype
) -> tuple[list[int], torch.Tensor]:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype).cuda().eval()
    ids = torch.tensor([prompt], device="cuda")
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        logits = model(ids).logits[0, -1].float()
    return out[0, len(prompt) :].tolist(), logits


@requires_cuda
def test_fp32_greedy_on_cuda_equals_hugging_face_fp32(tiny_folder):
    prompt = [7, 3, 99, 12, 5, 41]
    expected, _ = hf_greedy(tiny_folder, prompt, 32, torch.float32)
    llm = make_llm(tiny_folder, "cuda")
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    assert llm.generate([prompt], params)[0].outputs[0].token_ids == expected


@requires_cuda
def test_bf16_engine_logits_match_hugging_face_bf16_on_cuda(tiny_folder):
    """bfloat16 rounds differently in every kernel:
    the last prompt token's logits agree within 2% (relative)."""
    prompt = [7, 3, 99, 12, 5, 41, 8, 8]
    _, expected = hf_greedy(tiny_folder, prompt, 1, torch.bfloat16)
    llm = make_llm(tiny_folder, "cuda", dtype="bfloat16")
    engine = llm.engine
    engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=1))
    plan = engine.scheduler.schedule()
    logits = engine.runner.execute(plan).logits[-1].float()
    engine.abort(list(engine.groups))
    rel = float((logits - expected).norm() / expected.norm())
    assert rel < 2e-2, f"bf16 logits differ from HF bf16 by {rel:.2e} (relative)"
