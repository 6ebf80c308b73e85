"""Perplexity of a model on a text: how the course scores what quantization costs.

``exp(mean negative log-likelihood)`` of every token after the first in each window. The text is cut
into non-overlapping windows of ``window`` tokens, each scored from scratch, so every quantization
setting sees the same contexts; longer windows give lower perplexities, so compare within one setting.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..model.llama import LlamaModel


@torch.inference_mode()
def perplexity(model: LlamaModel, token_ids: torch.Tensor, window: int = 512) -> float:
    """Perplexity of ``model`` (anything with ``sequence_logits``) on ``token_ids`` ``[L]``, ``L >= 2``."""
    if token_ids.dim() != 1 or len(token_ids) < 2:
        raise ValueError(f"token_ids must be 1-D with at least 2 tokens, got shape {tuple(token_ids.shape)}")
    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    nll, count = 0.0, 0
    for start in range(0, len(token_ids) - 1, window):
        chunk = token_ids[start : start + window]
        if len(chunk) < 2:
            break
        logits = model.sequence_logits(chunk)[:-1]
        nll += F.cross_entropy(logits.float(), chunk[1:], reduction="sum").item()
        count += len(chunk) - 1
    return math.exp(nll / count)
