"""Multiple choice by log-likelihood: the model reads ``Question: ...\\nAnswer:`` and each choice is scored
by the log-probability of its tokens after it (the way lm-evaluation-harness scores ARC or MMLU in its
log-likelihood mode). The prediction is the choice with the highest sum (``correct``) or the highest mean per
token (``correct_norm``: normalised by the choice's token count, so a long choice is not penalised for its
length; lm-evaluation-harness's ``acc_norm`` divides by characters instead).

Batched: many items run in one forward over a flat token vector. Each item's question is in it once, its
choices after it, each choice attending to the question and to itself only (a prefix tree, the mask draft
trees use in Lesson 4), with positions continuing from the question's end in every branch::

    item 0: q q q q | a a | b | c c c      item 1: q q q | a | b b ...
    choice b's tokens see:  q q q q  and  b  (never a or c, never item 1)

so a choice's log-probabilities equal those of a separate forward over question + choice (a test checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model.llama import LlamaModel
from .items import Item

PROMPT = "Question: {question}\nAnswer:"


@dataclass(frozen=True)
class Encoded:
    """An item as token ids: the prompt, then each choice as it continues the prompt (a leading space)."""

    context: list[int]
    choices: list[list[int]]


def encode_item(tokenizer, item: Item) -> Encoded:
    """``tokenizer`` has ``encode(text) -> ids`` and ``bos_token_id``; a BOS it adds to a choice is dropped,
    since the choice continues the prompt."""
    bos = tokenizer.bos_token_id
    choices = []
    for choice in item.choices:
        ids = tokenizer.encode(" " + choice)
        choices.append(ids[1:] if bos is not None and ids[:1] == [bos] else ids)
    return Encoded(tokenizer.encode(PROMPT.format(question=item.question)), choices)


def _pack(batch: list[Encoded]) -> tuple[torch.Tensor, ...]:
    """Flat ids, positions, the [T, T] mask (True: query row may attend key column), and for every choice
    token its id and the index of the token that predicts it."""
    ids, positions, segment, branch = [], [], [], []
    targets, predictors = [], []
    for item_index, item in enumerate(batch):
        if not item.context or not all(item.choices):
            raise ValueError("an item needs a non-empty prompt and non-empty choices (token ids)")
        start = len(ids)
        ids += item.context
        positions += range(len(item.context))
        segment += [item_index] * len(item.context)
        branch += [-1] * len(item.context)
        for choice_index, choice in enumerate(item.choices):
            first = len(ids)
            ids += choice
            positions += range(len(item.context), len(item.context) + len(choice))
            segment += [item_index] * len(choice)
            branch += [choice_index] * len(choice)
            targets += choice
            predictors += [start + len(item.context) - 1, *range(first, first + len(choice) - 1)]
    segment_t, branch_t = torch.tensor(segment), torch.tensor(branch)
    index = torch.arange(len(ids))
    mask = (
        (segment_t[:, None] == segment_t[None, :])
        & (index[None, :] <= index[:, None])
        & ((branch_t[None, :] == -1) | (branch_t[None, :] == branch_t[:, None]))
    )
    as_tensor = lambda values: torch.tensor(values, dtype=torch.long)
    return as_tensor(ids), as_tensor(positions), mask, as_tensor(targets), as_tensor(predictors)


@torch.inference_mode()
def choice_logprobs(model: LlamaModel, batch: list[Encoded]) -> list[list[torch.Tensor]]:
    """For each item of ``batch`` and each of its choices, the float32 log-probability of every choice token
    given the prompt and the choice's earlier tokens, from one forward of ``model`` over the whole batch."""
    ids, positions, mask, targets, predictors = _pack(batch)
    device = model.norm.weight.device
    mask = mask.to(device)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # [T, H, D] -> heads first
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1)

    hidden = model(ids.to(device), positions.to(device), attend)
    # the LM head only on the rows that predict a choice token
    logprobs = model.logits(hidden[predictors.to(device)]).log_softmax(-1)
    picked = logprobs.gather(1, targets.to(device)[:, None])[:, 0].cpu()
    out, offset = [], 0
    for item in batch:
        per_choice = []
        for choice in item.choices:
            per_choice.append(picked[offset : offset + len(choice)])
            offset += len(choice)
        out.append(per_choice)
    return out


def batches(encoded: list[Encoded], max_tokens: int) -> list[list[Encoded]]:
    """Consecutive items in groups of at most ``max_tokens`` packed tokens (a longer item goes alone)."""
    groups, current, size = [], [], 0
    for item in encoded:
        tokens = len(item.context) + sum(map(len, item.choices))
        if current and size + tokens > max_tokens:
            groups.append(current)
            current, size = [], 0
        current.append(item)
        size += tokens
    return groups + [current] if current else groups


@dataclass(frozen=True)
class Scored:
    """Per item: whether the highest-sum choice (``correct``) and the highest per-token-mean choice
    (``correct_norm``) is the answer, and which choice had the highest sum (``picks``, the index lm-eval's
    ``acc`` compares). Ties go to the first choice."""

    correct: torch.Tensor
    correct_norm: torch.Tensor
    picks: torch.Tensor | None = None

    @property
    def accuracy(self) -> float:
        return self.correct.float().mean().item()

    @property
    def accuracy_norm(self) -> float:
        return self.correct_norm.float().mean().item()


def score(model: LlamaModel, encoded: list[Encoded], answers: list[int], max_tokens: int = 1024) -> Scored:
    """Score every item, ``max_tokens`` packed tokens per forward."""
    if len(encoded) != len(answers) or not encoded:
        raise ValueError(f"need one answer per item, and items: {len(encoded)} items, {len(answers)} answers")
    picks, picks_norm = [], []
    for group in batches(encoded, max_tokens):
        for per_choice in choice_logprobs(model, group):
            picks.append(torch.stack([c.sum() for c in per_choice]).argmax().item())
            picks_norm.append(torch.stack([c.mean() for c in per_choice]).argmax().item())
    truth, picks = torch.tensor(answers), torch.tensor(picks)
    return Scored(picks == truth, torch.tensor(picks_norm) == truth, picks)


@dataclass(frozen=True)
class PairedDifference:
    """``a``'s accuracy minus ``b``'s on the same items, with the standard error of that difference.

    Paired: only items where the two disagree move it. With ``d_i = a_i - b_i`` in {-1, 0, 1},
    ``se = sqrt(var(d) / n)``, ``var(d) = (only_a + only_b) / n - difference**2``.
    """

    difference: float
    standard_error: float
    only_a: int
    only_b: int
    n: int


def paired_difference(a: torch.Tensor, b: torch.Tensor) -> PairedDifference:
    """``a``, ``b``: bool ``[n]``, whether each model got each item right."""
    if a.shape != b.shape or a.dim() != 1 or not len(a):
        raise ValueError(f"need two equal non-empty 1-D vectors, not {tuple(a.shape)} {tuple(b.shape)}")
    n = len(a)
    only_a, only_b = int((a & ~b).sum()), int((b & ~a).sum())
    difference = (only_a - only_b) / n
    variance = (only_a + only_b) / n - difference**2
    return PairedDifference(difference, math.sqrt(variance / n), only_a, only_b, n)
