"""Our tokenizer, rebuilt from the GGUF vocabulary, gives Hugging Face's ids and chat prompts exactly."""

from __future__ import annotations

import pytest

from solutions.model.loader import load_weights

TEXTS = [
    "Hello, world!",
    "The capital of France is Paris.",
    "  leading spaces,\ttabs\tand trailing   ",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Numbers: 3.14159, 1,000,000 and 2026-12-02.",
    "Unicode: café, naïve, Ærøskøbing, 東京, 😀🚀, Привет",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "\n\n\nmany\n\n\nnewlines\r\n",
    "MiXeD CaSe and URLs https://example.com/a?b=c#d",
    "",
]


@pytest.fixture(scope="module")
def ours():
    return load_weights().tokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_hugging_face(ours, hf_oracle, text):
    _, hf_tokenizer = hf_oracle
    expected = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ours.encode(text) == expected
    assert ours.decode(expected, skip_special_tokens=False) == hf_tokenizer.decode(expected)


def test_special_tokens_stay_whole(ours):
    assert ours.encode("<|im_start|>") == [1]
    assert ours.encode("<|im_end|>") == [2]
    assert ours.eos_token_id == 2


def test_chat_template_matches_hugging_face(ours, hf_oracle):
    _, hf_tokenizer = hf_oracle
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}],
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another?"},
        ],
    ]
    for messages in conversations:
        expected = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(messages) == expected


def test_chat_template_rejects_malformed_messages(ours):
    with pytest.raises(ValueError, match="role"):
        ours.apply_chat_template([{"content": "no role"}])
    with pytest.raises(ValueError, match="non-empty"):
        ours.apply_chat_template([])
