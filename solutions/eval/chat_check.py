"""A generation check beside the log-likelihood one: the model answers short factual questions
(``data/eval/chat_short_answers.jsonl``: capitals, colours, planets, opposites) through its chat template,
greedily, and a reply is right when it contains the answer as a whole word (any case). So "no change to
intelligence" is also checked on what the model writes, not only on which choice it finds likeliest.

One item a line: ``{"id": "capital-000", "question": "What is the capital of France?", "answer": "Paris"}``.
The questions are ones a 135M model answers about half of in float32 (a check every precision scores zero on
would say nothing).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..paths import DATA_DIR
from ..sampling_params import SamplingParams

CHAT_ITEMS_FILE = DATA_DIR / "eval" / "chat_short_answers.jsonl"
INSTRUCTION = "Answer in one or two words."
MAX_TOKENS = 16


@dataclass(frozen=True)
class ChatItem:
    id: str
    question: str
    answer: str


def load_chat_items(path: Path = CHAT_ITEMS_FILE) -> list[ChatItem]:
    """The items of a JSONL file; ids unique, every answer a non-empty string."""
    items = [ChatItem(**json.loads(line)) for line in path.read_text().splitlines()]
    if len({item.id for item in items}) != len(items):
        raise ValueError(f"{path}: item ids must be unique")
    if not all(isinstance(item.answer, str) and item.answer.strip() for item in items):
        raise ValueError(f"{path}: every answer must be a non-empty string")
    return items


def says(text: str, answer: str) -> bool:
    """Whether ``text`` contains ``answer`` as a whole word or phrase, in any case."""
    return re.search(rf"\b{re.escape(answer)}\b", text, re.IGNORECASE) is not None


def replies(llm, items: list[ChatItem]) -> list[str]:
    """The model's greedy reply to each question followed by ``INSTRUCTION``, as one user turn."""
    conversations = [[{"role": "user", "content": f"{item.question} {INSTRUCTION}"}] for item in items]
    outputs = llm.chat(conversations, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    return [output.outputs[0].text for output in outputs]


def correct(items: list[ChatItem], texts: list[str]) -> torch.Tensor:
    """bool ``[n]``: whether each reply says its item's answer."""
    return torch.tensor([says(text, item.answer) for item, text in zip(items, texts, strict=True)])
