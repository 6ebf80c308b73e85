"""EAGLE-2-style dynamic draft trees: grow, mask, position, and walk.

A draft tree hangs below the root, the last token the target emitted (its K/V not yet computed). Node 0
is the root; node ``i > 0`` holds a drafted token and ``parents[i] < i``. Growing it (Li et al., EAGLE-2):
at each depth, expand only the ``top_k`` nodes with the highest cumulative draft log-probability (the
product of the draft's confidences along the path approximates the chance the whole path is accepted),
then keep the ``num_nodes`` best nodes overall. Verifying it takes one target pass over the flattened
tree, where each node attends to the committed context and its own ancestors only:

    root ─ a ─ c          mask (row attends to column)     positions
         │   └ d              r a b c d                       r: n
         └ b                r 1 . . . .                       a, b: n + 1
                            a 1 1 . . .                       c, d: n + 2
                            b 1 . 1 . .
                            c 1 1 . 1 .
                            d 1 1 . . 1
The walk then follows the target's choices down the tree: the longest accepted path, plus one token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels.batch_invariant import batch_invariant
from ..kernels.paged_torch import DecodeContext, first_of_run, kept_slots, write_slots


@dataclass
class DraftTree:
    """``token_ids[i]``, ``parents[i]`` (-1 for the root, node 0) and ``log_probs[i]`` (cumulative draft
    log-probability of the path to node ``i``; 0 at the root). Invariant: ``parents[i] < i``."""

    token_ids: list[int]
    parents: list[int]
    log_probs: list[float]

    def __post_init__(self) -> None:
        if not self.parents or self.parents[0] != -1:
            raise ValueError("node 0 must be the root (parent -1)")
        bad = [i for i, p in enumerate(self.parents[1:], 1) if not 0 <= p < i]
        if bad:
            raise ValueError(f"every node's parent must be an earlier node; nodes {bad[:5]} break that")

    def __len__(self) -> int:
        return len(self.token_ids)

    def depths(self) -> list[int]:
        depths = [0] * len(self)
        for i in range(1, len(self)):
            depths[i] = depths[self.parents[i]] + 1
        return depths

    def children(self, node: int) -> list[int]:
        return [i for i in range(node + 1, len(self)) if self.parents[i] == node]


def tree_attention_mask(parents: list[int]) -> torch.Tensor:
    """Bool ``[N, N]``: row ``i`` may attend to column ``j`` iff ``j`` is ``i`` or one of its ancestors.

    ``parents[0] == -1`` (the root) and ``parents[i] < i``, so a node's row extends its parent's row.
    """
    # BEGIN SOLUTION Lab 4: each node sees itself and what its parent sees
    #  (parents come first, so build row by row)
    # HINT: A drafted node may attend to the root, its own ancestors and itself, never to another branch: row
    #  i of the mask is node i's path from the root.
    # HINT: Start from an [N, N] bool tensor of False. Parents come before children, so fill the rows in
    #  order: node i's row is its parent's row plus the diagonal entry (i, i).
    # HINT: Copy the parent's whole row (it already lists every ancestor), then set the diagonal. Skip the
    #  copy for the root: its parent is -1, and mask[-1] is the LAST row, not nothing.
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] = mask[parent]
        mask[i, i] = True
    return mask
    # END SOLUTION


def tree_positions(parents: list[int], root_position: int) -> torch.Tensor:
    """Each node's position in the sequence: the root's plus its depth (siblings share a position)."""
    depths = DraftTree(list(range(len(parents))), parents, [0.0] * len(parents)).depths()
    return root_position + torch.tensor(depths, dtype=torch.long)


def masked_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Grouped-query attention with an explicit mask:
    q ``[Tq, Hq, D]``, k/v ``[Lk, Hkv, D]``, visible ``[Tq, Lk]``.

    Softmax in float32; returns ``[Tq, Hq, D]`` in q's dtype. Every row must see at least one key.
    """
    tq, hq, d = q.shape
    lk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    # [Hkv, group * Tq, D] @ [Hkv, D, Lk]: each K/V head serves its group of query heads without copies.
    qh = q.view(tq, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * tq, d)
    scores = (qh @ k.permute(1, 2, 0)).float().view(hkv, group, tq, lk) * d**-0.5
    scores = scores.masked_fill(~visible.to(q.device), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(hkv, group * tq, lk)
    out = probs @ v.permute(1, 0, 2)  # [Hkv, group * Tq, D]
    return out.view(hkv, group, tq, d).permute(2, 0, 1, 3).reshape(tq, hq, d)


def grow_tree(
    root_token: int,
    root_log_probs: torch.Tensor,
    expand: Callable[[list[int], list[int], list[int]], torch.Tensor],
    depth: int,
    top_k: int,
    num_nodes: int,
) -> DraftTree:
    """Grow a tree EAGLE-2's way and keep its ``num_nodes`` most probable drafted nodes (plus the root).

    ``root_log_probs`` ``[V]``: the draft's log-probabilities for the root's child. Candidates are numbered
    in the order they are drafted; ``expand(frontier, tokens, parents)`` runs the draft on the candidates
    in ``frontier`` (candidate ``j`` holds ``tokens[j]`` and hangs below candidate ``parents[j]``, -1 for
    the root) and returns the log-probabilities of their children ``[len(frontier), V]``. Token ids here
    are whatever the log-probabilities index (the caller maps a reduced draft vocabulary back).
    """
    if depth < 1 or top_k < 1 or num_nodes < 1:
        raise ValueError(f"depth, top_k and num_nodes must be >= 1, got {depth}, {top_k}, {num_nodes}")
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    # Depth 1: the root's top_k children.
    values, ids = root_log_probs.float().topk(min(top_k, root_log_probs.numel()))
    frontier = list(range(len(tokens), len(tokens) + len(ids)))
    tokens += ids.tolist()
    parents += [-1] * len(ids)
    scores += values.tolist()
    for _ in range(depth - 1):
        child_log_probs = expand(frontier, tokens, parents)  # [F, V]
        frontier_scores = torch.tensor([scores[j] for j in frontier])
        cumulative = frontier_scores[:, None] + child_log_probs.float().cpu()
        per_node = min(top_k, cumulative.shape[1])
        values, ids = cumulative.topk(per_node, dim=-1)  # each frontier node's best children
        best, flat = values.flatten().topk(min(top_k, values.numel()))  # the most confident of them all
        new_frontier = []
        for score, index in zip(best.tolist(), flat.tolist()):
            new_frontier.append(len(tokens))
            tokens.append(int(ids.flatten()[index]))
            parents.append(frontier[index // per_node])
            scores.append(score)
        frontier = new_frontier
    # Keep the best num_nodes; ties go to the shallower node, so every kept node's ancestors are kept too.
    order = sorted(range(len(tokens)), key=lambda j: (-scores[j], j))[:num_nodes]
    kept = sorted(order)  # candidates were appended parent-first, so this order keeps parents before children
    new_index = {old: new for new, old in enumerate(kept, 1)}
    return DraftTree(
        token_ids=[root_token] + [tokens[j] for j in kept],
        parents=[-1] + [new_index[parents[j]] if parents[j] >= 0 else 0 for j in kept],
        log_probs=[0.0] + [scores[j] for j in kept],
    )


def walk_tree(
    tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[list[int], int]:
    """Follow the target down the tree: the accepted path's node indices (root excluded) and the next token.

    ``target_probs`` ``[len(tree), V]``: row ``i`` is the target's distribution for the token after node
    ``i``. At each node the children are tried in order as deterministic drafts: child ``c`` is kept with
    probability ``p(c)``, else ``p`` loses ``c`` and is renormalised before the next child (exact, as
    chain rejection sampling with one-hot ``q``; greedy ``p`` is one-hot, so this is the argmax walk).
    When no child is kept, the next token is drawn from what is left of ``p``.
    """
    if target_probs.shape[0] != len(tree):
        raise ValueError(f"target_probs has {target_probs.shape[0]} rows for a tree of {len(tree)} nodes")
    path: list[int] = []
    node = 0
    while True:
        p = target_probs[node].float().cpu().clone()
        for child in tree.children(node):
            token = tree.token_ids[child]
            mass = float(p.sum())
            if mass > 0 and float(torch.rand(1, generator=generator)) * mass < float(p[token]):
                path.append(child)
                node = child
                break
            p[token] = 0.0
        else:
            # every token the target allows was drafted and rejected: impossible in exact arithmetic
            if p.sum() <= 0:
                p = target_probs[node].float().cpu()
            top = int(p.argmax())
            token = top if p[top] >= p.sum() else int(torch.multinomial(p, 1, generator=generator))
            return path, token


def walk_greedy(tree: DraftTree, choices: list[int]) -> tuple[list[int], int]:
    """``walk_tree`` at temperature 0, from the target's argmax after each node (``choices[i]``): descend
    while a child holds the argmax (the first such child, as ``walk_tree`` tries them); the next token is
    the argmax at the node where the descent stops."""
    if len(choices) != len(tree):
        raise ValueError(f"got {len(choices)} choices for a tree of {len(tree)} nodes")
    children: dict[int, dict[int, int]] = {}
    for node in range(1, len(tree)):
        children.setdefault(tree.parents[node], {}).setdefault(tree.token_ids[node], node)
    path: list[int] = []
    node = 0
    while choices[node] in children.get(node, {}):
        node = children[node][choices[node]]
        path.append(node)
    return path, choices[node]


class TreeAttention:
    """Wraps one step's paged attention for a batch where some requests verify trees.

    The paged call writes every token's K/V into its slot and attends bottom-right causally, which is
    wrong for tree rows; each tree's rows are then recomputed over its context's cached K/V plus the
    tree's own (by then in the cache too), under the tree mask (a step of trees alone only stores its K/V
    before that). ``trees``: ``(rows, context_slots, mask)`` per tree request, with ``rows`` its slice of the
    step's flat batch, ``context_slots`` the cache rows of positions before the root, ``mask`` its
    ``tree_attention_mask``. ``k_cache``, ``v_cache``: ``[layers, blocks, block, Hkv, D]``.

    Per step, each tree's cache rows (context, then its nodes) and its mask (bool) are made once; per layer,
    its keys are a view of the cache when those rows are consecutive (a lone sequence in a fresh cache), else
    one ``index_select``, and torch's fused attention applies the mask. With ``$FASTMODE_BATCH_INVARIANT=1``
    each node attends alone instead, over its context and its own path in token order with no mask, as the
    same token would alone once its path is accepted (``kernels/batch_invariant.py``).
    """

    def __init__(
        self,
        paged,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        trees: list[tuple[slice, torch.Tensor, torch.Tensor]],
    ):
        self.paged, self.k_cache, self.v_cache = paged, k_cache, v_cache
        slot_mapping = paged.meta.slot_mapping
        with_slot, self.slots = kept_slots(slot_mapping)
        # Every row is a tree's (batch 1) and has a slot:
        # store the K/V, skip the paged attention it would redo.
        self.store_only = with_slot is None and sum(rows.stop - rows.start for rows, _, _ in trees) == len(
            self.slots
        )
        self.trees = []
        for rows, context_slots, mask in trees:
            slots = torch.cat([context_slots.long(), slot_mapping[rows].long()])
            # node i sees the whole context, then its own path: [nodes, context + nodes]
            visible = torch.cat([torch.ones(len(mask), len(context_slots), dtype=torch.bool), mask], dim=1)
            first = (
                first_of_run(slots) if slots.device.type == "cpu" else None
            )  # reading GPU values would sync
            self.trees.append((rows, slots, first, visible.to(slots.device)))
        # Batch-invariant mode: per tree, per node, the cache rows it sees (its context, then its path).
        self.node_slots = None
        if batch_invariant():
            self.node_slots = [[slots[seen] for seen in visible] for _, slots, _, visible in self.trees]

    def verify_context(self, max_rows: int) -> DecodeContext | None:
        """A step that verifies one tree of 2 to ``max_rows`` nodes and nothing else, as a ``DecodeContext``
        (``cache/paged_kv_cache.py``) for the layers that store and attend themselves
        (``model/cpu_decode_layers.py``): ``row`` the nodes' cache rows, ``rows`` the context's then the
        nodes', ``visible`` the tree mask beside the context. None on any other step, on the Triton path and
        in batch-invariant mode."""
        if not self.store_only or len(self.trees) != 1 or self.node_slots is not None or self.paged.triton:
            return None
        _, slots, _, visible = self.trees[0]
        if not 2 <= len(self.slots) <= max_rows:
            return None
        return DecodeContext(*self.paged.flat_caches(), self.slots, slots, visible)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.store_only:
            write_slots(k, v, self.k_cache[layer], self.v_cache[layer], self.slots)
            out = torch.empty_like(q)
        else:
            out = self.paged(layer, q, k, v)
        flat_k, flat_v = (cache[layer].view(-1, *k.shape[1:]) for cache in (self.k_cache, self.v_cache))
        if self.node_slots is not None:
            return self._attend_nodes(q, flat_k, flat_v, out)
        for rows, slots, first, mask in self.trees:
            if first is not None:
                keys, values = flat_k[first : first + len(slots)], flat_v[first : first + len(slots)]
            else:
                keys, values = flat_k.index_select(0, slots), flat_v.index_select(0, slots)
            attended = F.scaled_dot_product_attention(
                q[rows].to(keys.dtype).transpose(0, 1)[None],
                keys.transpose(0, 1)[None],
                values.transpose(0, 1)[None],
                attn_mask=mask,
                enable_gqa=True,
            )
            out[rows] = attended[0].transpose(0, 1).to(out.dtype)
        return out

    def _attend_nodes(
        self, q: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor, out: torch.Tensor
    ) -> torch.Tensor:
        """Batch-invariant: each tree node's query alone over the cache rows it sees, in token order, one
        unmasked SDPA call each (``TorchPagedStep``'s per-row call, so a node's result is the one its token
        gets alone)."""
        for (rows, _, _, _), seen in zip(self.trees, self.node_slots, strict=True):
            for node, slots in enumerate(seen):
                keys, values = (
                    flat.index_select(0, slots).transpose(0, 1)[None] for flat in (flat_k, flat_v)
                )
                row = (
                    q[rows.start + node : rows.start + node + 1].to(keys.dtype).unsqueeze(2)
                )  # [1, Hq, 1, D]
                attended = F.scaled_dot_product_attention(row, keys, values, enable_gqa=True)
                out[rows.start + node] = attended[0, :, 0].to(out.dtype)
        return out
