"""Turn a batch of logits into next tokens, each row by its own request's ``SamplingParams``, in batched ops.

``sampling_probs`` gives the distribution each row samples from (temperature, then top-k, then top-p), the
same one the speculative verifier checks drafts against; ``sample`` draws from it. A row with a seed draws
its noise from its own generator, so its tokens do not depend on what else shares the batch.
"""

from __future__ import annotations

import torch

from .sampling_params import SamplingParams


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Probabilities ``[N, V]`` (float32) of the distribution each row samples from. Greedy rows (temperature
    0) get a one-hot row on their argmax."""
    logits = logits.float()
    greedy = torch.tensor([p.greedy for p in params], device=logits.device)
    temperature = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=logits.device)
    logits = logits / temperature[:, None]
    top_k = [p.top_k if 0 < p.top_k < logits.shape[-1] else 0 for p in params]
    top_p = [p.top_p for p in params]
    if any(top_k) or any(p < 1.0 for p in top_p):
        logits = filter_top_k_top_p(logits, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    if greedy.any():
        one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


def filter_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Set to -inf every logit of ``logits`` ``[N, V]`` outside its row's ``top_k[row]`` largest (0: no limit) and
    outside the smallest set whose probability reaches its ``top_p[row]`` (the most likely token always stays).
    One sort for the whole batch."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = torch.tensor(top_k, device=logits.device)
    drop = (k[:, None] > 0) & (rank >= k[:, None])
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token when the tokens ranked above it already cover top_p.
    covered_before = probs.cumsum(dim=-1) - probs
    p = torch.tensor(top_p, device=logits.device)
    sorted_logits = sorted_logits.masked_fill(covered_before >= p[:, None], float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def sample(probs: torch.Tensor, generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of ``probs`` ``[N, V]``: argmax of ``probs / E`` with ``E ~ Exp(1)`` noise (the
    exponential race, equivalent to drawing from ``probs``). Seeded rows draw their noise from their own
    generator; one-hot (greedy) rows always give their argmax."""
    noise = torch.empty_like(probs).exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row] = torch.empty(probs.shape[-1], device=probs.device).exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1).tolist()
