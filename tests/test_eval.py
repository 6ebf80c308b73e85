"""``python -m solutions eval``: the shipped items and the log-likelihood scorer (``solutions/eval/``).

The scorer is checked against the plain computation: one forward per question + choice, ``log_softmax`` of
its logits at the positions before each choice token. Not a lab: the tests import ``solutions`` itself."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import replace

import pytest
import torch
from tiny_models import random_llama

from solutions.cli import eval as eval_cli
from solutions.cli.eval import Run, spread, table
from solutions.eval.items import ITEMS_FILE, Item, dumps, generate, load_items, validate
from solutions.eval.scoring import (
    Encoded,
    Scored,
    batches,
    choice_logprobs,
    encode_item,
    paired_difference,
    score,
)
from solutions.model.config import ModelConfig

TINY = ModelConfig(
    vocab_size=89, hidden_size=48, intermediate_size=64, num_layers=2, num_heads=6, num_kv_heads=2,
    head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=128, tie_word_embeddings=True,
)  # fmt: skip
"""GQA ratio 3, as SmolLM2's."""


def test_the_shipped_items_are_what_the_generator_writes():
    assert ITEMS_FILE.read_text() == dumps(generate()), "rerun: python -m solutions.eval.items"


def test_the_shipped_items_keep_the_schema():
    items = load_items()
    assert len(items) >= 200
    assert len({item.id for item in items}) == len(items)
    assert len({item.question for item in items}) == len(items)
    for item in items:
        assert 0 <= item.answer < len(item.choices) == 4, item
        assert len(set(item.choices)) == 4, item
    answers = torch.tensor([item.answer for item in items])
    assert torch.bincount(answers).min() > len(items) / 8, "the answer's position is shuffled"


def test_the_readme_counts_the_items_of_each_category():
    readme = (ITEMS_FILE.parent / "README.md").read_text()
    stated = {m[1]: int(m[2]) for m in re.finditer(r"^\| (\w+) \| (\d+) \|", readme, re.MULTILINE)}
    assert stated == Counter(item.category for item in load_items())


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(answer=4), "not an index"),
        (dict(answer=-1), "not an index"),
        (dict(choices=["a", "a"]), "distinct"),
        (dict(choices=["a"]), "distinct"),
        (dict(question=""), "no question"),
    ],
)
def test_a_bad_item_is_named(change, message):
    good = Item("x-000", "x", "What?", ["a", "b", "c", "d"], 0)
    validate([good])
    with pytest.raises(ValueError, match=message):
        validate([replace(good, **change)])
    with pytest.raises(ValueError, match="appears twice"):
        validate([good, replace(good, question="Other?")])


def random_items(count: int, seed: int = 0) -> list[Encoded]:
    """Prompts of 1-8 tokens, each with 2-4 choices of 1-4 tokens."""
    rng = random.Random(seed)
    ids = lambda most: [rng.randrange(TINY.vocab_size) for _ in range(rng.randint(1, most))]
    return [Encoded(ids(8), [ids(4) for _ in range(rng.randint(2, 4))]) for _ in range(count)]


@pytest.mark.parametrize("max_tokens", [1, 40, 10_000])  # one item per forward, a few, all at once
def test_choice_logprobs_equal_a_separate_forward_per_choice(max_tokens):
    model = random_llama(TINY, torch.float32)
    items = random_items(9)
    groups = batches(items, max_tokens)
    assert sum(map(len, groups)) == len(items)
    got = [per_item for group in groups for per_item in choice_logprobs(model, group)]
    with torch.inference_mode():
        for item, per_choice in zip(items, got, strict=True):
            for choice, logprobs in zip(item.choices, per_choice, strict=True):
                sequence = torch.tensor(item.context + choice)
                expected = model.sequence_logits(sequence).double().log_softmax(-1)
                start = len(item.context)
                expected = expected[start - 1 : -1].gather(1, sequence[start:, None])[:, 0]
                torch.testing.assert_close(logprobs.double(), expected, rtol=0, atol=1e-5)


def test_score_picks_the_likeliest_choice_by_sum_and_by_mean():
    model = random_llama(TINY, torch.float32)
    items = random_items(12, seed=1)
    per_item = choice_logprobs(model, items)
    best_sum = [int(torch.stack([c.sum() for c in choices]).argmax()) for choices in per_item]
    best_mean = [int(torch.stack([c.mean() for c in choices]).argmax()) for choices in per_item]
    scored = score(model, items, best_sum, max_tokens=30)
    assert scored.correct.all() and scored.accuracy == 1.0
    assert scored.correct_norm.tolist() == [m == s for m, s in zip(best_mean, best_sum, strict=True)]


def test_paired_difference_counts_only_disagreements():
    a = torch.tensor([1, 1, 0, 0, 1, 1], dtype=torch.bool)
    b = torch.tensor([1, 0, 1, 0, 0, 1], dtype=torch.bool)
    result = paired_difference(a, b)
    assert (result.only_a, result.only_b, result.n) == (2, 1, 6)
    d = (a.double() - b.double()).numpy()
    assert result.difference == pytest.approx(d.mean())
    assert result.standard_error == pytest.approx(d.std() / math.sqrt(len(d)))
    assert paired_difference(a, a).standard_error == 0.0
    with pytest.raises(ValueError, match="equal non-empty"):
        paired_difference(a, b[:3])


class BosTokenizer:
    """Characters as ids, with a BOS (id 0) in front of every encoding, as some tokenizers add."""

    bos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [0, *map(ord, text)]


def test_encode_item_drops_a_bos_before_each_choice():
    encoded = encode_item(BosTokenizer(), Item("x-000", "x", "Hi?", ["ab", "c"], 1))
    assert encoded.context == [0, *map(ord, "Question: Hi?\nAnswer:")]
    assert encoded.choices == [[ord(" "), ord("a"), ord("b")], [ord(" "), ord("c")]]


def test_spread_keeps_every_category_and_the_table_prints_the_paired_difference():
    items = load_items()
    subset = spread(items, 50)
    assert len(subset) == 50 and {i.category for i in subset} == {i.category for i in items}
    assert spread(items, None) == items
    with pytest.raises(ValueError, match="at least 1"):
        spread(items, 0)
    n = len(subset)
    right = torch.ones(n, dtype=torch.bool)
    wrong_two = right.clone()
    wrong_two[:2] = False
    runs = [
        Run("float32", torch.float32, Scored(right, right), 1.0),
        Run("AWQ INT4 g64", torch.bfloat16, Scored(wrong_two, right), 1.0),
    ]
    text = table(subset, runs)
    assert "chance 25.0%" in text and "100.0 ± 0.0" in text and "96.0 ± 2.8" in text
    se = math.sqrt((2 / n - (2 / n) ** 2) / n)
    assert f"float32 - AWQ INT4 g64 (sum): +4.0 points ± {100 * se:.1f}" in text
    assert "2 items differ: 2 right in float32 only, 0 in AWQ INT4 g64 only" in text


def test_eval_names_an_unknown_precision(capsys):
    with pytest.raises(SystemExit):
        eval_cli.main(["--precisions", "float32,int8"])
    assert "unknown precision 'int8'" in capsys.readouterr().err
