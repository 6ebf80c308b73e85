"""Turn a batch of logits into next tokens, each row by its own settings, on the logits' device, with no host
branching on device values and no sort of the vocabulary (so a GPU step never waits for the host here).

``filtered_probs`` gives the distribution each row samples from: ``logits / temperature``, then min-p, top-k
and top-p, each a threshold on the row's logits (a token is kept iff its logit is at least the threshold, so
tokens tied at the boundary stay together, as vLLM's top-k does); the speculative verifier checks drafts
against the same distribution. ``sample`` draws from it by inversion, one uniform number per row. A seeded
row's number is a hash of its seed and a counter (``counter_uniforms``), so its tokens depend on nothing else
in the batch, and are the same on every device.

Top-p's threshold is found by a radix select on the logits' bits (three rounds of a 2048-way bisection, each
a histogram of the probability mass by the next 11 bits): exact, the threshold a full sort would give, with
a fixed number of tensor operations whatever the data.

Tensor math only, below both of its users: the engine samples each step's tokens with it, and
``speculative/rejection.py`` verifies drafts against the same distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling_params import SamplingParams


def host_tensor(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``values`` on ``device`` without a host sync: made in pinned memory and copied without blocking.
    (It allocates: for callers off the engine's hot path, which keeps its settings in persistent buffers.)"""
    tensor = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return tensor.to(device, non_blocking=True)


@dataclass(frozen=True)
class RowSettings:
    """Each row's sampling settings as device tensors ``[N]``, and what the host knows of them all (to skip
    the work no row needs: that is decided by the settings, never by the data).

    ``temperature`` float32 (1 on greedy rows, whose ``greedy`` is True); ``top_k`` int64, 0 for no limit;
    ``top_p`` float32, 1 for none; ``min_p`` float32, 0 for none."""

    temperature: torch.Tensor
    greedy: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    max_top_k: int  # the largest top_k of the rows (0: no row limits it)
    uses_top_p: bool
    uses_min_p: bool
    any_greedy: bool

    @classmethod
    def of(cls, params: list[SamplingParams], vocab_size: int, device: torch.device) -> RowSettings:
        """The settings of one ``SamplingParams`` per row (made from host lists: off the hot path)."""
        top_k = [clamp_top_k(p.top_k, vocab_size) for p in params]
        return cls(
            temperature=host_tensor(
                [1.0 if p.greedy else p.temperature for p in params], torch.float32, device
            ),
            greedy=host_tensor([p.greedy for p in params], torch.bool, device),
            top_k=host_tensor(top_k, torch.int64, device),
            top_p=host_tensor([p.top_p for p in params], torch.float32, device),
            min_p=host_tensor([p.min_p for p in params], torch.float32, device),
            max_top_k=max(top_k, default=0),
            uses_top_p=any(p.top_p < 1.0 for p in params),
            uses_min_p=any(p.min_p > 0.0 for p in params),
            any_greedy=any(p.greedy for p in params),
        )


def clamp_top_k(top_k: int, vocab_size: int) -> int:
    """A ``SamplingParams.top_k`` as the filter counts it: 0 when it keeps every token (0, -1, or >= V)."""
    return top_k if 0 < top_k < vocab_size else 0


