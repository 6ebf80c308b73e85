"""Log-probabilities (issue 34, engine/logprobs.py): equal to ``log_softmax`` of Hugging Face's float32 logits
(after temperature), the greedy token ranked first, prompt logprobs the same with a cached prefix or without,
through chunked prefill, preemption, speculative decoding and n > 1; no host read added when nobody asks."""

from __future__ import annotations

import pytest
import torch

from solutions.engine.logprobs import Logprob
from solutions.sampling_params import MAX_LOGPROBS, SamplingParams
from tests.test_cuda_graphs import count_host_reads, make_llm, reads_of_each_step

PROMPTS = [[1, 5, 9, 17, 33, 2, 64, 7, 7, 80, 3, 11], [4, 4, 8, 15, 16, 23, 42], [99, 1, 50]]


@pytest.fixture(scope="module")
def hf_tiny(tiny_folder):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32).eval()


def hf_logprobs(hf_model, token_ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)`` at every position of ``token_ids``: row ``p`` predicts token ``p + 1``."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits / (temperature or 1.0), dim=-1)


def check_entry(entry: dict[int, Logprob], expected: torch.Tensor, token: int, num: int) -> None:
    """``entry`` holds ``token`` and the top ``num`` of ``expected`` [vocab], within 1e-4, ranks right."""
    top = expected.topk(num).indices.tolist() if num else []
    assert set(entry) == {token, *top}, (sorted(entry), token, top)
    for token_id, lp in entry.items():
        assert abs(lp.logprob - float(expected[token_id])) < 1e-4, (token_id, lp, float(expected[token_id]))
        assert lp.rank == int((expected > expected[token_id]).sum()) + 1


@pytest.mark.parametrize("value", [-1, MAX_LOGPROBS + 1, 2.5, "3", True])
@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be None or an integer in \[0, 20\]"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("temperature", [0, 0.7])
def test_sampled_logprobs_equal_hugging_face(tiny_folder, hf_tiny, temperature):
    llm = make_llm(tiny_folder)
    params = SamplingParams(temperature=temperature, max_tokens=6, ignore_eos=True, logprobs=5, seed=1)
    for prompt, out in zip(PROMPTS, llm.generate(PROMPTS, params), strict=True):
        completion = out.outputs[0]
        assert len(completion.logprobs) == len(completion.token_ids) == 6
        expected = hf_logprobs(hf_tiny, prompt + completion.token_ids, temperature)
        for i, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
            check_entry(entry, expected[len(prompt) - 1 + i], token, 5)
            if temperature == 0:
                assert entry[token].rank == 1, "the greedy token is the most likely one"
        assert out.prompt_logprobs is None


def test_prompt_logprobs_equal_hugging_face_chunked_and_with_a_cached_prefix(tiny_folder, hf_tiny):
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    plain = make_llm(tiny_folder).generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, plain, strict=True):
        assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
        expected = hf_logprobs(hf_tiny, prompt)
        for t in range(1, len(prompt)):
            check_entry(out.prompt_logprobs[t], expected[t - 1], prompt[t], 3)
    # chunked: a 5-token budget splits every prompt; the cached prefix: the same prompts again, after a
    # request without prompt logprobs has cached their blocks (block_size 16: the long prompt's first block)
    chunked = make_llm(tiny_folder, max_num_batched_tokens=5, max_num_seqs=2)
    long_prompt = PROMPTS[0] * 3
    chunked.generate([long_prompt], SamplingParams(temperature=0, max_tokens=2))
    again = chunked.generate([long_prompt, *PROMPTS], params)
    assert again[0].metrics.num_cached_tokens == 0, "a prompt-logprobs request bypasses the prefix cache"
    fresh = make_llm(tiny_folder).generate([long_prompt], params)[0]
    assert same(again[0].prompt_logprobs, fresh.prompt_logprobs)
    for ours, theirs in zip(again[1:], plain, strict=True):
        assert same(ours.prompt_logprobs, theirs.prompt_logprobs)


def same(ours: list, theirs: list) -> bool:
    """The same entries (None, or the same tokens with log-probabilities within 1e-5 and the same ranks)."""
    return len(ours) == len(theirs) and all(
        (a is None and b is None)
        or (
            a.keys() == b.keys()
            and all(abs(a[k].logprob - b[k].logprob) < 1e-5 and a[k].rank == b[k].rank for k in a)
        )
        for a, b in zip(ours, theirs, strict=True)
    )


def test_preemption_records_no_entry_twice(tiny_folder, hf_tiny):
    """A KV cache of few blocks preempts requests mid-decode; their recomputed prompt and tokens add no
    entry twice, and every entry still matches the oracle."""
    llm = make_llm(tiny_folder, kv_cache_memory=6 * 8192, max_model_len=64, max_num_seqs=4)  # 6 blocks
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2, prompt_logprobs=2)
    outs = llm.generate(PROMPTS, params)
    assert sum(o.metrics.num_preemptions for o in outs) > 0, "nothing was preempted: the test proves less"
    for prompt, out in zip(PROMPTS, outs, strict=True):
        completion = out.outputs[0]
        assert len(out.prompt_logprobs) == len(prompt)
        assert len(completion.logprobs) == len(completion.token_ids) == 40
        expected = hf_logprobs(hf_tiny, prompt + completion.token_ids)
        for t in range(1, len(prompt)):
            check_entry(out.prompt_logprobs[t], expected[t - 1], prompt[t], 2)
        for i, token in enumerate(completion.token_ids):
            check_entry(completion.logprobs[i], expected[len(prompt) - 1 + i], token, 2)


