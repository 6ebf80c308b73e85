"""The model runner: turns a scheduled batch into flat tensors, runs the model, returns last-token logits."""

from __future__ import annotations

import torch

from ..cache.kv_cache import AttentionMetadata, CacheAttention, KVCache
from ..model.llama import LlamaModel
from .request import Request


class ModelRunner:
    def __init__(self, model: LlamaModel, num_slots: int, max_model_len: int, attention_backend: str = "auto"):
        config = model.config
        self.model = model
        self.attention_backend = attention_backend
        self.device = model.norm.weight.device
        self.max_model_len = max_model_len
        self.cache = KVCache(
            config.num_layers,
            num_slots,
            max_model_len,
            config.num_kv_heads,
            config.head_dim,
            model.norm.weight.dtype,
            self.device,
        )

    @torch.inference_mode()
    def run(self, requests: list[Request]) -> torch.Tensor:
        """Compute every uncached token of ``requests``; return float32 logits ``[len(requests), vocab]``
        of each request's last token, and mark those tokens as cached."""
        token_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        query_start, query_lens, seq_lens = [], [], []
        for request in requests:
            new_tokens = request.all_token_ids[request.num_computed :]
            first = request.num_computed
            query_start.append(len(token_ids))
            query_lens.append(len(new_tokens))
            seq_lens.append(first + len(new_tokens))
            token_ids.extend(new_tokens)
            positions.extend(range(first, first + len(new_tokens)))
            base = request.slot * self.max_model_len
            slot_mapping.extend(range(base + first, base + first + len(new_tokens)))
        to_device = dict(device=self.device, dtype=torch.long)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slot_mapping, **to_device),
            slots=[r.slot for r in requests],
            query_start=query_start,
            query_lens=query_lens,
            seq_lens=seq_lens,
            seq_lens_tensor=torch.tensor(seq_lens, **to_device),
        )
        hidden = self.model(
            torch.tensor(token_ids, **to_device),
            torch.tensor(positions, **to_device),
            CacheAttention(self.cache, meta, self.attention_backend),
        )
        last = torch.tensor([s + n - 1 for s, n in zip(query_start, query_lens)], **to_device)
        for request, seq_len in zip(requests, seq_lens):
            request.num_computed = seq_len
        return self.model.logits(hidden[last])
