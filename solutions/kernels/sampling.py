"""Turn a batch of logits into next tokens, each row by its own request's ``SamplingParams``, on the logits'
device, with no host branching on device values (so a GPU step never waits for the host here).

``sampling_probs`` gives the distribution each row samples from (temperature, then top-k, then top-p), the
same one the speculative verifier checks drafts against; ``sample`` draws from it by inversion, one uniform
number per row. A seeded row's number is a hash of its seed and the token's position (``counter_uniforms``),
so its tokens depend on nothing else in the batch, and are the same on every device.

Tensor math only, below both of its users: the engine samples each step's tokens with it, and
``speculative/rejection.py`` verifies drafts against the same distribution.
"""

from __future__ import annotations

import torch

from ..sampling_params import SamplingParams


def host_tensor(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` on ``device`` without a host sync: made in pinned memory and copied without blocking."""
    tensor = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return tensor.to(device, non_blocking=True)


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Probabilities ``[N, V]`` (float32) of the distribution each row samples from. Greedy rows (temperature
    0) get a one-hot row on their argmax."""
    logits = logits.float()
    device = logits.device
    greedy = [p.greedy for p in params]
    temperature = host_tensor([1.0 if p.greedy else p.temperature for p in params], torch.float32, device)
    logits = logits / temperature[:, None]
    top_k = [p.top_k if 0 < p.top_k < logits.shape[-1] else 0 for p in params]
    top_p = [p.top_p for p in params]
    if any(top_k) or any(p < 1.0 for p in top_p):
        logits = filter_top_k_top_p(logits, top_k, top_p)
    probs = torch.softmax(logits, dim=-1)
    if any(greedy):
        one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(host_tensor(greedy, torch.bool, device)[:, None], one_hot, probs)
    return probs


CANDIDATES = 256
"""How many of each row's largest logits ``filter_top_k_top_p`` ranks first (``topk``, not a sort of the whole
vocabulary); a row whose top-k or top-p set may reach past them is sorted whole."""


def filter_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Set to -inf every logit of ``logits`` ``[N, V]`` outside its row's ``top_k[row]`` largest
    (0: no limit) and outside the smallest set whose probability reaches its ``top_p[row]`` (the most
    likely token always stays).

    Both sets are prefixes of the row ranked by logit, and usually short: the batch ranks only its
    ``CANDIDATES`` largest logits per row (a ``topk``, some 20x cheaper than sorting 49k entries). Which rows
    may reach past them is known from the settings alone (top-p without top-k); of those, a CPU sorts whole
    only the rows whose set does reach past (it reads the data: free there), a GPU sorts them all (reading the
    data would make the host wait for the device).
    """
    vocab = logits.shape[-1]
    device = logits.device
    k = host_tensor(top_k, torch.int64, device)
    p = host_tensor(top_p, torch.float32, device)
    width = min(vocab, max(CANDIDATES, *top_k))
    ranked, order = logits.topk(width, dim=-1)  # sorted, largest first
    kept = _keep(ranked, k, p, logits.logsumexp(dim=-1, keepdim=True))
    out = torch.full_like(logits, float("-inf")).scatter_(1, order, kept)
    no_limit = [i for i, (k_i, p_i) in enumerate(zip(top_k, top_p)) if k_i == 0 and p_i >= 1.0]
    if no_limit:
        rows = host_tensor(no_limit, torch.int64, device)
        out.index_copy_(0, rows, logits.index_select(0, rows))
    # Where rank width - 1 is dropped, so is every later one (the sets are prefixes); a top-k row holds all of
    # its k here. Only a top-p row that keeps its last candidate must be sorted whole.
    maybe = (
        [i for i, (k_i, p_i) in enumerate(zip(top_k, top_p)) if k_i == 0 and p_i < 1.0]
        if width < vocab
        else []
    )
    if maybe and device.type == "cpu":
        maybe = [i for i in maybe if torch.isfinite(kept[i, -1])]
    if maybe:
        rows = host_tensor(maybe, torch.int64, device)
        some = logits.index_select(0, rows)
        ranked, order = torch.sort(some, dim=-1, descending=True)
        kept = _keep(
            ranked, k.index_select(0, rows), p.index_select(0, rows), some.logsumexp(dim=-1, keepdim=True)
        )
        out.index_copy_(0, rows, torch.empty_like(ranked).scatter_(1, order, kept))
    return out


def _keep(ranked: torch.Tensor, k: torch.Tensor, p: torch.Tensor, log_total: torch.Tensor) -> torch.Tensor:
    """``ranked`` ``[N, W]``, each row's largest logits in order, with -inf past its top-k and its top-p set.
    ``log_total`` ``[N, 1]``: the log of each row's whole softmax denominator, for rows without a top-k (a
    top-k row's denominator is that of its k kept logits, all ranked here: ``W >= k``)."""
    rank = torch.arange(ranked.shape[-1], device=ranked.device)[None, :]
    ranked = ranked.masked_fill((k[:, None] > 0) & (rank >= k[:, None]), float("-inf"))
    log_total = torch.where((k > 0)[:, None], ranked.logsumexp(dim=-1, keepdim=True), log_total)
    probs = (ranked - log_total).exp()
    covered_before = probs.cumsum(dim=-1) - probs  # drop a token once those ranked above it cover top_p
    return ranked.masked_fill((covered_before >= p[:, None]) & (p[:, None] < 1.0), float("-inf"))


_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)  # SplitMix64's constants, as signed 64-bit integers
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` keeps the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output for state ``x`` (int64 arithmetic wraps, as the algorithm's unsigned one does)."""
    z = x + _GAMMA
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def counter_uniforms(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One float64 in [0, 1) per row, a pure function of ``(seeds[i], counters[i])`` (int64): element ``c`` of
    the SplitMix64 stream that ``seeds[i]`` starts. Same seed, same counter, same number, on any device."""
    z = _splitmix64(_splitmix64(seeds) + counters)
    return _shift_right(z, 11).double() * 2.0**-53


def row_uniforms(seeds: list[int | None], counters: list[int], device: torch.device) -> torch.Tensor:
    """The uniform number each row samples with: ``counter_uniforms`` for a seeded row (counter: the position
    of the token it draws), the device's generator for the others."""
    uniform = torch.rand(len(seeds), dtype=torch.float64, device=device)
    if any(seed is not None for seed in seeds):
        seeded = host_tensor([seed is not None for seed in seeds], torch.bool, device)
        keys = host_tensor([seed or 0 for seed in seeds], torch.int64, device)
        uniform = torch.where(
            seeded, counter_uniforms(keys, host_tensor(counters, torch.int64, device)), uniform
        )
    return uniform


def sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` ``[N, V]`` by inversion: the first token whose cumulative probability
    exceeds ``uniform[row]`` x the row's total. One-hot (greedy) rows always give their argmax. Returns int64
    ``[N]`` on ``probs``' device."""
    cumulative = probs.double().cumsum(dim=-1)
    threshold = (uniform * cumulative[:, -1])[:, None]
    return torch.searchsorted(cumulative, threshold, right=True).clamp_(max=probs.shape[-1] - 1).flatten()
