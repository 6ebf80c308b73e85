"""The contract lm-evaluation-harness's ``local-completions`` model relies on to score multiple choice through
the server (``data/eval/lm_eval/``, README "lm-evaluation-harness"), checked with the request lm-eval 0.4.13
sends, so a change to the server that would silently change lm-eval's scores fails here.

lm-eval (``models/openai_completions.py``) posts ``prompt`` = a list of token-id lists (context +
continuation), ``max_tokens: 1``, ``logprobs: 1``, ``echo: true``, ``temperature: 0``, sorts the choices
by ``index``, and reads ``token_logprobs[ctxlen:-1]``: every prompt token's log-probability in prompt
order (the first is None, nothing predicts it), then the one generated token, which the ``-1`` drops.
``is_greedy`` compares each of those values with the largest of its ``top_logprobs`` dictionary.
"""

from __future__ import annotations

import httpx
import pytest

from solutions.eval.items import load_items
from solutions.eval.scoring import choice_logprobs, encode_item
from tests.test_server import API_KEY, client, model, server  # noqa: F401 - pytest fixtures

pytestmark = pytest.mark.slow


def lm_eval_request(url: str, served: str, prompts: list[list[int]]) -> dict:
    payload = {
        "model": served,
        "prompt": prompts,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    response = httpx.post(f"{url}/v1/completions", json=payload, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_echoed_prompt_logprobs_are_what_the_course_eval_scores(server, model, llm):  # noqa: F811
    """Each choice's summed log-likelihood as lm-eval reads it equals ``solutions eval``'s for that choice."""
    tokenizer = llm.tokenizer
    items = load_items()[::67][:4]  # a few items from different categories
    for item in items:
        encoded = encode_item(tokenizer, item)
        offline = choice_logprobs(llm.engine.model, [encoded])[0]
        prompts = [encoded.context + choice for choice in encoded.choices]
        out = lm_eval_request(server, model, prompts)
        choices = sorted(out["choices"], key=lambda c: c["index"])
        assert [c["index"] for c in choices] == list(range(len(prompts))), "one choice per prompt, indexed"
        ctxlen = len(encoded.context)
        for prompt, choice, expected in zip(prompts, choices, offline):
            values = choice["logprobs"]["token_logprobs"]
            tops = choice["logprobs"]["top_logprobs"]
            assert len(values) == len(prompt) + 1, "echo: one entry per prompt token, then the generated one"
            assert values[0] is None and tops[0] is None, "nothing predicts the first prompt token"
            read = values[ctxlen:-1]  # exactly lm-eval's slice
            assert len(read) == len(expected), f"{item.id}: lm-eval would read {len(read)} values"
            assert read == pytest.approx(expected.tolist(), abs=2e-3), (
                f"{item.id}: the server's prompt logprobs {read} differ from the scorer's {expected.tolist()}"
            )
            for value, top in zip(read, tops[ctxlen:-1]):
                assert isinstance(top, dict) and len(top) >= 1
                assert value <= max(top.values()) + 1e-4, "a top-1 entry below the token's own logprob"


def test_prompts_of_a_batch_come_back_under_their_own_index(server, model, llm):  # noqa: F811
    """lm-eval sends several prompts in one request when ``batch_size`` > 1 and pairs them with the choices
    sorted by ``index``: each choice must carry its own prompt's echo."""
    tokenizer = llm.tokenizer
    prompts = [tokenizer.encode(text) for text in ("Question: What is 2 + 2?\nAnswer: 4", "The sky is blue")]
    together = sorted(lm_eval_request(server, model, prompts)["choices"], key=lambda c: c["index"])
    for prompt, choice in zip(prompts, together):
        alone = lm_eval_request(server, model, [prompt])["choices"][0]["logprobs"]["token_logprobs"]
        got = choice["logprobs"]["token_logprobs"]
        assert len(got) == len(prompt) + 1
        assert got[1:-1] == pytest.approx(alone[1:-1], abs=1e-4)
