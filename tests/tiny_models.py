"""The tiny random Llama the engine-level tests load: written by ``transformers`` itself, so its folder is
what a Hugging Face checkpoint looks like (config.json + model.safetensors, no tokenizer)."""

from __future__ import annotations

from pathlib import Path

import torch

from solutions.model.config import ModelConfig
from solutions.model.llama import LlamaModel, fused_weight_sources

TINY_LLAMA = dict(
    vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=None,
)  # fmt: skip
"""2 layers, 4 query and 2 KV heads of dimension 16 (GQA 2:1), an odd vocabulary
(padded when sharded), no EOS."""


def write_tiny_llama(folder: Path, seed: int = 0, **changes: object) -> Path:
    """Random weights (``torch.manual_seed(seed)``) of ``TINY_LLAMA`` with ``changes``,
    saved into ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM  # seconds to import: only where a test needs it

    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(**(TINY_LLAMA | changes))).save_pretrained(folder)
    return folder


def random_llama(config: ModelConfig, dtype: torch.dtype, device: str | torch.device = "cpu") -> LlamaModel:
    """A ``LlamaModel`` of ``config`` from a random state dict with Hugging Face tensor names (so
    loading fuses Q/K/V and gate/up as it does for a checkpoint): norms near 1, matrices
    ``N(0, 1 / in_features)``, seed 0."""
    generator = torch.Generator().manual_seed(0)
    rows = {"q_proj": config.num_heads * config.head_dim, "k_proj": config.num_kv_heads * config.head_dim}
    rows |= {
        "v_proj": rows["k_proj"],
        "gate_proj": config.intermediate_size,
        "up_proj": config.intermediate_size,
    }
    with torch.device("meta"):
        shapes = {name: p.shape for name, p in LlamaModel(config).named_parameters()}
    state = {}
    for name, sources in fused_weight_sources(config).items():
        shape = shapes[name]
        for source in sources:
            if name.endswith("norm.weight"):
                state[source] = 1 + 0.1 * torch.randn(shape, generator=generator)
            else:  # a fused weight's sources are stacked by rows: each has its own share
                source_shape = (rows.get(source.split(".")[-2], shape[0]), shape[1])
                state[source] = torch.randn(source_shape, generator=generator) * shape[1] ** -0.5
    return LlamaModel.from_state_dict(config, state, device, dtype)
