"""Drafters: what proposes the tokens the target verifies. Both keep per-request state by request id.

A request in its decode phase has ``num_computed == num_tokens - 1``: the newest token (the root of the
next draft) has no K/V yet. ``propose`` returns drafts for it; after the target's pass the engine calls
``observe`` with the target's features at the positions whose inputs it accepted, so an EAGLE head can
replace its own guesses by the real features before it drafts again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .eagle import DraftKV, EagleHead
from .ngram import propose_ngram
from .tree import DraftTree, grow_tree


@dataclass
class Draft:
    """Tokens to verify after the root, and the drafter's ``q`` for each (``[k, V]``; None: deterministic)."""

    token_ids: list[int]
    probs: torch.Tensor | None = None


class NgramDrafter:
    """Prompt lookup: copies what followed the latest match of the sequence's last n-gram."""

    needs_features = False

    def __init__(self, num_tokens: int, max_ngram: int = 3, min_ngram: int = 1):
        self.num_tokens, self.max_ngram, self.min_ngram = num_tokens, max_ngram, min_ngram

    def propose(
        self, request_ids: list[str], token_ids: list[list[int]], limits: list[int], temperatures: list[float]
    ) -> list[Draft]:
        """Drafts for each request, at most ``limits[b]`` tokens (deterministic, so ``q`` is one-hot)."""
        return [
            Draft(
                propose_ngram(ids, min(self.num_tokens, limit), self.max_ngram, self.min_ngram)
                if limit > 0
                else []
            )
            for ids, limit in zip(token_ids, limits)
        ]

    def observe(self, request_id: str, features: torch.Tensor | None, first_position: int) -> None:
        pass

    def ready(self, request_id: str, num_computed: int) -> bool:
        return True

    def free(self, request_id: str) -> None:
        pass


