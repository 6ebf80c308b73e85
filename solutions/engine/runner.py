"""The model runner: turns a ``SchedulerOutput`` into one flat batch, runs the model once, returns logits.

For the step's ``T`` tokens (decodes first, then prefill chunks and draft verifications) it builds::

    input_ids [T], positions [T], slot_mapping [T]         one entry per token
    query_start_loc [B + 1], seq_lens [B], block_table [B, max_blocks]   one row per request
    logits_indices [N]                                      the rows whose next-token logits are wanted

A request gets logits only when its step reaches its last known token: one row for a decode or a final
prefill chunk, ``1 + k`` rows when it verifies ``k`` draft tokens, none for an unfinished prefill chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache.paged_kv_cache import AttentionMetadata, PagedAttention, PagedKVCache
from ..model.llama import LlamaModel
from ..speculative.tree import TreeAttention, tree_attention_mask, tree_positions
from .scheduler import SchedulerOutput


@dataclass
class ModelOutput:
    """``logits`` ``[N, vocab]`` float32; request ``r``'s rows are ``logits[rows[r.request_id]]`` (absent when
    its prefill is unfinished). ``hidden`` ``[T, hidden]`` (before the final norm) when asked for."""

    logits: torch.Tensor
    rows: dict[str, slice]
    hidden: torch.Tensor | None = None
    logits_indices: torch.Tensor | None = None


class ModelRunner:
    def __init__(self, model: LlamaModel, cache: PagedKVCache, attention_backend: str = "auto"):
        self.model = model
        self.cache = cache
        self.attention_backend = attention_backend
        self.device = model.norm.weight.device

    @torch.inference_mode()
    def execute(
        self,
        plan: SchedulerOutput,
        block_tables: list[list[int]],
        return_hidden: bool = False,
        trees: dict[str, list[int]] | None = None,
    ) -> ModelOutput:
        """Run the planned tokens of every scheduled request (``block_tables`` in the same order).

        ``trees`` (Lesson 4): for a request verifying a draft tree, its node parents (root first); its drafts
        sit at their depth's position and attend to the context and their ancestors only."""
        self.cache.copy_blocks(plan.block_copies)
        block_size = self.cache.block_size
        token_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        query_start, seq_lens, logits_indices = [0], [], []
        rows: dict[str, slice] = {}
        tree_specs = []
        for request, table in zip(plan.scheduled, block_tables):
            num_new = plan.num_scheduled_tokens[request.request_id]
            first = request.num_computed
            tokens = request.token_ids(first, first + num_new)
            token_ids.extend(tokens)
            if trees and request.request_id in trees:
                parents = trees[request.request_id][:num_new]  # a cut tree is still a tree: parents come first
                positions.extend(tree_positions(parents, first).tolist())
                context = [table[p // block_size] * block_size + p % block_size for p in range(first)]
                rows_of_tree = slice(len(token_ids) - num_new, len(token_ids))
                tree_specs.append(
                    (rows_of_tree, torch.tensor(context, device=self.device), tree_attention_mask(parents))
                )
            else:
                positions.extend(range(first, first + num_new))
            slot_mapping.extend(
                table[p // block_size] * block_size + p % block_size for p in range(first, first + num_new)
            )
            end = first + num_new
            if end >= request.num_tokens:  # reached the last known token: the next one is wanted
                num_logits = end - request.num_tokens + 1
                rows[request.request_id] = slice(len(logits_indices), len(logits_indices) + num_logits)
                logits_indices.extend(range(len(token_ids) - num_logits, len(token_ids)))
            query_start.append(len(token_ids))
            seq_lens.append(end)
        longest_table = max(len(t) for t in block_tables)
        table = torch.zeros(len(block_tables), longest_table, dtype=torch.int32)
        for row, blocks in enumerate(block_tables):
            table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        on_device = dict(device=self.device)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, **on_device),
            block_table=table.to(self.device),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32, **on_device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, **on_device),
            max_query_len=max(b - a for a, b in zip(query_start, query_start[1:])),
            max_seq_len=max(seq_lens),
        )
        attend = PagedAttention(self.cache, meta, self.attention_backend)
        if tree_specs:
            attend = TreeAttention(attend, self.cache.k, self.cache.v, tree_specs)
        hidden = self.model(
            torch.tensor(token_ids, dtype=torch.long, **on_device),
            torch.tensor(positions, dtype=torch.long, **on_device),
            attend,
        )
        indices = torch.tensor(logits_indices, dtype=torch.long, **on_device)
        logits = self.model.logits(hidden[indices]) if logits_indices else hidden.new_zeros(0, 0).float()
        return ModelOutput(logits, rows, hidden if return_hidden else None, indices)
