"""The public API: vLLM's shape, stop rules, sampling, streaming, metrics, and clear errors for bad input."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def sp(load):
    return load("sampling_params").SamplingParams


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"seed": "7"}, "seed"),
    ],
)
def test_invalid_sampling_params_fail_at_construction(sp, kwargs, message):
    with pytest.raises(ValueError, match=message):
        sp(**kwargs)


def test_invalid_engine_options_are_named(load):
    config = load("config")
    with pytest.raises(ValueError, match="dtype"):
        config.EngineConfig(dtype="int3")
    with pytest.raises(ValueError, match="attention_backend"):
        config.EngineConfig(attention_backend="magic")
    with pytest.raises(ValueError, match="max_num_seqs"):
        config.EngineConfig(max_num_seqs=0)


def test_bad_prompts_are_rejected_before_anything_is_queued(llm, sp):
    with pytest.raises(ValueError, match="no prompts"):
        llm.generate([], sp())
    with pytest.raises(ValueError, match="empty"):
        llm.generate(["fine", ""], sp())
    with pytest.raises(ValueError, match=r"\[0, 49152\)"):
        llm.generate([[1, 2, 99999]], sp())
    with pytest.raises(ValueError, match="context limit .* 1024"):
        llm.generate(["word " * 1100], sp())
    with pytest.raises(ValueError, match="2 SamplingParams for 1 prompts"):
        llm.generate(["a"], [sp(), sp()])
    assert not llm.engine.has_unfinished_requests()  # nothing half-submitted


def test_output_shape_and_metrics(llm, sp):
    (out,) = llm.generate(["The capital of France is"], sp(temperature=0, max_tokens=8, ignore_eos=True))
    assert out.prompt == "The capital of France is"
    assert out.prompt_token_ids == llm.tokenizer.encode(out.prompt)
    completion = out.outputs[0]
    assert len(completion.token_ids) == 8 and completion.finish_reason == "length"
    assert completion.text == llm.tokenizer.decode(completion.token_ids)
    assert completion.text.startswith(" Paris")
    m = out.metrics
    assert m.num_prompt_tokens == 5 and m.num_output_tokens == 8
    assert 0 < m.ttft <= m.latency and m.tpot > 0 and m.tokens_per_s > 0


def test_token_id_prompts_equal_text_prompts(llm, sp):
    params = sp(temperature=0, max_tokens=6)
    text = llm.generate("Water boils at", params)[0]
    ids = llm.generate([llm.tokenizer.encode("Water boils at")], params)[0]
    assert ids.prompt is None and ids.outputs[0].token_ids == text.outputs[0].token_ids


def test_eos_and_stop_strings_end_generation(llm, sp):
    chat = llm.chat([{"role": "user", "content": "Say hello."}], sp(temperature=0, max_tokens=200))[
        0
    ].outputs[0]
    assert chat.finish_reason == "stop" and chat.token_ids[-1] == llm.tokenizer.eos_token_id
    assert "<|im_end|>" not in chat.text
    free = llm.generate("Count: 1, 2, 3,", sp(temperature=0, max_tokens=30, ignore_eos=True))[0].outputs[0]
    stop = free.text[3:6]
    cut = llm.generate("Count: 1, 2, 3,", sp(temperature=0, max_tokens=30, stop=[stop]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.index(stop)]


def test_seeded_sampling_is_reproducible_whatever_the_batch(llm, sp):
    params = sp(temperature=0.9, top_p=0.95, max_tokens=12, seed=1234, ignore_eos=True)
    alone = llm.generate("My favourite fruit is", params)[0].outputs[0].token_ids
    batch = llm.generate(["Tell me a story.", "My favourite fruit is"], [sp(temperature=1.0, seed=5), params])
    assert batch[1].outputs[0].token_ids == alone
    other = llm.generate("My favourite fruit is", sp(temperature=0.9, top_p=0.95, max_tokens=12, seed=99))
    assert other[0].outputs[0].token_ids != alone  # the seed matters (12 sampled tokens)


def test_top_k_one_is_greedy(llm, sp):
    greedy = llm.generate("Rain falls because", sp(temperature=0, max_tokens=10))[0].outputs[0].token_ids
    top1 = llm.generate("Rain falls because", sp(temperature=1.3, top_k=1, max_tokens=10, seed=0))
    assert top1[0].outputs[0].token_ids == greedy


def test_streaming_deltas_add_up_to_the_final_output(llm, sp):
    params = sp(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = ["Hello, my name is", "日本の首都は"]
    final = llm.generate(prompts, params)
    texts, tokens = {}, {}
    for snapshot in llm.stream(prompts, params):
        texts[snapshot.request_id] = texts.get(snapshot.request_id, "") + snapshot.outputs[0].delta_text
        tokens.setdefault(snapshot.request_id, []).extend(snapshot.outputs[0].delta_token_ids)
    assert sorted(texts.values()) == sorted(o.outputs[0].text for o in final)
    assert sorted(tokens.values()) == sorted(o.outputs[0].token_ids for o in final)


def test_abandoned_stream_frees_the_engine(llm, sp):
    stream = llm.stream(["one", "two"], sp(max_tokens=50))
    next(stream)
    stream.close()
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate("three", sp(max_tokens=2))[0].finished


def test_top_k_top_p_filter(load):
    sampler = load("kernels.sampling")
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))

    def kept(row: torch.Tensor, top_k: int, top_p: float) -> list[int]:
        filtered = sampler.filter_top_k_top_p(row[None], [top_k], [top_p])[0]
        return torch.isfinite(filtered).nonzero().flatten().tolist()

    assert kept(logits, top_k=2, top_p=1.0) == [0, 1]
    assert kept(logits, top_k=0, top_p=0.7) == [0, 1]  # 0.5 + 0.2 reaches 0.7
    assert kept(logits, top_k=0, top_p=0.71) == [0, 1, 2]
    assert kept(logits, top_k=0, top_p=0.1) == [0]  # the best token always stays
    shuffled = logits[[3, 0, 4, 2, 1]]
    assert kept(shuffled, top_k=0, top_p=0.7) == [1, 4]
    # One call filters every row by its own settings.
    both = sampler.filter_top_k_top_p(torch.stack([logits, shuffled]), [1, 0], [1.0, 0.7])
    assert torch.isfinite(both).nonzero().tolist() == [[0, 0], [1, 1], [1, 4]]


def test_top_k_top_p_filter_matches_a_full_sort_past_the_candidates(load):
    """The filter sorts no row (top-k reads its ``CANDIDATES`` largest, top-p is a radix select): a flat row
    (its top-p set holds most of the vocabulary) and a peaked one must keep what sorting all gives."""
    sampler = load("kernels.sampling")
    generator = torch.Generator().manual_seed(0)
    vocab = 4 * sampler.CANDIDATES
    flat = torch.randn(vocab, generator=generator) * 0.1
    peaked = torch.randn(vocab, generator=generator) * 4
    rows, top_k, top_p = torch.stack([flat, peaked, flat, peaked]), [0, 0, 100, 7], [0.9, 0.9, 1.0, 0.5]
    filtered = sampler.filter_top_k_top_p(rows, top_k, top_p)
    wide = sampler.filter_top_k_top_p(flat[None], [vocab - 5], [0.95])  # a top-k past the candidates
    for row, k, p, out in zip([*rows, flat], [*top_k, vocab - 5], [*top_p, 0.95], [*filtered, wide[0]]):
        order = torch.argsort(row, descending=True).tolist()[: k or vocab]
        probs = torch.softmax(row[order].double(), dim=0).tolist()
        kept, covered = [], 0.0
        for token, prob in zip(order, probs):
            if p < 1.0 and covered >= p:
                break
            kept.append(token)
            covered += prob
        assert sorted(torch.isfinite(out).nonzero().flatten().tolist()) == sorted(kept), (k, p)
        assert torch.equal(out[kept], row[kept]), "kept logits pass through unchanged"
    assert torch.isfinite(filtered[0]).sum() > sampler.CANDIDATES, (
        "the flat row's set reaches past the candidates"
    )


def test_sample_draws_from_each_row_and_seeds_reproduce(load):
    sampler = load("kernels.sampling")
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 1.0, 0.0]])
    draws = 20000
    torch.manual_seed(0)
    uniform = torch.rand(draws, 2, dtype=torch.float64)
    tokens = torch.stack([sampler.sample(probs, u) for u in uniform])
    counts = torch.bincount(tokens[:, 0], minlength=4).double()
    assert counts[1] == 0, "a token of probability 0 is never drawn"
    assert set(tokens[:, 1].tolist()) == {2}, "a one-hot (greedy) row gives its argmax"
    expected = probs[0].double() * draws
    nonzero = expected > 0
    chi2 = float(((counts[nonzero] - expected[nonzero]) ** 2 / expected[nonzero]).sum())
    assert chi2 < 13.8, (
        f"row 0's draws do not follow its probabilities (chi-square {chi2:.1f}, 2 dof, p < 0.001)"
    )


def test_counter_uniforms_are_uniform_and_depend_on_seed_and_counter_only(load):
    """A seeded row's number is a function of (seed, position): the same wherever the row sits, spread evenly
    over [0, 1) along a sequence's positions and across seeds."""
    sampler = load("kernels.sampling")
    counters = torch.arange(20000)
    along = sampler.counter_uniforms(torch.full_like(counters, 7), counters)
    across = sampler.counter_uniforms(torch.arange(20000) * 1000003, torch.full_like(counters, 5))
    for name, values in (("along a sequence", along), ("across seeds", across)):
        assert 0 <= float(values.min()) and float(values.max()) < 1
        counts = torch.histc(values.float(), bins=20, min=0, max=1).double()
        chi2 = float(((counts - 1000) ** 2 / 1000).sum())
        assert chi2 < 43.8, f"{name}: not uniform (chi-square {chi2:.1f} over 20 bins, 19 dof, p < 0.001)"
    shuffled = torch.randperm(100)
    seeds, positions = torch.arange(100) % 3, torch.arange(100)
    direct = sampler.counter_uniforms(seeds, positions)
    assert torch.equal(sampler.counter_uniforms(seeds[shuffled], positions[shuffled]), direct[shuffled])


def test_more_prompts_than_cache_slots_all_complete_in_order(llm, sp):
    """The fixture engine runs 8 sequences at once: 11 prompts still all complete,
    each with its own answer."""
    params = sp(temperature=0, max_tokens=4, ignore_eos=True)
    prompts = [f"Item number {i} on my list is" for i in range(11)]
    batched = llm.generate(prompts, params)
    assert [o.prompt for o in batched] == prompts
    for prompt, out in zip(prompts[::5], batched[::5]):
        assert out.outputs[0].token_ids == llm.generate(prompt, params)[0].outputs[0].token_ids


def test_generation_stops_at_the_context_limit(llm, sp):
    limit = llm.engine.max_model_len
    prompt = [42] * (limit - 3)
    out = llm.generate([prompt], sp(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 3 and out.outputs[0].finish_reason == "length"
