"""Speculative decoding inside the engine: draft before a step, verify after it, roll back what was rejected.

propose(running)      every request in its decode phase gets ``spec_token_ids`` (a chain, or a tree's
                      nodes in parent-first order); the scheduler then plans ``1 + k`` tokens for it
runner.execute(...)   one pass over the root and its drafts (trees: depth positions and a tree mask)
verify(plan, out)     (after the step advanced each request's ``num_computed`` by its planned tokens)
                      rejection sampling (chains, batched) or the tree walk; the accepted tokens' K/V
                      stay (a tree's path is moved up behind the context), the rest is truncated;
                      the drafter sees the target's features at the accepted positions

``Engine.step`` calls these three on ``NO_SPECULATION`` when the engine does not speculate: the step has
one path either way.
"""

from __future__ import annotations

import torch

from ..cache.kv_cache_manager import KVCacheManager
from ..cache.paged_kv_cache import PagedKVCache
from ..config import EngineConfig
from ..kernels.sampling import filtered_probs, sampling_probs
from ..model.llama import LlamaModel
from ..speculative.drafter import EagleDrafter, NgramDrafter
from ..speculative.eagle import HEAD_PATH, load_head, target_features
from ..speculative.medusa import MEDUSA_PATH, MedusaDrafter, load_heads
from ..speculative.rejection import verify
from ..speculative.tree import DraftTree, walk_greedy, walk_tree
from .request import Request
from .runner import ModelOutput
from .sampling_batch import SamplingBatch
from .scheduler import SchedulerOutput


