"""Named Llama shapes and random-weight checkpoints of them, to time the engine without downloading a model.

A decode step's cost depends on the weights' shapes and dtype, not their values, so a checkpoint of random
bfloat16 weights times like the trained one. ``write_random_checkpoint`` draws each tensor on the given device
(``torch.randn``, scaled) and streams it straight into one safetensors file beside a ``config.json``: a
Hugging Face folder that both this engine and ``transformers`` load.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..model.loader import load_weights, write_safetensors_streaming

INIT_STD = 0.02  # Hugging Face's initializer_range for Llama: activations stay in range through every layer
LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a Llama config.json that set a step's cost; ``source`` says where they come from."""

    name: str
    source: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict | None = None
    bos_token_id: int = 1
    eos_token_id: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def hf_config(self) -> dict:
        """A Hugging Face ``LlamaForCausalLM`` config.json for this shape, bfloat16 weights."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": "bfloat16",
        }

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight of the checkpoint, Hugging Face Llama names, in the order they are written."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h)}
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (self.num_heads * self.head_dim, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, self.num_heads * self.head_dim),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (self.intermediate_size, h),
                p + "mlp.up_proj.weight": (self.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, self.intermediate_size),
            }
        shapes["model.norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        return shapes

    def weight_bytes(self) -> int:
        """Bytes of the bfloat16 checkpoint (a tied head counted once)."""
        return 2 * sum(torch.Size(s).numel() for s in self.tensor_shapes().values())


LLAMA3 = (128000, 128001)  # bos, eos token ids
SMOLLM2 = "HuggingFaceTB/SmolLM2-{} config.json"
SHAPES = {shape.name: shape for shape in (
    # name, source; hidden, layers, heads, KV heads, intermediate, vocab, tied head, RoPE theta, max positions
    ModelShape("tiny", "a toy shape for CPU tests", 64, 2, 4, 2, 128, 512, True, 1e4, 1024),
    ModelShape("smollm2-135m", SMOLLM2.format("135M") + " (the bundled model's shape)",
               576, 30, 9, 3, 1536, 49152, True, 1e5, 8192),
    ModelShape("smollm2-1.7b", SMOLLM2.format("1.7B"), 2048, 24, 32, 32, 8192, 49152, True, 1.3e5, 8192),
    ModelShape("llama-3.2-1b", "meta-llama/Llama-3.2-1B config.json", 2048, 16, 32, 8, 8192, 128256, True,
               5e5, 131072, {**LLAMA3_ROPE_SCALING, "factor": 32.0}, *LLAMA3),
    ModelShape("llama-3.1-8b", "meta-llama/Llama-3.1-8B config.json", 4096, 32, 32, 8, 14336, 128256, False,
               5e5, 131072, {**LLAMA3_ROPE_SCALING, "factor": 8.0}, *LLAMA3),
)}  # fmt: skip


def write_random_checkpoint(shape: ModelShape, folder: Path, device: str = "cpu", seed: int = 0) -> Path:
    """A Hugging Face folder (config.json + model.safetensors, bfloat16) of random weights of ``shape``:
    norms 1, every matrix ``N(0, INIT_STD**2)`` drawn on ``device`` (on a GPU, as fast as the disk writes)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    shapes = shape.tensor_shapes()
    tensors = (
        torch.ones(size, dtype=torch.bfloat16, device=device)
        if name.endswith("norm.weight")
        else torch.randn(size, generator=generator, device=device, dtype=torch.bfloat16).mul_(INIT_STD)
        for name, size in shapes.items()
    )
    return _write_folder(folder, shape.hf_config(), shapes, tensors)


def write_bundled_checkpoint(folder: Path) -> tuple[Path, ModelShape]:
    """The bundled SmolLM2-135M-Instruct (its GGUF dequantized, then bfloat16) as a Hugging Face folder, so
    ``transformers`` loads it without the ``gguf`` package. FileNotFoundError when it is not installed."""
    weights = load_weights(None, load_tokenizer=False)
    c = weights.config
    if c.rope_scaling is not None or c.num_local_experts:
        raise ValueError("the bundled model was expected to be a dense Llama without RoPE scaling")
    shape = ModelShape(
        "bundled", f"the bundled {weights.source.name}", c.hidden_size, c.num_layers, c.num_heads,
        c.num_kv_heads, c.intermediate_size, c.vocab_size, c.tie_word_embeddings, c.rope_theta,
        c.max_position_embeddings, None, c.bos_token_id, c.eos_token_id,
    )  # fmt: skip
    shapes = shape.tensor_shapes()
    tensors = (weights.state_dict[name].to(torch.bfloat16) for name in shapes)
    config = shape.hf_config() | {"rms_norm_eps": c.rms_norm_eps}
    return _write_folder(folder, config, shapes, tensors), shape


def _write_folder(
    folder: Path, config: dict, shapes: dict[str, tuple[int, ...]], tensors: Iterator[torch.Tensor]
) -> Path:
    """``config.json`` and a bfloat16 ``model.safetensors``, the ``tensors`` streamed in ``shapes``' order."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    write_safetensors_streaming(folder / "model.safetensors", shapes, tensors, torch.bfloat16)
    return folder