class EagleDrafter:
    """Chains (``propose``) and EAGLE-2 trees (``propose_tree``) from an ``EagleHead``.

    Per request: the head's KV holds entries for positions ``[start, committed)``, built from real target
    features, and ``pending`` holds real features not fed to the head yet. Invariant when ready:
    ``committed + len(pending) == request.num_computed``. ``start`` is 0 unless the request's first
    positions were never computed by this target pass (a prefix-cache hit, a forked completion): the head
    then drafts without that part of the context.
    """

    needs_features = True

    def __init__(self, head: EagleHead, num_tokens: int, tree_depth: int = 0, tree_top_k: int = 4):
        self.head = head
        self.num_tokens = num_tokens
        self.tree_depth, self.tree_top_k = tree_depth, tree_top_k
        self.kv = DraftKV()
        self.start: dict[str, int] = {}
        self.committed: dict[str, int] = {}
        self.pending: dict[str, list[torch.Tensor]] = {}

    def _known(self, request_id: str) -> int | None:
        if request_id not in self.start:
            return None
        return self.committed[request_id] + sum(f.shape[0] for f in self.pending[request_id])

    def observe(self, request_id: str, features: torch.Tensor, first_position: int) -> None:
        """Real target features ``[m, H]`` for positions ``first_position ..``; a gap (a preempted request
        recomputed from 0, a prefix-cache hit) starts the request's head state afresh there."""
        if self._known(request_id) != first_position:
            self.free(request_id)
            self.start[request_id] = self.committed[request_id] = first_position
            self.pending[request_id] = []
        self.pending[request_id].append(features)

    def ready(self, request_id: str, num_computed: int) -> bool:
        """Whether the head holds or awaits features for every computed position since its start."""
        known = self._known(request_id)
        return known == num_computed and known > self.committed[request_id]

    def free(self, request_id: str) -> None:
        self.kv.free(request_id)
        for state in (self.start, self.committed, self.pending):
            state.pop(request_id, None)

    def _catch_up(self, request_ids: list[str], token_ids: list[list[int]]) -> torch.Tensor:
        """Feed every request's pending real features to the head (dropping its speculative entries);
        returns the head's output at each request's newest pair ``[B, H]``:
        its guess of the root's feature."""
        features, next_ids, positions, lengths = [], [], [], []
        for request_id, ids in zip(request_ids, token_ids):
            if not self.ready(request_id, len(ids) - 1):
                raise RuntimeError(
                    f"request {request_id}: the drafter holds features up to position "
                    f"{self._known(request_id)}, but the sequence has {len(ids) - 1} computed tokens"
                )
            done = self.committed[request_id]
            self.kv.truncate(request_id, done - self.start[request_id])
            pending = torch.cat(self.pending[request_id])
            self.pending[request_id] = []
            count = pending.shape[0]
            features.append(pending)
            next_ids += ids[done + 1 : done + count + 1]
            positions += range(done, done + count)
            lengths.append(count)
            self.committed[request_id] = done + count
        device = self.head.fc.weight.device
        hidden = self.head(
            torch.cat(features).to(device),
            torch.tensor(next_ids, device=device),
            torch.tensor(positions, device=device),
            self.kv.attend(request_ids, lengths),
        )
        last = torch.tensor(lengths).cumsum(0) - 1
        return hidden[last.to(device)]

    @torch.inference_mode()
    def propose(
        self, request_ids: list[str], token_ids: list[list[int]], limits: list[int], temperatures: list[float]
    ) -> list[Draft]:
        """A chain of up to ``min(num_tokens, limits[b])`` drafts per request, drafted in lockstep.

        Greedy requests take the head's argmax (deterministic drafts); others sample from
        ``softmax(logits / T)`` over the draft vocabulary and return that ``q`` for rejection sampling.
        """
        hidden = self._catch_up(request_ids, token_ids)
        head, vocab_size = self.head, self.head.lm_head_weight.shape[0]
        steps = min(self.num_tokens, max(limits))
        # The chain stays on the device until it is drafted: one read of every draft at the end.
        positions = torch.tensor([self.committed[r] for r in request_ids], device=hidden.device)
        chain: list[torch.Tensor] = []
        probs: list[list[torch.Tensor]] = [[] for _ in request_ids]
        for step in range(steps):
            logits = head.draft_logits(hidden)  # [B, Vd]
            choices = logits.argmax(dim=-1)
            for b, temperature in enumerate(temperatures):
                if temperature > 0:
                    q = torch.softmax(logits[b] / temperature, dim=-1)
                    choices[b] = torch.multinomial(q, 1)[0]
                    full = torch.zeros(vocab_size, device=q.device).index_copy_(0, head.vocab_ids, q)
                    probs[b].append(full)
            chain.append(head.vocab_ids[choices])
            if step + 1 < steps:
                hidden = head(
                    hidden, chain[-1], positions + step, self.kv.attend(request_ids, [1] * len(request_ids))
                )
        drafted = torch.stack(chain, dim=1).tolist() if chain else [[] for _ in request_ids]  # [B, steps]
        drafts = []
        for ids, p, limit in zip(drafted, probs, limits):
            num = max(0, min(self.num_tokens, limit))
            drafts.append(Draft(ids[:num], torch.stack(p[:num]) if p and num else None))
        return drafts

    @torch.inference_mode()
    def propose_tree(self, request_id: str, token_ids: list[int], num_nodes: int) -> DraftTree:
        """An EAGLE-2 dynamic tree of ``num_nodes`` drafts below the request's newest token (greedy drafts:
        children are the head's top-k, scored by cumulative log-probability)."""
        root_hidden = self._catch_up([request_id], [token_ids])[0]
        head = self.head
        device = root_hidden.device
        done = self.committed[request_id]
        context = done - self.start[request_id]  # the head's KV entries built from real features
        kv_row: dict[int, int] = {}  # candidate -> its entry in the head's KV (expanded candidates only)
        hidden_of: dict[int, torch.Tensor] = {-1: root_hidden}
        depth_of: dict[int, int] = {-1: 0}

        def expand(frontier: list[int], tokens: list[int], parents: list[int]) -> torch.Tensor:
            past = self.kv.length(request_id)
            for offset, cand in enumerate(frontier):
                kv_row[cand] = past + offset
                depth_of[cand] = depth_of[parents[cand]] + 1
            visible = torch.zeros(len(frontier), past + len(frontier), dtype=torch.bool)
            visible[:, :context] = True
            for offset, cand in enumerate(frontier):
                node = cand
                while node != -1:
                    visible[offset, kv_row[node]] = True
                    node = parents[node]
            out = head(
                torch.stack([hidden_of[parents[c]] for c in frontier]),
                head.vocab_ids[torch.tensor([tokens[c] for c in frontier], device=device)],
                torch.tensor([done + depth_of[c] - 1 for c in frontier], device=device),
                self.kv.attend([request_id], [len(frontier)], [visible]),
            )
            for offset, cand in enumerate(frontier):
                hidden_of[cand] = out[offset]
            return torch.log_softmax(head.draft_logits(out), dim=-1)

        root_log_probs = torch.log_softmax(head.draft_logits(root_hidden[None])[0], dim=-1)
        tree = grow_tree(token_ids[-1], root_log_probs, expand, self.tree_depth, self.tree_top_k, num_nodes)
        ids = head.vocab_ids.cpu()
        tree.token_ids = [tree.token_ids[0]] + [int(ids[t]) for t in tree.token_ids[1:]]
        return tree
