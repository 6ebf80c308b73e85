"""Train the EAGLE draft head by self-distillation: the target's features and the head's loss, here; the run
(generating the answers, the optimizer loop, the manifest) is ``python -m solutions train-eagle``
(``cli/train_eagle.py``).

1. The target answers every prompt of ``data/spec/prompts.jsonl`` and ``prompts_templated.jsonl`` (chat, code,
   prose; written for this repo) with our own engine: once greedily, and ``--samples`` more times at
   ``--temperature`` (seeded), for contexts the greedy answers never reach; the token ids go to
   ``data/spec/responses.jsonl``.
2. One pass of the target over each whole sequence gives its features ``f_i`` (final-norm hidden states)
   and its greedy choice at every position.
3. The head learns EAGLE's loss on the pairs ``(f_i, token_{i+1})``: SmoothL1 regression of ``f_{i+1}``
   plus ``ce_weight`` x cross-entropy of the target's choice over the draft vocabulary; a second,
   unrolled pass feeds the head its own predictions (as it will see them when drafting a chain).
The head is written in float16 to ``data/spec/eagle_head.safetensors``, with ``eagle_head.json``
describing the run (command, seed, data, sha256, held-out accuracy).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.llama import LlamaModel
from .eagle import DraftKV, EagleHead, target_features


@torch.no_grad()  # not inference_mode: the features feed the head's autograd graph
def features_and_labels(model: LlamaModel, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's features ``[L, H]`` and greedy next-token choices ``[L]`` over one whole sequence."""
    ids = torch.tensor(token_ids)
    hidden = model(ids, torch.arange(len(ids)), _causal_attention)
    features = target_features(model, hidden)
    return features, model.lm_head(features).argmax(-1)


def _causal_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One whole sequence's causal attention, q ``[L, Hq, D]``,
    k/v ``[L, Hkv, D]``, by torch's fused kernel."""
    q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)[0].transpose(0, 1)


def head_loss(
    head: EagleHead,
    features: torch.Tensor,
    token_ids: torch.Tensor,
    labels: torch.Tensor,
    ce_weight: float,
    noise: float,
    unroll: int,
    score_from: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE's loss on one sequence, and how often the head's first draft matches the target's choice.

    Pair ``i`` = ``(f_i, token_{i+1})`` predicts ``f_{i+1}`` and the target's choice at ``i + 1``
    (``labels[i + 1]``, mapped into the draft vocabulary; tokens outside it do not count for the CE).
    Pass ``u > 1`` replaces ``f_i`` by the previous pass's prediction of it. The agreement counts pairs
    ``score_from ..`` only (``prompt_len - 1``: the drafts a generation makes, not the chat template's
    system prompt, which every sequence shares and which is easy to guess).
    """
    length = features.shape[0] - 1
    target = features[1:]
    index_of = torch.full((int(head.lm_head_weight.shape[0]),), -100, dtype=torch.long)
    index_of[head.vocab_ids] = torch.arange(len(head.vocab_ids))
    draft_labels = index_of[labels[1:]]
    inputs = features[:-1] + noise * (torch.rand_like(features[:-1]) - 0.5)
    positions = torch.arange(length)
    total = torch.zeros(())
    first_hits = torch.zeros(())
    for step in range(unroll):
        predicted = head(inputs, token_ids[1:], positions, DraftKV().attend(["s"], [length]))
        logits = head.draft_logits(predicted)
        loss = F.smooth_l1_loss(predicted, target) + ce_weight * F.cross_entropy(
            logits, draft_labels, ignore_index=-100
        )
        total = total + loss / (step + 1)
        if step == 0:
            first_hits = (head.vocab_ids[logits.argmax(-1)] == labels[1:])[score_from:].float().mean()
        inputs = torch.cat([features[:1], predicted[:-1]])  # the head's own predictions replace f_1..f_{L-1}
    return total, first_hits