def test_speculative_and_parallel_sampling_logprobs(tiny_folder, hf_tiny):
    """n-gram drafts: each accepted token's entry is the target's distribution at that position; n = 3
    completions each get their own entries (their first token drawn from the shared prompt row)."""
    phrase = [5, 9, 17, 33, 2, 64]
    prompt = phrase * 4
    spec = make_llm(tiny_folder, speculative="ngram", num_speculative_tokens=3)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=3)
    out = spec.generate([prompt], params)[0]
    assert out.metrics.mean_acceptance_length > 1, "no draft was accepted: the test proves less"
    completion = out.outputs[0]
    assert len(completion.logprobs) == len(completion.token_ids) == 30
    expected = hf_logprobs(hf_tiny, prompt + completion.token_ids)
    for i, token in enumerate(completion.token_ids):
        check_entry(completion.logprobs[i], expected[len(prompt) - 1 + i], token, 3)
    many = make_llm(tiny_folder).generate(
        [PROMPTS[1]], SamplingParams(n=3, temperature=1.0, max_tokens=5, ignore_eos=True, logprobs=1, seed=2)
    )[0]
    for completion in many.outputs:
        expected = hf_logprobs(hf_tiny, PROMPTS[1] + completion.token_ids)
        assert len(completion.logprobs) == 5
        for i, token in enumerate(completion.token_ids):
            check_entry(completion.logprobs[i], expected[len(PROMPTS[1]) - 1 + i], token, 1)


def test_streamed_deltas_carry_their_tokens_logprobs(tiny_folder):
    engine = make_llm(tiny_folder).engine
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=0)
    engine.add_request(PROMPTS[0], params, output_kind="delta")
    deltas = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas.append(out.outputs[0])
    assert all(len(d.logprobs) == len(d.token_ids) for d in deltas)
    assert [t for d in deltas for t in d.token_ids] == [next(iter(e)) for d in deltas for e in d.logprobs]


def test_logprobs_read_the_device_only_when_asked(tiny_folder, monkeypatch):
    """The hot-path counter (test_cuda_graphs): a steady decode step reads once without logprobs, and one
    more time (the logprobs' one read) when a request asks."""
    engine = make_llm(tiny_folder).engine
    plain = SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True)
    engine.add_request([1, 2, 3, 4, 5], plain)
    for _ in range(2):
        engine.step()
    calls = count_host_reads(monkeypatch)
    for reads in reads_of_each_step(engine, calls, 3):
        assert len(reads) == 1, f"host reads in one decode step: {reads}"
    engine.add_request([6, 7, 8], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=4))
    engine.step()
    for reads in reads_of_each_step(engine, calls, 3):
        assert len(reads) == 2, f"host reads in one decode step with logprobs: {reads}"
    monkeypatch.undo()
    engine.abort(list(engine.groups))


# -- the OpenAI server (tests/test_server.py's server on the bundled model) ----------------------------------
from tests.test_server import _error_message, client, model, server  # noqa: E402, F401 - pytest fixtures


def test_the_openai_client_reads_logprobs_from_the_server(client, model, llm):  # noqa: F811
    import openai

    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens and all(len(c.top_logprobs) == 3 for c in content)
    assert all(c.top_logprobs[0].logprob == c.logprob for c in content), "greedy: the token is the top-1"
    streamed = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
        logprobs=True, top_logprobs=3, stream=True,
    )  # fmt: skip
    pieces = [
        c
        for chunk in streamed
        for choice in chunk.choices
        if choice.logprobs
        for c in choice.logprobs.content
    ]
    assert [(p.token, round(p.logprob, 4)) for p in pieces] == [
        (c.token, round(c.logprob, 4)) for c in content
    ]
    prompt = "The capital of France is"
    done = client.completions.create(
        model=model, prompt=prompt, max_tokens=3, temperature=0, logprobs=2, echo=True
    )
    lp = done.choices[0].logprobs
    ids = llm.engine.tokenizer.encode(prompt)
    assert done.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == len(ids) + 3 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    offline = llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=3, logprobs=2, prompt_logprobs=2)
    )[0]
    assert lp.token_logprobs[1] == pytest.approx(offline.prompt_logprobs[1][ids[1]].logprob, abs=1e-4)
    assert lp.token_logprobs[-1] == pytest.approx(
        offline.outputs[0].logprobs[-1][offline.outputs[0].token_ids[-1]].logprob, abs=1e-4
    )
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=3, temperature=0, logprobs=2, stream=True
    )
    values = [v for chunk in stream for c in chunk.choices if c.logprobs for v in c.logprobs.token_logprobs]
    assert values == pytest.approx(lp.token_logprobs[len(ids) :], abs=1e-5)
    for fields, named in [
        ({"logprobs": -1}, "logprobs"), ({"logprobs": 21}, "logprobs"), ({"logprobs": "many"}, "logprobs"),
    ]:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=model, prompt="hi", max_tokens=1, **fields)
        assert named in _error_message(caught.value)
    for fields in [{"logprobs": True, "top_logprobs": 21}, {"logprobs": True, "top_logprobs": -2}]:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], **fields
            )
        assert "top_logprobs" in _error_message(caught.value)
