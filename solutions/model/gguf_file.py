"""Reading a llama.cpp GGUF file: metadata, and tensors dequantized to float32 one at a time.

GGUF stores each quantized row as a run of fixed-size blocks of 32 weights:

    Q8_0  (34 bytes)  | d: f16 | q[0..31]: int8 |                     w = d * q
    Q4_1  (20 bytes)  | d: f16 | m: f16 | 16 bytes, two nibbles each |  w = d * q + m
    Q4_0  (18 bytes)  | d: f16 | 16 bytes, two nibbles each |          w = d * (q - 8)

In a 4-bit block, byte j holds weight j in its low nibble and weight j + 16 in its high nibble.
Dequantization here is a handful of whole-tensor torch ops, never a Python loop over blocks. Each
tensor's bytes are read from the file only when that tensor is asked for (``os.pread``, not the
reader's memory map), so a loader that converts tensors one by one holds one of them at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    import gguf

BLOCK = 32
_BLOCK_BYTES = {"Q8_0": 34, "Q4_1": 20, "Q4_0": 18}


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """All key/value fields of an open ``gguf.GGUFReader`` as plain Python values."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _f16(column: torch.Tensor) -> torch.Tensor:
    return column.contiguous().view(torch.float16).float()


def _as_bytes(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A flat uint8 tensor over ``raw``'s bytes, without copying them when it can."""
    if isinstance(raw, torch.Tensor):
        return raw.contiguous().view(torch.uint8).reshape(-1)
    array = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``[blocks, 16]`` bytes -> ``[blocks, 32]`` float codes:
    low nibbles are weights 0..15, high ones 16..31."""
    codes = torch.empty(packed.shape[0], 2 * packed.shape[1], dtype=torch.float32)
    codes[:, : packed.shape[1]] = packed & 0x0F
    codes[:, packed.shape[1] :] = packed >> 4
    return codes


def dequantize(raw: np.ndarray | torch.Tensor, type_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Dequantize one GGUF tensor's raw bytes (or an array viewing them) to float32 ``shape`` (torch order).

    Works in place where it can, so the float32 result is the only tensor of its size it allocates.
    """
    data = _as_bytes(raw)
    if type_name == "F32":
        return data.view(torch.float32).reshape(shape)
    if type_name in ("F16", "BF16"):
        return data.view(torch.float16 if type_name == "F16" else torch.bfloat16).float().reshape(shape)
    if type_name not in _BLOCK_BYTES:
        raise ValueError(
            f"GGUF tensor type {type_name} is not supported; supported: "
            f"F32, F16, BF16, {', '.join(_BLOCK_BYTES)}"
        )
    blocks = data.reshape(-1, _BLOCK_BYTES[type_name])
    d = _f16(blocks[:, 0:2])
    if type_name == "Q8_0":
        weights = blocks.view(torch.int8)[:, 2:].float().mul_(d)
    elif type_name == "Q4_1":
        weights = _unpack_nibbles(blocks[:, 4:]).mul_(d).add_(_f16(blocks[:, 2:4]))
    else:
        weights = _unpack_nibbles(blocks[:, 2:]).sub_(8.0).mul_(d)
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


ROPE_FREQS = "rope_freqs.weight"  # Llama-3's per-frequency RoPE divisors: configuration, not a weight


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face Llama parameter name for a GGUF tensor name (None: not a Llama weight)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor's raw bytes sit in the file, and how to read them."""

    name: str
    type_name: str
    shape: tuple[int, ...]  # torch order (GGUF lists dimensions innermost first)
    offset: int
    n_bytes: int


@dataclass
class GGUFCheckpoint:
    """An opened GGUF file: its metadata, every tensor's location, and readers in Hugging Face naming.

    ``readers[hf_name]()`` reads and dequantizes that one tensor (float32, HF layout) each time it
    is called; nothing is kept. ``rope_freq_factors`` holds ``rope_freqs.weight`` when the file has it.
    """

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]  # by GGUF name
    readers: dict[str, Callable[[], torch.Tensor]]
    rope_freq_factors: tuple[float, ...] | None

    @property
    def quantized(self) -> bool:
        """Whether any tensor is block-quantized (dequantizing it costs more than a cast)."""
        return any(info.type_name in _BLOCK_BYTES for info in self.tensors.values())


def read_tensor(path: Path, info: GGUFTensorInfo) -> torch.Tensor:
    """One tensor dequantized to float32, read with a positioned read (no memory map is touched)."""
    raw = bytearray(info.n_bytes)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = os.preadv(fd, [raw], info.offset)
    finally:
        os.close(fd)
    if got != info.n_bytes:
        raise ValueError(f"{path} is truncated: tensor {info.name} needs {info.n_bytes} bytes, got {got}")
    return dequantize(torch.frombuffer(raw, dtype=torch.uint8), info.type_name, info.shape)


def open_gguf(path: str | Path) -> GGUFCheckpoint:
    """Read metadata and tensor locations; raise naming any tensor this Llama loader does not understand."""
    import gguf

    path = Path(path)
    reader = gguf.GGUFReader(str(path))
    meta = read_metadata(reader)
    tensors = {
        t.name: GGUFTensorInfo(
            t.name,
            t.tensor_type.name,
            tuple(int(n) for n in reversed(t.shape.tolist())),
            int(t.data_offset),
            int(t.n_bytes),
        )
        for t in reader.tensors
    }
    del reader  # closes its memory map
    unknown = [name for name in tensors if name != ROPE_FREQS and hf_name(name) is None]
    if unknown:
        raise ValueError(
            f"{path.name} has tensors this Llama loader does not understand: {', '.join(unknown[:8])}"
            f"{' ...' if len(unknown) > 8 else ''} (architecture {meta.get('general.architecture')!r})"
        )
    arch = meta.get("general.architecture")
    heads = int(meta[f"{arch}.attention.head_count"])
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    readers = {
        hf_name(name): _reader(path, info, heads, kv_heads)
        for name, info in tensors.items()
        if name != ROPE_FREQS
    }
    factors = None
    if ROPE_FREQS in tensors:
        factors = tuple(float(f) for f in read_tensor(path, tensors[ROPE_FREQS]).tolist())
    return GGUFCheckpoint(path, meta, tensors, readers, factors)


def _reader(path: Path, info: GGUFTensorInfo, heads: int, kv_heads: int) -> Callable[[], torch.Tensor]:
    """A function that reads ``info``'s tensor in HF layout (Q/K rows back in rotate-half order)."""
    kind = info.name.split(".")[2] if info.name.startswith("blk.") else None
    rotary_heads = {"attn_q": heads, "attn_k": kv_heads}.get(kind)

    def read() -> torch.Tensor:
        weight = read_tensor(path, info)
        return weight if rotary_heads is None else unpermute_rotary_rows(weight, rotary_heads)

    return read
