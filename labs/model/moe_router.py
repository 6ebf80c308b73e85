# Generated from solutions/model/moe_router.py by tools/make_labs.py: fill in each NotImplementedError.
"""The top-k softmax router, the Switch Transformer load-balancing loss, and the capacity factor.

A router scores every token against every expert (``logits = x @ W_router^T``, ``[T, E]``); each token
then runs through the ``k`` experts with the highest probability, and their outputs are mixed with
those probabilities renormalised over the chosen ``k`` (Mixtral's rule)::

    probs   = softmax(logits)                      [T, E]   (float32)
    weights, experts = top_k(probs, k)             [T, k]
    weights = weights / weights.sum(-1)            each row sums to 1

Training alone would collapse onto a few favourite experts; the Switch Transformer adds
``alpha * E * sum_i f_i * P_i`` where ``f_i`` is the fraction of routed assignments that went to
expert ``i`` and ``P_i`` the mean router probability of expert ``i``. It is ``alpha`` when routing is
uniform and grows to ``alpha * E`` when one expert takes everything; only ``P`` carries a gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Routing:
    """Which experts each token runs through and with what weight.

    Invariants: ``experts`` ``[T, k]`` int64 in ``[0, E)``, distinct along each row, ordered by
    descending probability; ``weights`` ``[T, k]`` float32; ``probs`` ``[T, E]`` float32, rows sum to 1.
    """

    weights: torch.Tensor
    experts: torch.Tensor
    probs: torch.Tensor


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool = True) -> Routing:
    """Top-``k`` softmax routing of ``router_logits`` ``[T, E]``;
    ``renormalize`` makes each token's weights sum to 1."""
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [tokens, experts], got shape {tuple(router_logits.shape)}")
    if not 1 <= top_k <= router_logits.shape[1]:
        raise ValueError(
            f"top_k must be in [1, {router_logits.shape[1]}] (the number of experts), got {top_k}"
        )
    raise NotImplementedError('Lab 5: softmax in float32 over experts, take the top_k probabilities, divide by their sum if renormalize (hints: make hint LAB=5)')


def load_balancing_loss(routing: Routing, alpha: float = 0.01) -> torch.Tensor:
    """Switch Transformer auxiliary loss ``alpha * E * sum_i f_i * P_i``
    (a scalar, differentiable through ``P``).

    ``f_i``: share of the ``T * k`` assignments that picked expert ``i`` (counts, no gradient);
    ``P_i``: mean over tokens of ``probs[:, i]``. Both sum to 1 over experts.
    """
    raise NotImplementedError('Lab 5: f = bincount of the chosen experts / (T * k); P = probs averaged over tokens; alpha * E * sum(f * P) (hints: make hint LAB=5)')


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ``ceil(capacity_factor * T * k / E)``; 1.0 means exactly a fair share each."""
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor}")
    return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


def capacity_mask(experts: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Boolean ``[T, k]``: True where an assignment fits in its expert's ``capacity`` slots.

    Experts fill first choices before second choices (all tokens' slot 0, then slot 1, ...), and in
    token order within a slot, as GShard does; an assignment past its expert's capacity is dropped
    (the token skips that expert: its residual connection carries it on).
    """
    choice_major = experts.t().flatten()  # [k * T]: every token's first choice, then every second choice
    one_hot = torch.nn.functional.one_hot(choice_major, num_experts)
    position_in_expert = (one_hot.cumsum(dim=0) * one_hot).sum(dim=1) - 1
    return (position_in_expert < capacity).view(experts.shape[1], experts.shape[0]).t()
