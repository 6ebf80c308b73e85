"""The tiny random Llama the engine-level tests load: written by ``transformers`` itself, so its folder is what a
Hugging Face checkpoint looks like (config.json + model.safetensors, no tokenizer)."""

from __future__ import annotations

from pathlib import Path

import torch

TINY_LLAMA = dict(
    vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=None,
)  # fmt: skip
"""2 layers, 4 query and 2 KV heads of dimension 16 (GQA 2:1), an odd vocabulary (padded when sharded), no EOS."""


def write_tiny_llama(folder: Path, seed: int = 0, **changes: object) -> Path:
    """Random weights (``torch.manual_seed(seed)``) of ``TINY_LLAMA`` with ``changes``, saved into ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM  # seconds to import: only where a test needs it

    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**(TINY_LLAMA | changes))).save_pretrained(folder)
    return folder