def filtered_probs(logits: torch.Tensor, settings: RowSettings) -> torch.Tensor:
    """Probabilities ``[N, V]`` (float32) of the distribution each row samples from. Greedy rows get a
    one-hot row on their argmax."""
    logits = logits.float()
    scaled = logits / settings.temperature[:, None]
    threshold = logit_threshold(scaled, settings)
    if threshold is not None:
        scaled = scaled.masked_fill(scaled < threshold[:, None], float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if settings.any_greedy:
        one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(settings.greedy[:, None], one_hot, probs)
    return probs


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """``filtered_probs`` for one ``SamplingParams`` per row of ``logits`` ``[N, V]``."""
    return filtered_probs(logits, RowSettings.of(params, logits.shape[-1], logits.device))


CANDIDATES = 256
"""At least this many of each row's largest logits are ranked (``topk``) when some row has a top-k: a row's
k-th largest is then read off them."""


def logit_threshold(scaled: torch.Tensor, settings: RowSettings) -> torch.Tensor | None:
    """Each row's lowest kept logit value, float32 ``[N]`` (-inf: every token stays), for ``scaled``
    ``[N, V]`` (the logits over the temperature), or None when no row filters at all.

    The kept set, as vLLM composes the filters: the tokens with a probability of at least ``min_p`` times the
    row's largest; of those, the ``top_k`` largest; of those, the smallest set, largest first, whose
    probability (renormalised over what min-p and top-k kept) reaches ``top_p``. Each is a threshold on the
    logits, so the set is every token at or above the highest of the three.
    """
    if not (settings.uses_min_p or settings.max_top_k or settings.uses_top_p):
        return None
    vocab = scaled.shape[-1]
    # min-p: p >= min_p * p_max  <=>  logit >= max logit + log(min_p)  (log 0 = -inf: no limit)
    threshold = scaled.amax(dim=-1) + settings.min_p.log()
    if settings.max_top_k:
        ranked = scaled.topk(min(vocab, max(CANDIDATES, settings.max_top_k)), dim=-1).values
        kth = ranked.gather(1, (settings.top_k - 1).clamp(min=0)[:, None]).squeeze(1)
        threshold = torch.where(settings.top_k > 0, torch.maximum(threshold, kth), threshold)
    if settings.uses_top_p:
        if settings.uses_min_p or settings.max_top_k:  # top-p renormalises over what they kept
            scaled = scaled.masked_fill(scaled < threshold[:, None], float("-inf"))
        nucleus = top_p_threshold(scaled, settings.top_p)
        threshold = torch.where(settings.top_p < 1.0, torch.maximum(threshold, nucleus), threshold)
    return threshold


def top_p_threshold(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The lowest logit of each row's nucleus, float32 ``[N]``: the largest value ``t`` among the row's
    logits such that the tokens with a logit of at least ``t`` hold probability ``top_p[row]`` (-inf entries
    of ``logits`` ``[N, V]`` are excluded tokens). Sorting the row and cutting its cumulative sum where it
    reaches ``top_p`` gives the same ``t``.

    A radix select instead of a sort: each float32 logit maps to a 32-bit integer key in the same order, and
    three rounds fix the threshold's key 11, 11, then 10 bits at a time, each from a histogram of the
    probability mass (float64) over the next bits of the keys that share the bits fixed so far. A fixed number
    of tensor operations, whatever the data: nothing for the host to read.
    """
    rows, device = logits.shape[0], logits.device
    log_total = logits.logsumexp(dim=-1, keepdim=True)
    probs = (logits.double() - log_total.double()).exp()
    bits = logits.contiguous().view(torch.int32)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats order backwards by their bits: flip the 31 low
    target = top_p.double()[:, None]
    # Round 1 bins keys by their top 11 bits (signed: -1024..1023, offset to 0..2047); rounds 2 and 3 bin
    # the keys that share the bits fixed so far (``prefix``: the key shifted right past the round's bits).
    prefix = above = None  # above: the mass of the keys past the prefix
    for shift, width in ((21, 11), (10, 11), (0, 10)):
        mass = torch.zeros(rows, 1 << width, dtype=torch.float64, device=device)
        if prefix is None:
            mass.scatter_add_(1, (key >> shift) + 1024, probs)
            at_least = mass.flip(-1).cumsum(-1).flip(-1)  # mass of the keys >= each bin's lowest key
        else:
            in_prefix = (key >> (shift + width)) == prefix
            mass.scatter_add_(1, (key >> shift) & ((1 << width) - 1), probs * in_prefix)
            at_least = mass.flip(-1).cumsum(-1).flip(-1) + above
        # The highest bin whose mass reaches top_p (at least bin 0: rounding may leave the total a hair under
        # a top_p of nearly 1, and then every token stays).
        chosen = ((at_least >= target).sum(-1, keepdim=True) - 1).clamp(min=0)
        above = (at_least - mass).gather(1, chosen)
        prefix = chosen - 1024 if prefix is None else (prefix << width) | chosen
    # The threshold's key is a logit's own (the mass only changes at the logits' values): read it back.
    return torch.where(key >= prefix, logits, float("inf")).amin(dim=-1)


def filter_top_k_top_p(
    logits: torch.Tensor, top_k: list[int], top_p: list[float], min_p: list[float] | None = None
) -> torch.Tensor:
    """``logits`` ``[N, V]`` with -inf on every token outside its row's kept set (``logit_threshold``; lists
    of one setting per row, ``top_k`` 0 for no limit). Kept logits pass through unchanged."""
    params = [
        SamplingParams(top_k=k, top_p=p, min_p=m)
        for k, p, m in zip(top_k, top_p, min_p or [0.0] * len(top_k), strict=True)
    ]
    threshold = logit_threshold(logits, RowSettings.of(params, logits.shape[-1], logits.device))
    return logits if threshold is None else logits.masked_fill(logits < threshold[:, None], float("-inf"))


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


ACCEPT_STREAM = 1 << 40
"""Added to a position to make the counter of a seeded row's draft-acceptance number: a stream apart from the
token draws (counter: the drawn token's position), so no number serves twice in one request."""


def sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` ``[N, V]`` by inversion: the first token whose cumulative probability
    exceeds ``uniform[row]`` x the row's total. One-hot (greedy) rows always give their argmax. Returns int64
    ``[N]`` on ``probs``' device."""
    cumulative = probs.double().cumsum(dim=-1)
    threshold = (uniform * cumulative[:, -1])[:, None]
    return torch.searchsorted(cumulative, threshold, right=True).clamp_(max=probs.shape[-1] - 1).flatten()

