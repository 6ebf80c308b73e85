"""Hugging Face ``transformers``, the peer the engine's speed is compared with: the same weights loaded
quietly, and ``generate`` run for exactly the number of greedy tokens asked for (EOS ignored).

``transformers`` takes seconds to import, so only a run that compares with it imports it (here, inside the
functions)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..model.loader import bundled_model_path

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def load_hf_model(
    folder: Path | None = None, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> PreTrainedModel:
    """A checkpoint ``folder`` (default: the bundled GGUF) as a ``transformers`` causal LM in eval mode,
    without its loading messages or progress bars."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    if folder is None:
        path = bundled_model_path()
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.to(device).eval()


def left_padded(
    prompts: list[list[int]], pad_id: int = 0, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded static batch as ``generate`` takes it: ``ids`` ``[B, longest]`` with each prompt right-aligned
    after ``pad_id``s, and the ``mask`` that is 1 on the prompts' own tokens."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return ids, mask


def hf_generate(
    model: PreTrainedModel,
    ids: torch.Tensor,
    new_tokens: int,
    mask: torch.Tensor | None = None,
    pad_token_id: int = 0,
) -> torch.Tensor:
    """Exactly ``new_tokens`` greedy tokens after each row of ``ids`` ``[B, L]`` (left-padded where ``mask``
    is 0); returns the rows with them appended."""
    with torch.inference_mode():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids) if mask is None else mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad_token_id,
        )
