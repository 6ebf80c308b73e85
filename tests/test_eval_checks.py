"""The checks beside ``python -m solutions eval``'s main set: the generation check's answer matching, the
second multiple-choice set, and the comparison of lm-evaluation-harness's picks with ours (no model)."""

from __future__ import annotations

import json

import pytest
import torch

from solutions.cli.eval import Run, lm_eval_agreement
from solutions.eval.chat_check import load_chat_items, says
from solutions.eval.items import ITEMS_FILE, load_items
from solutions.eval.scoring import Scored

SECOND_SET = ITEMS_FILE.parent / "items_second.jsonl"


@pytest.mark.parametrize(
    "text, answer, right",
    [
        ("The capital of France is Paris.", "Paris", True),
        ("paris, of course", "Paris", True),
        ("Comparison shopping", "Paris", False),
        ("The largest planet is Neptune.", "Jupiter", False),
        ("It is the Pacific Ocean.", "Pacific", True),
        ("", "blue", False),
    ],
    ids=["sentence", "lower case", "inside a word", "wrong", "phrase", "empty"],
)
def test_the_chat_check_wants_the_answer_as_a_whole_word(text, answer, right):
    assert says(text, answer) is right


def test_the_chat_items_load_with_unique_ids_and_answers():
    items = load_chat_items()
    assert len(items) >= 30 and len({item.id for item in items}) == len(items)
    assert all(item.answer.strip() for item in items)


def test_a_chat_item_without_an_answer_is_refused(tmp_path):
    bad = tmp_path / "items.jsonl"
    bad.write_text(json.dumps({"id": "a", "question": "Why?", "answer": " "}) + "\n")
    with pytest.raises(ValueError, match="non-empty string"):
        load_chat_items(bad)


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
