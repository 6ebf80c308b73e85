"""Speculative decoding in miniature, without the engine: draft, verify in one target pass, accept, repeat.

The target recomputes the whole sequence at every step (no KV cache), so nothing hides the algorithm;
the engine (``LLM(speculative=...)``) runs the same drafters and verifier over the paged cache.
"""

from __future__ import annotations

import torch

from ..model.llama import LlamaModel
from .drafter import EagleDrafter, NgramDrafter
from .eagle import target_features
from .rejection import target_probs, verify
from .tree import masked_attention, tree_attention_mask, tree_positions, walk_tree


@torch.inference_mode()
def target_pass(
    model: LlamaModel, token_ids: list[int], tree_parents: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``[L, H]`` and float32 logits ``[L, V]`` at every position of ``token_ids``.

    With ``tree_parents``, the last ``len(tree_parents)`` tokens form a draft tree (its root first): they
    sit at their depth's position and attend to the context before the root and to their ancestors.
    """
    length = len(token_ids)
    visible = torch.ones(length, length, dtype=torch.bool).tril()
    positions = torch.arange(length)
    if tree_parents is not None:
        root = length - len(tree_parents)
        visible[root:, root:] = tree_attention_mask(tree_parents)
        positions[root:] = tree_positions(tree_parents, root)
    device = model.norm.weight.device
    hidden = model(
        torch.tensor(token_ids, device=device),
        positions.to(device),
        lambda layer, q, k, v: masked_attention(q, k, v, visible),
    )
    features = target_features(model, hidden)
    return features, model.lm_head(features).float()


def speculative_generate(
    model: LlamaModel,
    drafter: EagleDrafter | NgramDrafter,
    prompt_ids: list[int],
    max_tokens: int,
    temperature: float = 0.0,
    tree_nodes: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[int]]:
    """Generate ``max_tokens`` tokens; returns them and the number of tokens each target pass yielded.

    ``tree_nodes > 0`` drafts EAGLE-2 trees of that many nodes (an ``EagleDrafter`` with a tree depth).
    """
    request_id = "loop"
    features, logits = target_pass(model, prompt_ids)
    first = verify(
        torch.empty(1, 0, dtype=torch.long), target_probs(logits[-1:], temperature)[None], generators=generator
    )
    ids = list(prompt_ids) + [int(first[1][0])]
    drafter.observe(request_id, features)
    per_pass: list[int] = []
    try:
        while len(ids) - len(prompt_ids) < max_tokens:
            limit = max_tokens - (len(ids) - len(prompt_ids)) - 1
            root = len(ids) - 1
            if tree_nodes:
                tree = drafter.propose_tree(request_id, ids, tree_nodes)
                features, logits = target_pass(model, ids + tree.token_ids[1:], tree.parents)
                path, token = walk_tree(tree, target_probs(logits[root:], temperature), generator)
                accepted = [tree.token_ids[node] for node in path]
                rows = [root] + [root + node for node in path]
            else:
                draft = drafter.propose([request_id], [ids], [limit], [temperature])[0]
                features, logits = target_pass(model, ids + draft.token_ids)
                drafts = torch.tensor([draft.token_ids], dtype=torch.long)
                probs = None if draft.probs is None else draft.probs[None]
                num, nxt = verify(drafts, target_probs(logits[root:], temperature)[None], probs, generators=generator)
                accepted, token = draft.token_ids[: int(num[0])], int(nxt[0])
                rows = list(range(root, root + len(accepted) + 1))
            drafter.observe(request_id, features[rows])
            ids += accepted + [token]
            per_pass.append(len(accepted) + 1)
    finally:
        drafter.free(request_id)
    return ids[len(prompt_ids) : len(prompt_ids) + max_tokens], per_pass
