"""Turn a batch of logits into next tokens, each row by its own request's ``SamplingParams``, in batched ops.

``sampling_probs`` gives the distribution each row samples from (temperature, then top-k, then top-p), the
same one the speculative verifier checks drafts against; ``sample`` draws from it. A row with a seed draws
its random number from its own generator, so its tokens do not depend on what else shares the batch.
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


CANDIDATES = 256
"""How many of each row's largest logits ``filter_top_k_top_p`` ranks first (``topk``, not a sort of the whole
vocabulary); a row whose top-k or top-p set reaches past them is sorted whole."""


def filter_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Set to -inf every logit of ``logits`` ``[N, V]`` outside its row's ``top_k[row]`` largest (0: no limit) and
    outside the smallest set whose probability reaches its ``top_p[row]`` (the most likely token always stays).

    Both sets are prefixes of the row ranked by logit, and usually short: the batch ranks only its
    ``CANDIDATES`` largest logits per row (a ``topk``, some 20x cheaper than sorting 49k entries) and sorts
    whole only the rows whose set may reach past them.
    """
    vocab = logits.shape[-1]
    k = torch.tensor(top_k, device=logits.device)
    p = torch.tensor(top_p, device=logits.device)
    width = min(vocab, max(CANDIDATES, *top_k))
    ranked, order = logits.topk(width, dim=-1)  # sorted, largest first
    kept = _keep(ranked, k, p, logits.logsumexp(dim=-1, keepdim=True))
    # Where rank width - 1 is dropped, so is every later one (the sets are prefixes); a top-k row holds all of its
    # k here. Only a top-p row that keeps its last candidate must be sorted whole.
    unsure = (k == 0) & (p < 1.0) & torch.isfinite(kept[:, -1]) & (width < vocab)
    out = torch.full_like(logits, float("-inf")).scatter_(1, order, kept)
    no_limit = (k == 0) & (p >= 1.0)
    out[no_limit] = logits[no_limit]
    if unsure.any():
        rows = unsure.nonzero().flatten()
        ranked, order = torch.sort(logits[rows], dim=-1, descending=True)
        kept = _keep(ranked, k[rows], p[rows], logits[rows].logsumexp(dim=-1, keepdim=True))
        out[rows] = torch.empty_like(ranked).scatter_(1, order, kept)
    return out


def _keep(ranked: torch.Tensor, k: torch.Tensor, p: torch.Tensor, log_total: torch.Tensor) -> torch.Tensor:
    """``ranked`` ``[N, W]``, each row's largest logits in order, with -inf past its top-k and its top-p set.
    ``log_total`` ``[N, 1]``: the log of each row's whole softmax denominator, for rows without a top-k (a top-k
    row's denominator is that of its k kept logits, all ranked here: ``W >= k``)."""
    rank = torch.arange(ranked.shape[-1], device=ranked.device)[None, :]
    ranked = ranked.masked_fill((k[:, None] > 0) & (rank >= k[:, None]), float("-inf"))
    log_total = torch.where((k > 0)[:, None], ranked.logsumexp(dim=-1, keepdim=True), log_total)
    probs = (ranked - log_total).exp()
    covered_before = probs.cumsum(dim=-1) - probs  # drop a token once those ranked above it cover top_p
    return ranked.masked_fill((covered_before >= p[:, None]) & (p[:, None] < 1.0), float("-inf"))


def sample(probs: torch.Tensor, generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of ``probs`` ``[N, V]`` by inversion: the first token whose cumulative probability
    exceeds ``u`` x the row's total, ``u ~ U[0, 1)``. Seeded rows draw ``u`` from their own generator; one-hot
    (greedy) rows always give their argmax."""
    uniform = torch.rand(len(generators), dtype=torch.float64)
    for row, generator in enumerate(generators):
        if generator is not None:
            uniform[row] = torch.rand((), dtype=torch.float64, generator=generator)
    cumulative = probs.double().cumsum(dim=-1)
    threshold = (uniform.to(probs.device) * cumulative[:, -1])[:, None]
    tokens = torch.searchsorted(cumulative, threshold, right=True).clamp_(max=probs.shape[-1] - 1)
    return tokens.flatten().tolist()
