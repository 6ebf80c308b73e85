"""The OpenAI-compatible server, driven by the official ``openai`` client against a real server process.

One server process (the real CLI, plus one injected fault, see serve_with_injected_fault.py) serves the
whole module on a free localhost port; it is shut down even when a test fails. Greedy outputs are checked
token for token against the offline ``LLM.generate`` on the same engine options.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = (ROOT / "data" / "prompts" / "serving_prompts.txt").read_text().splitlines()
API_KEY = "test-key-123"
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 256  # paged attention reads only real tokens, so this leaves the numerics as offline
KV_BLOCK_SIZE = 16
KV_SPARE_BLOCKS = 16  # the KV budget: one max_model_len sequence, the null block, and this many more
STARTUP_TIMEOUT_S = 180
sys.path.insert(0, str(Path(__file__).parent))
from serve_with_injected_fault import FAULT_MARKER  # noqa: E402


def _kv_budget_bytes(model_config) -> int:
    """A small KV cache, so a burst of a few dozen requests overflows it (float32 K and V, every layer)."""
    c = model_config
    per_block = 2 * c.num_layers * KV_BLOCK_SIZE * c.num_kv_heads * c.head_dim * 4
    return (MAX_MODEL_LEN // KV_BLOCK_SIZE + 1 + KV_SPARE_BLOCKS) * per_block


@pytest.fixture(scope="module")
def server(impl_name, llm, load):
    """The server process on a free port (the launcher waits, bounded, for /health and always stops it)."""
    options = dict(
        device="cpu",
        dtype="float32",
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        kv_block_size=KV_BLOCK_SIZE,
        kv_cache_memory=_kv_budget_bytes(llm.engine.model_config),
    )
    program = [sys.executable, str(Path(__file__).parent / "serve_with_injected_fault.py"), impl_name]
    # The weights as loaded (no second layout, nothing to measure): what is tested here is HTTP, not speed.
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "FASTMODE_CPU_LINEAR": "linear"}
    with load("serve.launcher").running_server(options, API_KEY, STARTUP_TIMEOUT_S, env, program) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def _chat_prompt(llm, text: str) -> str:
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}])


def _metrics(server: str) -> dict[str, float]:
    """The unlabelled value of every ``fastmode:`` sample (first label set)."""
    values = {}
    for line in httpx.get(f"{server}/metrics").text.splitlines():
        match = re.match(r"fastmode:(\w+)(?:\{[^}]*\})? (\S+)$", line)
        if match and match.group(1) not in values:
            values[match.group(1)] = float(match.group(2))
    return values


def _assert_still_serving(client, model):
    reply = client.completions.create(model=model, prompt="One, two,", max_tokens=2, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")


# --- the happy paths ----------------------------------------------------------------------------------------
def test_models_lists_the_served_model(client, model):
    cards = client.models.list().data
    assert [c.id for c in cards] == [model]


def test_chat_completion_matches_offline_greedy(client, model, llm, load):
    sp = load("sampling_params").SamplingParams
    question = PROMPTS[0]
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=12, temperature=0
    )
    (offline,) = llm.generate([_chat_prompt(llm, question)], sp(temperature=0, max_tokens=12))
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == offline.outputs[0].text
    assert choice.finish_reason == offline.outputs[0].finish_reason
    assert reply.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert reply.usage.completion_tokens == len(offline.outputs[0].token_ids)


def test_completion_streaming_equals_non_streaming_and_ends_with_usage(client, model):
    kwargs = dict(model=model, prompt="The capital of France is", max_tokens=10, temperature=0)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_sse_wire_format_ends_with_done(server, model):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "stream": True,
        "temperature": 0,
    }
    reply = httpx.post(
        f"{server}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [e for e in reply.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert '"role": "assistant"' in events[0]


def test_chat_streaming_delivers_the_same_text(client, model):
    messages = [{"role": "user", "content": PROMPTS[1]}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=12, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == whole.choices[0].message.content


def test_n_choices_are_distinct_samples(client, model):
    reply = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, n=3, seed=5)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in reply.choices)
    assert len({c.text for c in reply.choices}) > 1
    assert reply.usage.completion_tokens > 3 and reply.usage.prompt_tokens == 4  # the prompt counts once
    stream = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, n=3, seed=5, stream=True
    )
    streamed = ["", "", ""]
    for chunk in stream:
        streamed[chunk.choices[0].index] += chunk.choices[0].text
    assert streamed == [c.text for c in reply.choices]  # same seeds, same samples


def test_stop_string_cuts_the_text_before_it(client, model):
    kwargs = dict(model=model, prompt="Count with me: one, two, three, four,", max_tokens=16, temperature=0)
    free = client.completions.create(**kwargs).choices[0].text
    stop = free.strip().split()[1]  # a word the greedy continuation is known to reach
    cut = client.completions.create(**kwargs, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free[: free.index(stop)]


def test_seed_makes_sampling_reproducible(client, model):
    def sample(seed):
        return (
            client.completions.create(
                model=model, prompt="Once upon a time", max_tokens=8, temperature=1.0, top_p=0.95, seed=seed
            )
            .choices[0]
            .text
        )

    assert sample(11) == sample(11)
    assert len({sample(11), sample(12), sample(13)}) > 1


def test_vllm_extra_fields_top_k_and_ignore_eos(client, model):
    reply = client.completions.create(
        model=model, prompt="Hello", max_tokens=12, extra_body={"top_k": 1, "ignore_eos": True}
    )
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 12
    greedy = client.completions.create(
        model=model, prompt="Hello", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.choices[0].text == greedy.choices[0].text  # top_k=1 is greedy


def test_64_concurrent_streams_equal_offline_generate(server, model, llm, load):
    """64 streaming clients at once (raw prompts, short outputs, so the check stays quick on a CPU)."""
    sp = load("sampling_params").SamplingParams
    prompts = PROMPTS[:64]
    offline = llm.generate(prompts, sp(temperature=0, max_tokens=6))

    async def one(aclient, prompt):
        stream = await aclient.completions.create(
            model=model, prompt=prompt, max_tokens=6, temperature=0, stream=True
        )
        text, reason = "", None
        async for chunk in stream:
            text += chunk.choices[0].text
            reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def all_of_them():
        async with openai.AsyncOpenAI(
            base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, timeout=300
        ) as aclient:
            return await asyncio.gather(*(one(aclient, p) for p in prompts))

    served = asyncio.run(all_of_them())
    assert served == [(o.outputs[0].text, o.outputs[0].finish_reason) for o in offline]


def test_metrics_report_the_engine(server, client, model):
    before = _metrics(server)
    client.completions.create(
        model=model, prompt="Hello", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    after = _metrics(server)
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == 5
    assert after["time_to_first_token_seconds_count"] == before["time_to_first_token_seconds_count"] + 1
    assert after["time_per_output_token_seconds_count"] == before["time_per_output_token_seconds_count"] + 1
    assert after["num_requests_running"] == 0 and after["num_requests_waiting"] == 0
    assert after["kv_blocks_used"] == 0 and after["kv_blocks_total"] > 0


# --- bad input and faults -----------------------------------------------------------------------------------
def _error_message(error: openai.APIStatusError) -> str:
    return error.body["message"] if isinstance(error.body, dict) else str(error.body)


def test_malformed_json_is_a_400_naming_json(server, client, model):
    reply = httpx.post(
        f"{server}/v1/completions",
        content=b'{"model": "x", "prompt": ',
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert "not valid JSON" in error["message"] and error["type"] == "invalid_request_error"
    _assert_still_serving(client, model)


def test_unknown_model_is_a_404(client, model):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-17", prompt="hi", max_tokens=2)
    assert "gpt-17" in _error_message(caught.value) and model in _error_message(caught.value)
    _assert_still_serving(client, model)


def test_prompt_over_the_context_limit_is_a_400(client, model):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt="word " * (MAX_MODEL_LEN + 50), max_tokens=2)
    assert "context limit" in _error_message(caught.value)
    _assert_still_serving(client, model)


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n must"),
        ({"extra_body": {"top_k": -5}}, "top_k"),
        ({"max_tokens": "many"}, "max_tokens"),
    ],
)
def test_invalid_sampling_values_are_a_400_naming_the_field(client, model, fields, named):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt="hi", **fields)
    assert named in _error_message(caught.value)
    _assert_still_serving(client, model)


def test_empty_message_list_is_a_400(client, model):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=[], max_tokens=2)
    assert "messages is empty" in _error_message(caught.value)
    _assert_still_serving(client, model)


def test_wrong_or_missing_api_key_is_a_401(server, model):
    for key in ("wrong-key", ""):
        bad = openai.OpenAI(base_url=f"{server}/v1", api_key=key or "unused", max_retries=0)
        if not key:
            bad = bad.with_options(default_headers={"Authorization": ""})
        with pytest.raises(openai.AuthenticationError) as caught:
            bad.completions.create(model=model, prompt="hi", max_tokens=2)
        assert "API key" in _error_message(caught.value)
    assert httpx.get(f"{server}/health").status_code == 200  # health and metrics need no key


def test_bad_input_never_disturbs_a_request_in_flight(server, client, model, llm, load):
    """A long greedy stream runs while every kind of bad request arrives; it still matches offline."""
    sp = load("sampling_params").SamplingParams
    kwargs = dict(model=model, prompt="The history of the printing press", max_tokens=24, temperature=0)
    result = {}
    runner = threading.Thread(
        target=lambda: result.update(text=client.completions.create(**kwargs).choices[0].text)
    )
    runner.start()
    for bad in ({"model": "nope"}, {"temperature": -2}, {"prompt": "word " * 2000}, {"n": -1}):
        with pytest.raises(openai.APIStatusError):
            client.completions.create(**{**kwargs, **bad})
    runner.join(timeout=120)
    (offline,) = llm.generate([kwargs["prompt"]], sp(temperature=0, max_tokens=24))
    assert result["text"] == offline.outputs[0].text


def test_a_burst_beyond_the_kv_budget_queues_and_completes(server, client, model, llm):
    """More requests at once than the KV cache holds: some wait (or are preempted), all finish."""
    prompts = [" ".join([p] * 4) for p in PROMPTS]  # distinct ~40-token prompts: no shared prefix blocks
    max_tokens = 4
    blocks_each = -(-(len(llm.tokenizer.encode(prompts[0])) + max_tokens) // KV_BLOCK_SIZE)
    total_blocks = _metrics(server)["kv_blocks_total"]
    burst = int(1.5 * total_blocks / blocks_each) + 1
    assert burst * blocks_each > total_blocks
    peak_waiting, peak_used, done = 0.0, 0.0, threading.Event()

    def watch():
        nonlocal peak_waiting, peak_used
        while not done.is_set():
            m = _metrics(server)
            peak_waiting, peak_used = (
                max(peak_waiting, m["num_requests_waiting"]),
                max(peak_used, m["kv_blocks_used"]),
            )
            time.sleep(0.05)

    async def all_of_them():
        async with openai.AsyncOpenAI(
            base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, timeout=300
        ) as aclient:
            calls = [
                aclient.completions.create(model=model, prompt=p, max_tokens=max_tokens, temperature=0)
                for p in prompts[:burst]
            ]
            return await asyncio.gather(*calls)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        replies = asyncio.run(all_of_them())
    finally:
        done.set()
        watcher.join()
    assert len(replies) == burst and all(r.choices[0].finish_reason in ("stop", "length") for r in replies)
    assert peak_waiting > 0 and 0 < peak_used <= total_blocks
    after = _metrics(server)
    assert after["num_requests_running"] == 0 and after["kv_blocks_used"] == 0


def test_a_client_that_disconnects_frees_its_request(server, client, model):
    stream = client.completions.create(
        model=model,
        prompt="Tell me everything",
        max_tokens=500,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _, _chunk in zip(range(2), stream):
        pass
    assert _metrics(server)["num_requests_running"] == 1
    stream.close()
    deadline = time.monotonic() + 20
    while (m := _metrics(server))["num_requests_running"] or m["kv_blocks_used"]:
        assert time.monotonic() < deadline, f"the abandoned request still holds the engine: {m}"
        time.sleep(0.1)
    tokens = m["generation_tokens_total"]
    time.sleep(0.5)
    assert _metrics(server)["generation_tokens_total"] == tokens  # nothing generates for nobody
    _assert_still_serving(client, model)


def test_an_exception_in_one_request_fails_it_alone(server, client, model):
    result = {}
    kwargs = dict(model=model, max_tokens=16, temperature=0)
    runner = threading.Thread(
        target=lambda: result.update(reply=client.completions.create(prompt="A long time ago", **kwargs))
    )
    runner.start()
    with pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(prompt=f"Please {FAULT_MARKER} now", **kwargs)
    assert caught.value.status_code == 500 and "injected fault" in _error_message(caught.value)
    runner.join(timeout=120)
    assert result["reply"].choices[0].finish_reason in ("stop", "length")
    assert httpx.get(f"{server}/health").status_code == 200
    _assert_still_serving(client, model)
