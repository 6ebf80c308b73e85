"""MoEfication's two pieces of math: split a dense FFN's neurons into equal experts, and train a router.

A SwiGLU FFN is a sum over its ``I`` intermediate neurons, ``y = sum_n a_n(x) * W_down[:, n]`` with
``a = silu(W_gate x) * (W_up x)``. Partition the neurons into ``E`` groups and the FFN is exactly the
sum of ``E`` smaller FFNs (the experts): running all of them gives back the dense output, running the
``k`` that matter most for a token approximates it with ``k / E`` of the FLOPs (Zhang et al. 2022).

- ``balanced_kmeans`` groups neurons that fire together (co-activation: cosine similarity of their
  activation magnitudes over real tokens) into ``E`` clusters of exactly ``I / E`` neurons each.
- ``expert_importance`` is what a router should predict: the norm of each expert's contribution to
  the FFN output, per token; ``train_router`` fits a linear router to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def balanced_assign(similarity: torch.Tensor, size: int) -> torch.Tensor:
    """Labels ``[n]`` with exactly ``size`` items per cluster: best (item, cluster) pairs first, greedily."""
    n, clusters = similarity.shape
    if n != size * clusters:
        raise ValueError(f"{n} items do not split into {clusters} clusters of {size}")
    labels, fill = [-1] * n, [0] * clusters
    assigned = 0
    for flat in torch.argsort(similarity.flatten(), descending=True).tolist():
        item, cluster = divmod(flat, clusters)
        if labels[item] < 0 and fill[cluster] < size:
            labels[item], fill[cluster] = cluster, fill[cluster] + 1
            assigned += 1
            if assigned == n:
                break
    return torch.tensor(labels)


def balanced_kmeans(
    features: torch.Tensor, num_clusters: int, iters: int = 25, seed: int = 0
) -> torch.Tensor:
    """Spherical k-means with equal cluster sizes:
    ``features`` ``[n, d]`` -> labels ``[n]`` in ``[0, num_clusters)``."""
    n = features.shape[0]
    if n % num_clusters:
        raise ValueError(f"{n} neurons do not split into {num_clusters} equal experts")
    points = F.normalize(features.float(), dim=1)
    generator = torch.Generator().manual_seed(seed)
    centroids = points[torch.randperm(n, generator=generator)[:num_clusters]]
    labels = torch.full((n,), -1)
    for _ in range(iters):
        new_labels = balanced_assign(points @ centroids.t(), n // num_clusters)
        if torch.equal(new_labels, labels):
            break
        labels = new_labels
        centroids = F.normalize(
            torch.stack([points[labels == c].mean(0) for c in range(num_clusters)]), dim=1
        )
    return labels


def neurons_by_expert(labels: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[E, I / E]`` int64: the neuron indices of each expert, ascending."""
    return torch.stack([torch.nonzero(labels == e).flatten() for e in range(num_experts)])


def expert_importance(
    activations: torch.Tensor, down_proj: torch.Tensor, neurons: torch.Tensor
) -> torch.Tensor:  # fmt: skip
    """``[T, E]``: ``|| W_down[:, n_e] a[:, n_e] ||`` for each token's activations ``a`` ``[T, I]``."""
    return torch.stack(
        [(activations[:, idx] @ down_proj[:, idx].t()).norm(dim=1) for idx in neurons], dim=1
    )  # fmt: skip


def train_router(
    inputs: torch.Tensor, importance: torch.Tensor, steps: int = 300, lr: float = 1e-2, seed: int = 0
) -> torch.Tensor:
    """A linear router ``[E, H]`` whose softmax matches each token's normalised expert importance.

    Trained full-batch with Adam on the cross-entropy between ``softmax(x W^T)`` and ``importance / sum``;
    only the ranking matters at inference (the top ``k`` logits choose the experts).
    """
    torch.manual_seed(seed)
    inputs = inputs.clone()  # a normal tensor even if collected under inference_mode: autograd records it
    target = importance / importance.sum(dim=1, keepdim=True).clone()
    weight = torch.zeros(importance.shape[1], inputs.shape[1], requires_grad=True)
    optimizer = torch.optim.Adam([weight], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad()
            loss = F.cross_entropy(inputs @ weight.t(), target)
            loss.backward()
            optimizer.step()
    return weight.detach()


def top_k_recall(scores: torch.Tensor, importance: torch.Tensor, k: int) -> float:
    """Share of each token's ``k`` most important experts that the ``k`` highest ``scores`` also pick."""
    chosen = F.one_hot(scores.topk(k, dim=1).indices, scores.shape[1]).sum(1)
    best = F.one_hot(importance.topk(k, dim=1).indices, scores.shape[1]).sum(1)
    return (chosen * best).sum().item() / best.sum().item()
