"""AWQ over a whole model: capture every linear's calibration inputs in one float pass, then run ``awq.py``'s
scale and clip searches linear by linear. The result is the file ``LLM(quantization="awq")`` reads
(``awq.load_awq_params``); ``python -m solutions calibrate-awq`` writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from ..kernels.attention import gqa_attention
from ..model.llama import LlamaModel, apply_rope
from .awq import DATA_DIR, search_clip, search_scale
from .model import layer_linears

CALIBRATION_TEXT: Path = DATA_DIR / "text" / "kjv_genesis_1-15.txt"


def _attention_block(
    attn, cos: torch.Tensor, sin: torch.Tensor, window: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """qkv_proj's output -> o_proj's output (float o_proj), causal within each calibration window."""
    rotated = attn.num_heads + attn.num_kv_heads

    def block(qkv: torch.Tensor) -> torch.Tensor:
        tokens = qkv.shape[0]
        qkv = qkv.view(tokens, rotated + attn.num_kv_heads, attn.head_dim)
        q, k = apply_rope(qkv[:, :rotated], cos, sin).split([attn.num_heads, attn.num_kv_heads], dim=1)
        heads_first = lambda t: t.reshape(-1, window, t.shape[1], attn.head_dim).transpose(1, 2)
        out = gqa_attention(heads_first(q), heads_first(k), heads_first(qkv[:, rotated:]), causal=True)
        return out.transpose(1, 2).reshape(tokens, -1) @ attn.o_proj.weight.T

    return block


def _mlp_block(mlp) -> Callable[[torch.Tensor], torch.Tensor]:
    """gate_up's output -> the MLP's output, with the float down projection."""

    def block(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up @ mlp.down_proj.weight.T

    return block


@torch.inference_mode()
def calibrate(
    model: LlamaModel, calibration_ids: torch.Tensor, w_bit: int, group_size: int, window: int = 512
) -> dict[str, torch.Tensor]:
    """AWQ scales and clip indices for every linear of ``model``,
    from one float pass over ``calibration_ids``.

    The model is left unchanged. Inputs are captured once: scaling preserves each layer's function,
    so the float model's activations, divided by the scales, are the scaled model's activations.
    """
    calibration_ids = calibration_ids[: len(calibration_ids) // window * window]  # whole windows only
    positions = torch.arange(len(calibration_ids)) % window
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]
    captured: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, module in [*layer_linears(model), ("lm_head", model.lm_head)]:
        captured[name] = []
        hooks.append(
            module.register_forward_hook(lambda m, args, out, name=name: captured[name].append(args[0]))
        )
    try:
        for start in tqdm(
            range(0, len(calibration_ids), window), desc="capturing activations", unit="window"
        ):
            model.sequence_logits(calibration_ids[start : start + window])
    finally:
        for hook in hooks:
            hook.remove()
    inputs = {name: torch.cat(chunks) for name, chunks in captured.items()}

    params: dict[str, torch.Tensor] = {}
    # The scale each linear's input gets: qkv and gate_up read a norm's output, down_proj reads up's.
    scaled = [n for n, _ in layer_linears(model) if not n.endswith("o_proj")]
    blocks = {}
    for i, layer in enumerate(model.layers):
        blocks[f"layers.{i}.qkv_proj"] = _attention_block(layer.self_attn, cos, sin, window)
        blocks[f"layers.{i}.gate_up_proj"] = _mlp_block(layer.mlp)
    for name, module in tqdm(list(layer_linears(model)), desc="searching scales and clips", unit="linear"):
        weight, x = module.weight, inputs[name]
        if name in scaled:
            scales = search_scale(weight, x, w_bit, group_size, block=blocks.get(name)).scales
            params[f"{name}.scales"] = scales.half()
            weight, x = weight * scales, x / scales
        params[f"{name}.clip"] = search_clip(weight, x, w_bit, group_size)
    # The LM head is 49152 outputs wide: a quarter of the tokens is plenty for one clip ratio per output.
    params["lm_head.clip"] = search_clip(model.lm_head.weight, inputs["lm_head"][::4], w_bit, group_size)
    return params
