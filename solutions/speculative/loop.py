"""Speculative decoding in miniature, one sequence, without the engine: draft, verify, accept, roll back.

The target keeps a plain contiguous KV cache per layer (a ``DraftKV`` keyed by layer). Each pass feeds
the root (the newest token) and the drafts; afterwards the rejected drafts' K/V are cut off, and for a
tree the accepted path's entries are moved up behind the context. The engine (``LLM(speculative=...)``)
runs the same drafters and verifier over the paged cache and a batch of requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..model.llama import LlamaModel
from .drafter import EagleDrafter, NgramDrafter
from .eagle import DraftKV, target_features
from .rejection import target_probs, verify
from .tree import tree_attention_mask, tree_positions, walk_tree


@dataclass
class LoopResult:
    """The generated tokens; per target pass, the drafts it verified and the tokens it yielded; the time."""

    token_ids: list[int]
    drafted: list[int] = field(default_factory=list)
    per_pass: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0

    @property
    def tau(self) -> float:
        """Mean tokens per target pass (the mean acceptance length)."""
        return sum(self.per_pass) / max(1, len(self.per_pass))

    @property
    def alpha(self) -> float:
        """Per-draft acceptance rate: accepted drafts over drafts that were reached (a chain stops at its
        first rejection), Leviathan et al.'s alpha."""
        accepted = [n - 1 for n in self.per_pass]
        reached = sum(a + (a < d) for a, d in zip(accepted, self.drafted))
        return sum(accepted) / max(1, reached)


class CachedTarget:
    """The target over one sequence with a contiguous per-layer KV cache that can be cut and compacted."""

    def __init__(self, model: LlamaModel):
        self.model = model
        self.kv = DraftKV()
        self.length = 0  # tokens whose K/V are cached

    @torch.inference_mode()
    def forward(
        self, token_ids: list[int], positions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed new tokens (``mask`` ``[n, n]`` among them; default causal): their features and logits."""
        n = len(token_ids)
        new = torch.ones(n, n, dtype=torch.bool).tril() if mask is None else mask
        visible = torch.cat([torch.ones(n, self.length, dtype=torch.bool), new], dim=1)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return self.kv.attend([str(layer)], [n], [visible])(layer, q, k, v)

        device = self.model.norm.weight.device
        hidden = self.model(torch.tensor(token_ids, device=device), positions.to(device), attend)
        self.length += n
        features = target_features(self.model, hidden)
        return features, self.model.lm_head(features).float()

    def keep(self, rows: list[int]) -> None:
        for layer in range(self.model.config.num_layers):
            self.kv.keep(str(layer), rows)
        self.length = len(rows)


def speculative_generate(
    model: LlamaModel,
    drafter: EagleDrafter | NgramDrafter | None,
    prompt_ids: list[int],
    max_tokens: int,
    temperature: float = 0.0,
    tree_nodes: int = 0,
    generator: torch.Generator | None = None,
) -> LoopResult:
    """Generate ``max_tokens`` tokens after ``prompt_ids`` (``drafter`` None:
    plain decoding, one token a pass).

    ``tree_nodes > 0`` drafts EAGLE-2 trees of that many nodes (an ``EagleDrafter`` with a tree depth).
    """
    request_id = "loop"
    target = CachedTarget(model)
    result = LoopResult([])
    clock = time.perf_counter()
    features, logits = target.forward(prompt_ids, torch.arange(len(prompt_ids)))
    first = verify(
        torch.empty(1, 0, dtype=torch.long),
        target_probs(logits[-1:], temperature)[None],
        generators=generator,
    )
    ids = list(prompt_ids) + [int(first[1][0])]
    if drafter is not None:
        drafter.observe(request_id, features, 0)
    result.target_seconds += time.perf_counter() - clock
    try:
        while len(ids) - len(prompt_ids) < max_tokens:
            limit = max_tokens - (len(ids) - len(prompt_ids)) - 1
            root = len(ids) - 1
            clock = time.perf_counter()
            tree = None
            if drafter is None:
                drafts, probs = [], None
            elif tree_nodes:
                tree = drafter.propose_tree(request_id, ids, tree_nodes)
            else:
                draft = drafter.propose([request_id], [ids], [limit], [temperature])[0]
                drafts, probs = draft.token_ids, draft.probs
            draft_done = time.perf_counter()
            result.draft_seconds += draft_done - clock
            if tree is not None:
                features, logits = target.forward(
                    tree.token_ids, tree_positions(tree.parents, root), tree_attention_mask(tree.parents)
                )
                path, token = walk_tree(tree, target_probs(logits, temperature), generator)
                accepted = [tree.token_ids[node] for node in path]
                rows = [0] + path
            else:
                features, logits = target.forward(
                    [ids[-1]] + drafts, torch.arange(root, root + 1 + len(drafts))
                )
                draft_ids = torch.tensor([drafts], dtype=torch.long)
                num, nxt = verify(
                    draft_ids, target_probs(logits, temperature)[None],
                    None if probs is None else probs[None], generators=generator,
                )  # fmt: skip
                accepted, token = drafts[: int(num[0])], int(nxt[0])
                rows = list(range(len(accepted) + 1))
            target.keep(list(range(root)) + [root + r for r in rows])  # drop rejected drafts' K/V
            if drafter is not None:
                drafter.observe(request_id, features[rows], root)
            ids += accepted + [token]
            result.drafted.append(len(tree) - 1 if tree is not None else len(drafts))
            result.per_pass.append(len(accepted) + 1)
            result.target_seconds += time.perf_counter() - draft_done
    finally:
        if drafter is not None:
            drafter.free(request_id)
    result.token_ids = ids[len(prompt_ids) : len(prompt_ids) + max_tokens]
    return result
