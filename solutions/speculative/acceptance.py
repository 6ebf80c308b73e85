"""Teacher-forced acceptance: how many of a drafter's tokens the target would accept, without target passes.

On the target's own greedy answer the target's choice at every position is the answer's next token. So a
drafter can be scored position by position: give it the real features up to the newest token (as the engine
does after each verify pass), let it draft a chain or a tree, and count the longest drafted path that spells
the answer's next tokens. That count plus one is the τ greedy speculative decoding would reach there, and it
isolates the drafter: no verify pass runs, so this measures how far better trees or heads can take τ before
any question of speed (a batched verify pass may round a near-tie the other way; the engine's τ is the
truth for a run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..model.llama import LlamaModel
from .drafter import EagleDrafter
from .train_eagle import features_and_labels
from .tree import walk_greedy


@dataclass
class Acceptance:
    """Accepted drafts at each scored position, and the drafter's mean time per position."""

    accepted: list[int]
    draft_seconds: float

    @property
    def tau(self) -> float:
        return 1 + sum(self.accepted) / len(self.accepted)

    def at_least(self, depth: int) -> float:
        """The share of positions where at least ``depth`` drafts were accepted."""
        return sum(a >= depth for a in self.accepted) / len(self.accepted)


def teacher_forced_acceptance(
    drafter: EagleDrafter, answers: list[tuple[list[int], int, torch.Tensor]], tree_nodes: int = 0
) -> Acceptance:
    """Score ``drafter`` on greedy ``answers``: ``(token_ids, prompt_len, features)`` each. At every answer
    position with a next token, it drafts a chain (``tree_nodes == 0``) or a tree of ``tree_nodes``
    nodes below the newest token; then it is handed the real feature of that token, as after a pass
    that accepted nothing.
    """
    accepted, seconds = [], 0.0
    for index, (token_ids, prompt_len, features) in enumerate(answers):
        request_id = f"answer-{index}"
        drafter.observe(request_id, features[:prompt_len], 0)
        for newest in range(prompt_len, len(token_ids) - 1):
            context, upcoming = token_ids[: newest + 1], token_ids[newest + 1 :]
            start = time.perf_counter()
            if tree_nodes:
                tree = drafter.propose_tree(request_id, context, tree_nodes)
                seconds += time.perf_counter() - start
                # The target's choice below a node at depth d of the answer's path is the answer's
                # token d; the greedy walk reads choices only along the path it follows, so
                # other nodes' entries never matter.
                choices = [
                    upcoming[d] if d < len(upcoming) else None for d in tree.depths()
                ]  # None: no choice
                count = len(walk_greedy(tree, choices)[0])
            else:
                draft = drafter.propose([request_id], [context], [len(upcoming)], [0.0])[0].token_ids
                seconds += time.perf_counter() - start
                count = 0
                while count < min(len(draft), len(upcoming)) and draft[count] == upcoming[count]:
                    count += 1
            accepted.append(count)
            drafter.observe(request_id, features[newest : newest + 1], newest)
        drafter.free(request_id)
    return Acceptance(accepted, seconds / max(1, len(accepted)))


def greedy_answers(model: LlamaModel, rows: list[dict]) -> list[tuple[list[int], int, torch.Tensor]]:
    """``(token_ids, prompt_len, features)`` for rows of ``heldout_responses.jsonl`` (the target's greedy
    answers), the features from one causal pass of the target over each whole sequence."""
    return [
        (row["token_ids"], row["prompt_len"], features_and_labels(model, row["token_ids"])[0]) for row in rows
    ]
