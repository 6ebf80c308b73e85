"""A generation check beside the log-likelihood one: the model answers short arithmetic questions in words
(``data/eval/chat_arithmetic.jsonl``) through its chat template, greedily, and a reply is right when the first
number in it, written in digits or in words, is the answer. So "no change to intelligence" is also checked on
what the model writes, not only on which choice it finds likeliest.

One item a line: ``{"id": "words-002", "question": "What is seven plus five?", "answer": 12}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..paths import DATA_DIR
from ..sampling_params import SamplingParams

CHAT_ITEMS_FILE = DATA_DIR / "eval" / "chat_arithmetic.jsonl"
INSTRUCTION = "Answer with the number only."
MAX_TOKENS = 16
UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80}
_NUMBER = re.compile(
    r"-?\d+|\b(?:("
    + "|".join(TENS)
    + r")(?:[- ]("
    + "|".join(UNITS[1:10])
    + r"))?|("
    + "|".join(UNITS)
    + r"))\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ChatItem:
    id: str
    question: str
    answer: int


def load_chat_items(path: Path = CHAT_ITEMS_FILE) -> list[ChatItem]:
    """The items of a JSONL file; ids unique, answers integers."""
    items = [ChatItem(**json.loads(line)) for line in path.read_text().splitlines()]
    if len({item.id for item in items}) != len(items) or not all(isinstance(i.answer, int) for i in items):
        raise ValueError(f"{path}: ids must be unique and every answer an integer")
    return items


def first_number(text: str) -> int | None:
    """The first number in ``text``: digits ("12", "-3"), a word ("twelve") or tens and a unit
    ("twenty-four", "thirty five"); None if there is none."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    tens, unit, word = match.groups()
    if tens:
        return TENS[tens.lower()] + (UNITS.index(unit.lower()) if unit else 0)
    if word:
        return UNITS.index(word.lower())
    return int(match.group())


def replies(llm, items: list[ChatItem]) -> list[str]:
    """The model's greedy reply to each question followed by ``INSTRUCTION``, as one user turn."""
    conversations = [[{"role": "user", "content": f"{item.question} {INSTRUCTION}"}] for item in items]
    outputs = llm.chat(conversations, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    return [output.outputs[0].text for output in outputs]


def correct(items: list[ChatItem], texts: list[str]) -> torch.Tensor:
    """bool ``[n]``: whether each reply's first number is its item's answer."""
    return torch.tensor([first_number(text) == item.answer for item, text in zip(items, texts, strict=True)])
