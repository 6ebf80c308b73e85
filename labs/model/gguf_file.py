"""Reading a llama.cpp GGUF file: metadata, and tensors dequantized to float32.

GGUF stores each quantized row as a run of fixed-size blocks of 32 weights:

    Q8_0  (34 bytes)  | d: f16 | q[0..31]: int8 |                     w = d * q
    Q4_1  (20 bytes)  | d: f16 | m: f16 | 16 bytes, two nibbles each |  w = d * q + m
    Q4_0  (18 bytes)  | d: f16 | 16 bytes, two nibbles each |          w = d * (q - 8)

In a 4-bit block, byte j holds weight j in its low nibble and weight j + 16 in its high nibble.
Dequantization here is a handful of whole-tensor torch ops, never a Python loop over blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

BLOCK = 32
_BLOCK_BYTES = {"Q8_0": 34, "Q4_1": 20, "Q4_0": 18}


def read_metadata(reader) -> dict[str, Any]:
    """All key/value fields of an open ``gguf.GGUFReader`` as plain Python values."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _f16(column: torch.Tensor) -> torch.Tensor:
    return column.contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.cat([packed & 0x0F, packed >> 4], dim=1).float()


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Dequantize one GGUF tensor's raw data to a float32 tensor of ``shape`` (torch order)."""
    if type_name == "F32":
        return torch.from_numpy(np.array(raw, dtype=np.float32)).reshape(shape)
    if type_name in ("F16", "BF16"):
        dtype = torch.float16 if type_name == "F16" else torch.bfloat16
        data = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).copy())
        return data.view(dtype).float().reshape(shape)
    if type_name not in _BLOCK_BYTES:
        raise ValueError(
            f"GGUF tensor type {type_name} is not supported; supported: F32, F16, BF16, {', '.join(_BLOCK_BYTES)}"
        )
    blocks = torch.from_numpy(np.array(raw, copy=True)).reshape(-1, _BLOCK_BYTES[type_name])
    d = _f16(blocks[:, 0:2])
    if type_name == "Q8_0":
        weights = blocks[:, 2:].contiguous().view(torch.int8).float() * d
    elif type_name == "Q4_1":
        weights = _nibbles(blocks[:, 4:]) * d + _f16(blocks[:, 2:4])
    else:
        weights = (_nibbles(blocks[:, 2:]) - 8.0) * d
    return weights.reshape(shape)


def unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter, which reorders Q/K rows for its interleaved rotary layout.

    llama.cpp stores, per head, rows (0, d/2, 1, d/2+1, ...) so that rotary pairs sit side by
    side; Hugging Face's rotate-half convention wants the two halves apart again.
    """
    rows = weight.shape[0]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face Llama parameter name for a GGUF tensor name (None: not a weight we use)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def read_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Metadata and a float32 state dict in Hugging Face Llama naming and layout."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = read_metadata(reader)
    arch = meta.get("general.architecture")
    heads = int(meta[f"{arch}.attention.head_count"])
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        weight = dequantize(tensor.data, tensor.tensor_type.name, shape)
        if name.endswith("q_proj.weight"):
            weight = unpermute_rotary_rows(weight, heads)
        elif name.endswith("k_proj.weight"):
            weight = unpermute_rotary_rows(weight, kv_heads)
        state[name] = weight
    return meta, state
