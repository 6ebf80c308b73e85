"""The checks beside ``python -m solutions eval``'s main set: the generation check's answer reading, the
second multiple-choice set, and the comparison of lm-evaluation-harness's picks with ours (no model)."""

from __future__ import annotations

import json

import pytest
import torch

from solutions.cli.eval import Run, lm_eval_agreement
from solutions.eval.chat_check import first_number, load_chat_items
from solutions.eval.items import ITEMS_FILE, load_items
from solutions.eval.scoring import Scored

SECOND_SET = ITEMS_FILE.parent / "items_second.jsonl"


@pytest.mark.parametrize(
    "text, number",
    [
        ("The answer is 12.", 12),
        ("twelve", 12),
        ("Twenty-four apples, then 3 more", 24),
        ("thirty five", 35),
        ("It is -3", -3),
        ("Seventeen.", 17),
        ("someone has none", None),
        ("", None),
    ],
    ids=["digits", "word", "tens-unit", "tens space unit", "negative", "capital", "inside words", "empty"],
)
def test_the_chat_check_reads_the_first_number(text, number):
    assert first_number(text) == number


def test_the_chat_items_have_computed_integer_answers():
    items = load_chat_items()
    assert len(items) >= 30
    for item in items:
        words = item.question.removeprefix("What is ").removesuffix("?").split(" ")
        if item.id.startswith("words-") and len(words) == 3:  # "seven plus five"
            a, op, b = first_number(words[0]), words[1], first_number(words[2])
            assert item.answer == {"plus": a + b, "minus": a - b, "times": a * b}[op], item


def test_the_second_set_is_valid_and_apart_from_the_first():
    second, first = load_items(SECOND_SET), load_items()
    assert len(second) >= 60 and all(len(item.choices) == 4 for item in second)
    assert not {item.question for item in second} & {item.question for item in first}


def test_lm_eval_agreement_names_the_items_that_differ(tmp_path):
    items = load_items()[:3]
    picks = torch.tensor([item.answer for item in items])
    run = Run(
        "float32",
        torch.float32,
        Scored(torch.ones(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool), picks),
        1.0,
    )
    samples = tmp_path / "samples.jsonl"
    lines = []
    for doc_id, item in enumerate(items):
        loglik = [-5.0] * len(item.choices)
        loglik[(item.answer + (doc_id == 2)) % len(item.choices)] = -1.0  # lm-eval picks otherwise on item 2
        lines.append(json.dumps({"doc_id": doc_id, "filtered_resps": [[str(v), "False"] for v in loglik]}))
    samples.write_text("\n".join(lines) + "\n")
    text = lm_eval_agreement(samples, items, run)
    assert "same pick on 2 of 3 items" in text and f"differ on {items[2].id}" in text
    with pytest.raises(ValueError, match="scores 3 items, not the 4"):
        lm_eval_agreement(samples, load_items()[:4], run)
