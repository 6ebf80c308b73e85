# Generated from solutions/speculative/rejection.py by tools/make_labs.py: fill in each NotImplementedError.
"""Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023), batched over requests and positions.

A drafter proposes tokens ``x_1..x_k`` with probabilities ``q_i``; the target scores all of them in one
pass and gives ``p_i`` at each of the ``k + 1`` positions. Walking left to right, draft ``x_i`` is kept
with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection the next token is drawn from
the residual ``norm(max(0, p_i - q_i))`` and the rest is discarded; if every draft is kept, a bonus token
comes from ``p_{k+1}``. Every emitted token is then distributed exactly as the target alone would have
sampled it, whatever ``q`` was (the drafter only changes how many tokens one pass yields).

Greedy decoding is the temperature-0 case: ``p`` is one-hot at the target's argmax, so a draft is kept
iff it equals the argmax, and the residual of a rejected one is that argmax again.
A drafter that proposes deterministically (n-gram lookup, a greedy EAGLE head) has ``q`` one-hot at its
draft: pass ``draft_probs=None``; a draft is then kept with probability ``p(x)``.

Everything stays on the probabilities' device: the random numbers come in as tensors (or are drawn there from
the generators), the next token is drawn by inversion (``kernels.sampling.sample``), and nothing is read back:
the caller reads the two results once.
"""

from __future__ import annotations

import torch

from ..kernels.sampling import sample, sampling_probs
from ..sampling_params import SamplingParams


def target_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """The distribution the plain sampler draws from, for each row of ``logits`` ``[N, V]`` (float32).

    Temperature 0 gives one-hot rows at the argmax; otherwise softmax of the top-k / top-p filtered
    ``logits / T``: the engine sampler's own ``sampling_probs``.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)  # validates them
    return sampling_probs(logits, [params] * logits.shape[0])


def verify(
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    num_drafts: torch.Tensor | None = None,
    generators: torch.Generator | list[torch.Generator | None] | None = None,
    uniforms: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a run of drafts per request and draw the token that follows it.

    ``draft_token_ids`` ``[B, K]`` (long); ``target_probs`` ``[B, K + 1, V]``: row ``i`` is the target's
    distribution for the token at draft position ``i`` (row ``K``: after the last draft);
    ``draft_probs`` ``[B, K, V]`` the drafter's ``q`` (None: deterministic drafts, ``q`` one-hot);
    ``num_drafts`` ``[B]``: request ``b`` drafted only its first ``num_drafts[b]`` tokens (default ``K``);
    ``uniforms``: the random numbers, float64 on the device: ``[B, K]`` to accept draft ``i`` with, and
    ``[B, K + 1]`` to draw the next token with when the run ends at position ``i``; without them they come
    from ``generators`` (one for all rows, or one per request; None: torch's global generator).

    Returns ``num_accepted`` ``[B]`` and ``next_token`` ``[B]`` (int64, on ``target_probs``' device): request
    ``b`` emits ``draft_token_ids[b, :num_accepted[b]]`` and then ``next_token[b]``.
    """
    batch, k = draft_token_ids.shape
    if target_probs.shape[:2] != (batch, k + 1):
        raise ValueError(
            f"target_probs must be [B, K + 1, V] = [{batch}, {k + 1}, V], got {tuple(target_probs.shape)}"
        )
    if draft_probs is not None and draft_probs.shape != (batch, k, target_probs.shape[2]):
        raise ValueError(
            f"draft_probs must be [B, K, V] = {(batch, k, target_probs.shape[2])}, "
            f"got {tuple(draft_probs.shape)}"
        )
    device = target_probs.device
    if num_drafts is None:
        num_drafts = torch.full((batch,), k, dtype=torch.long, device=device)
    if uniforms is None:
        uniforms = _uniforms_from(generators, batch, k, device)
    accept_uniform, draw_uniform = uniforms
    if accept_uniform.shape != (batch, k) or draw_uniform.shape != (batch, k + 1):
        raise ValueError(
            f"uniforms must be [B, K] and [B, K + 1] = {(batch, k)} and {(batch, k + 1)}, "
            f"got {tuple(accept_uniform.shape)} and {tuple(draw_uniform.shape)}"
        )
    if k == 0:
        return torch.zeros(batch, dtype=torch.long, device=device), sample(
            target_probs[:, 0], draw_uniform[:, 0]
        )
    uniforms = accept_uniform
    valid = torch.arange(k, device=device)[None, :] < num_drafts.to(device)[:, None]  # [B, K]
    drafts = draft_token_ids.to(device).clamp(min=0)  # padding ids (-1) only sit at invalid positions
    raise NotImplementedError('Lab 4: keep draft i when u_i * q_i(x_i) < p_i(x_i) (q = 1 for deterministic drafts); the run ends at the first rejection (or the last valid draft); the next token comes from norm(max(0, p - q)) at that position, or from p itself after the last draft (hints: make hint LAB=4)')
    next_token = sample(residual, draw_uniform.gather(1, num_accepted[:, None]).squeeze(1))
    return num_accepted, next_token


def _uniforms_from(
    generators: torch.Generator | list[torch.Generator | None] | None,
    batch: int,
    k: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``verify``'s random numbers drawn from host generators (one per request, or one for all): each
    request's ``K`` acceptance numbers, then its ``K + 1`` draw numbers."""
    if not isinstance(generators, list):
        generators = [generators] * batch
    if len(generators) != batch:
        raise ValueError(f"got {len(generators)} generators for {batch} requests")
    numbers = torch.stack([torch.rand(2 * k + 1, dtype=torch.float64, generator=g) for g in generators])
    numbers = numbers.to(device)
    return numbers[:, :k], numbers[:, k:]
