"""Turn a batch of logits into next tokens, each row by its own request's ``SamplingParams``."""

from __future__ import annotations

import torch

from .sampling_params import SamplingParams


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf every logit outside the ``top_k`` largest and outside the smallest set whose
    probability reaches ``top_p`` (the most likely token is always kept). ``logits``: ``[V]``."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens ranked above it already cover top_p.
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.empty_like(drop_sorted).scatter_(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of ``logits`` ``[B, V]`` (float32). Greedy rows take the argmax in one batched op."""
    tokens = logits.argmax(dim=-1).tolist()
    for row, (p, generator) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        filtered = filter_top_k_top_p(logits[row].cpu() / p.temperature, p.top_k, p.top_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens[row] = int(torch.multinomial(probs, 1, generator=generator))
    return tokens