class Speculator:
    """Owns the drafter and the per-step draft bookkeeping; counts verify passes and the tokens they gave."""

    def __init__(
        self,
        config: EngineConfig,
        model: LlamaModel,
        kv: KVCacheManager,
        cache: PagedKVCache,
        sampling: SamplingBatch,
    ):
        self.model, self.kv, self.cache, self.sampling = model, kv, cache, sampling
        self.max_model_len = min(config.max_model_len, model.config.max_position_embeddings)
        k = config.num_speculative_tokens
        if config.speculative == "ngram":
            self.drafter: EagleDrafter | MedusaDrafter | NgramDrafter = NgramDrafter(k)
        elif config.speculative == "medusa":
            heads = load_heads(model, config.medusa_heads or MEDUSA_PATH)
            self.drafter = MedusaDrafter(heads, k, tree_depth=k, tree_top_k=config.speculative_tree_top_k)
        else:
            head = load_head(model, config.eagle_head or HEAD_PATH)
            self.drafter = EagleDrafter(head, k, tree_depth=k, tree_top_k=config.speculative_tree_top_k)
        self.tree_nodes = config.speculative_tree_nodes
        self.disable_above = config.speculative_disable_by_batch_size
        self.trees: dict[str, DraftTree] = {}
        # per request whose tree the last verify walked: the logits row (offset in its span) each of its
        # returned tokens was chosen from, the root's then each accepted node's (a chain's are 0, 1, 2, ...)
        self.token_rows: dict[str, list[int]] = {}
        self.draft_probs: dict[str, torch.Tensor | None] = {}
        self.known: set[str] = set()
        self.num_verify_passes = 0
        self.num_verified_tokens = 0

    @property
    def needs_hidden(self) -> bool:
        return self.drafter.needs_features

    @property
    def mean_acceptance_length(self) -> float:
        """tau: tokens emitted per verifying target pass (accepted drafts + the one the target adds)."""
        return self.num_verified_tokens / max(1, self.num_verify_passes)

    def tree_parents(self) -> dict[str, list[int]]:
        return {request_id: tree.parents for request_id, tree in self.trees.items()}

    def propose(self, running: list[Request]) -> None:
        """Draft for every running request whose newest token awaits its pass (the decode phase); nothing in a
        step with more than ``speculative_disable_by_batch_size`` running requests (when set), though every
        request's features still reach the drafter, so that it drafts again once the batch shrinks."""
        self.trees.clear()
        self.draft_probs.clear()
        for gone in self.known - {r.request_id for r in running}:
            self.drafter.free(gone)
        self.known = {r.request_id for r in running}
        ready, limits = [], []
        disabled = 0 < self.disable_above < len(running)
        for request in running:
            request.spec_token_ids = []
            if disabled:
                continue
            # The target always adds one token after the drafts: leave room for it.
            limit = min(
                request.params.max_tokens - len(request.output_token_ids) - 1,
                self.max_model_len - request.num_tokens - 1,
            )
            in_decode = request.num_computed == request.num_tokens - 1
            if in_decode and limit > 0 and self.drafter.ready(request.request_id, request.num_computed):
                ready.append(request)
                limits.append(limit)
        if not ready:
            return
        if self.tree_nodes:
            for request, limit in zip(ready, limits):
                if limit >= self.drafter.tree_depth:
                    tree = self.drafter.propose_tree(
                        request.request_id, request.all_token_ids, self.tree_nodes
                    )
                    self.trees[request.request_id] = tree
                    request.spec_token_ids = tree.token_ids[1:]
            return
        drafts = self.drafter.propose(
            [r.request_id for r in ready],
            [r.all_token_ids for r in ready],
            limits,
            [r.params.temperature for r in ready],
        )
        for request, draft in zip(ready, drafts):
            request.spec_token_ids = draft.token_ids
            self.draft_probs[request.request_id] = draft.probs

    @torch.inference_mode()
    def verify(self, plan: SchedulerOutput, out: ModelOutput) -> dict[str, list[int]]:
        """Accept drafts for every request that verified some, fix its KV and ``num_computed`` (which the
        step has advanced by the planned tokens, drafts included); feed the drafter every scheduled
        request's features. Returns the tokens to append, by request id."""
        hidden_start, chains, tokens = 0, [], {}
        self.token_rows = {}
        for request in plan.scheduled:
            request_id = request.request_id
            num_new = plan.num_scheduled_tokens[request_id]
            before = request.num_computed - num_new
            num_drafts = num_new - 1 if request.spec_token_ids and before == request.num_tokens - 1 else 0
            hidden_rows = range(hidden_start, hidden_start + num_new)
            hidden_start += num_new
            if num_drafts == 0:
                self._observe(request_id, out, hidden_rows, before)
            elif request_id in self.trees:
                tokens[request_id] = self._walk(request, out, num_drafts, hidden_rows, before)
            else:
                chains.append((request, request.spec_token_ids[:num_drafts], hidden_rows, before))
            request.spec_token_ids = []
        if chains:
            tokens.update(self._verify_chains(chains, out))
        return tokens

    def _verify_chains(self, chains: list, out: ModelOutput) -> dict[str, list[int]]:
        """Batched rejection sampling over every request verifying a chain."""
        if all(request.params.greedy for request, _, _, _ in chains):
            return self._verify_greedy_chains(chains, out)
        requests = [request for request, _, _, _ in chains]
        drafts = [draft_ids for _, draft_ids, _, _ in chains]
        starts = [out.logits_spans[r.request_id].start for r in requests]
        inputs = self.sampling.chain_rows(requests, drafts, starts)
        batch, k = inputs.drafts.shape
        logits = out.logits.index_select(0, inputs.logits_index)
        probs = filtered_probs(logits, inputs.settings).view(batch, k + 1, -1)
        q = None
        if any(self.draft_probs.get(r.request_id) is not None for r in requests):
            # Deterministic drafts' q is one-hot; a sampling drafter's rows are its own.
            q = torch.zeros_like(probs[:, :k]).scatter_(2, inputs.drafts[..., None], 1.0)
            for b, request in enumerate(requests):
                draft_q = self.draft_probs.get(request.request_id)
                if draft_q is not None:
                    q[b, : len(drafts[b])] = draft_q[: len(drafts[b])]
        num_accepted, next_token = verify(
            inputs.drafts,
            probs,
            q,
            inputs.num_drafts,
            uniforms=(inputs.accept_uniform, inputs.draw_uniform),
        )
        verdicts = torch.cat([num_accepted, next_token]).tolist()  # the verify's one read
        tokens = {}
        for b, (request, draft_ids, hidden_rows, before) in enumerate(chains):
            accepted = verdicts[b]
            self._commit(request, before, accepted)
            self._observe(request.request_id, out, hidden_rows[: accepted + 1], before)
            tokens[request.request_id] = list(draft_ids[:accepted]) + [verdicts[batch + b]]
        return tokens

    def _verify_greedy_chains(self, chains: list, out: ModelOutput) -> dict[str, list[int]]:
        """Rejection sampling's temperature-0 case without building distributions: ``p`` is one-hot at the
        argmax, so a draft is kept iff it equals the target's argmax, and the next token is that argmax."""
        choices = out.logits.argmax(dim=-1).tolist()
        tokens = {}
        for request, draft_ids, hidden_rows, before in chains:
            span = out.logits_spans[request.request_id]
            targets = choices[span.start : span.start + len(draft_ids) + 1]
            accepted = 0
            while accepted < len(draft_ids) and draft_ids[accepted] == targets[accepted]:
                accepted += 1
            self._commit(request, before, accepted)
            self._observe(request.request_id, out, hidden_rows[: accepted + 1], before)
            tokens[request.request_id] = list(draft_ids[:accepted]) + [targets[accepted]]
        return tokens

    def _walk(
        self, request: Request, out: ModelOutput, num_drafts: int, hidden_rows: range, before: int
    ) -> list[int]:
        """Walk a verified tree; move the accepted path's K/V up behind the context."""
        full = self.trees[request.request_id]
        # A token budget may have cut the tree short: a prefix of a parent-first node list is still a tree.
        tree = DraftTree(
            full.token_ids[: num_drafts + 1], full.parents[: num_drafts + 1], full.log_probs[: num_drafts + 1]
        )
        logits = out.logits[out.logits_spans[request.request_id]]
        if request.params.greedy:  # one-hot p: follow the child that holds the target's argmax
            path, token = walk_greedy(tree, logits.argmax(dim=-1).tolist())
        else:
            path, token = walk_tree(
                tree, sampling_probs(logits, [request.params] * len(tree)), request.generator
            )
        # Offsets from the root's position: the accepted node at depth d moves to offset d + 1.
        moves = [(node, depth + 1) for depth, node in enumerate(path) if node != depth + 1]
        if moves:
            slots = self.kv.slot_mapping(request.request_id, before, before + len(tree))
            src, dst = (
                torch.tensor([slots[i] for i in column], device=self.cache.k.device) for column in zip(*moves)
            )
            for layers in (self.cache.k, self.cache.v):
                flat = layers.view(layers.shape[0], -1, *layers.shape[3:])
                flat[:, dst] = flat[:, src]
        self._commit(request, before, len(path))
        self.token_rows[request.request_id] = [0, *path]
        self._observe(
            request.request_id, out, [hidden_rows[0]] + [hidden_rows[node] for node in path], before
        )
        return [tree.token_ids[node] for node in path] + [token]

    def _commit(self, request: Request, before: int, num_accepted: int) -> None:
        """Keep the K/V of the root and the accepted drafts; hand the rejected drafts' slots back."""
        request.num_computed = before + 1 + num_accepted
        self.kv.truncate(request, request.num_computed)
        self.num_verify_passes += 1
        self.num_verified_tokens += num_accepted + 1
        metrics = request.group.metrics
        metrics.num_verify_passes += 1
        metrics.num_verified_tokens += num_accepted + 1

    def _observe(
        self, request_id: str, out: ModelOutput, hidden_rows: range | list[int], first_position: int
    ) -> None:
        """Hand the drafter the target's features at ``hidden_rows`` (a run of rows is read in place)."""
        if self.drafter.needs_features:
            if isinstance(hidden_rows, range):
                hidden = out.hidden[hidden_rows.start : hidden_rows.stop]
            else:
                hidden = out.hidden[torch.tensor(hidden_rows, device=out.hidden.device)]
            self.drafter.observe(request_id, target_features(self.model, hidden), first_position)


class NoSpeculation:
    """The speculator of an engine that does not speculate: drafts nothing, so verifies nothing."""

    needs_hidden = False
    token_rows: dict[str, list[int]] = {}  # never written: no tree is ever walked

    def propose(self, running: list[Request]) -> None:
        pass

    def tree_parents(self) -> None:
        return None

    def verify(self, plan: SchedulerOutput, out: ModelOutput) -> dict[str, list[int]]:
        return {}


NO_SPECULATION = NoSpeculation()
