"""The whole engine against Hugging Face transformers on the same GGUF, in float32.

Prompt logits agree to a relative error under 1e-4, and greedy decoding agrees token for token
for 64 tokens on every prompt: run as one batch and run one prompt at a time.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def quicksort(items):",
    "Once upon a time, in a small village by the sea,",
    "The three laws of thermodynamics are",
    "Translate to French: The cat sleeps on the warm windowsill.",
    "<|im_start|>user\nGive me three tips for learning to cook.<|im_end|>\n<|im_start|>assistant\n",
    "Q: What is 17 times 23?\nA:",
    "Photosynthesis is the process by which",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def hf_greedy(hf_oracle):
    """HF's greedy continuation of each prompt, one prompt at a time, with its own KV cache.

    A plain argmax loop rather than ``generate``: its ``min_new_tokens`` would forbid EOS, which
    changes the tokens; here EOS is just another token, as with ``ignore_eos=True``.
    """
    model, tokenizer = hf_oracle
    continuations = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        tokens, past = [], None
        with torch.inference_mode():
            for _ in range(NEW_TOKENS):
                out = model(ids, cache=past, use_cache=True)
                past = out.cache
                tokens.append(int(out.logits[0, -1].argmax()))
                ids = torch.tensor([[tokens[-1]]])
        continuations.append(tokens)
    return continuations


def test_prompt_logits_match_hugging_face(llm, hf_oracle):
    model, tokenizer = hf_oracle
    for prompt in PROMPTS[:4]:
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.inference_mode():
            expected = model(ids).logits[0].double()
            ours = llm.engine.model.sequence_logits(ids[0]).double()
        rel = float((ours - expected).norm() / expected.norm())
        assert rel < 1e-4, f"{prompt!r}: relative error {rel:.2e}"


def test_engine_prefill_logits_match_hugging_face(llm, hf_oracle, load):
    """The engine's own path (KV cache, flat batch) produces the same last-token logits."""
    model, tokenizer = hf_oracle
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=1)
    engine = llm.engine
    request_ids = engine.add_requests(PROMPTS[:3], [params] * 3)
    plan = engine.scheduler.schedule()  # one flat step: all three prompts fit the token budget
    out = engine.runner.execute(plan)
    logits = out.logits[[out.logits_spans[request_id].start for request_id in request_ids]].double()
    engine.abort(request_ids)
    for row, prompt in enumerate(PROMPTS[:3]):
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.inference_mode():
            expected = model(ids).logits[0, -1].double()
        rel = float((logits[row] - expected).norm() / expected.norm())
        assert rel < 1e-4, f"{prompt!r}: relative error {rel:.2e}"


def greedy(load):
    return load("sampling_params").SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)


def test_greedy_batched_matches_hugging_face(llm, hf_greedy, load):
    outputs = llm.generate(PROMPTS, greedy(load))
    for prompt, output, expected in zip(PROMPTS, outputs, hf_greedy):
        assert output.prompt == prompt
        assert output.outputs[0].token_ids == expected, prompt


def test_greedy_one_at_a_time_matches_hugging_face(llm, hf_greedy, load):
    for prompt, expected in zip(PROMPTS, hf_greedy):
        assert llm.generate(prompt, greedy(load))[0].outputs[0].token_ids == expected, prompt


@pytest.mark.parametrize("path", ["linear", "transposed", "onednn", "packed"])
def test_greedy_matches_hugging_face_on_every_cpu_linear_path(path, hf_greedy, load, monkeypatch):
    """Each matrix-product path (solutions/kernels/cpu_linear.py), forced for every shape: a batched prefill
    (many rows), batched decode (a few rows) and one-sequence decode (one row) all give HF's tokens."""
    cpu_linear = load("kernels.cpu_linear")
    if not cpu_linear.PATHS[path].supports(torch.float32):
        pytest.skip(f"{path} is not available in this torch build")
    monkeypatch.setenv(cpu_linear.FORCE_ENV, path)
    engine = load("llm").LLM(device="cpu", dtype="float32", max_num_seqs=8, max_model_len=256)
    assert {
        m.choices["decode"] for m in engine.engine.model.modules() if isinstance(m, cpu_linear.CpuLinear)
    } == {path}
    outputs = engine.generate(PROMPTS, greedy(load))
    for prompt, output, expected in zip(PROMPTS, outputs, hf_greedy):
        assert output.outputs[0].token_ids == expected, prompt
    assert engine.generate(PROMPTS[1], greedy(load))[0].outputs[0].token_ids == hf_greedy[1]
