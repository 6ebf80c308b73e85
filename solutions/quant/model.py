"""Swap a ``LlamaModel``'s linears for packed ``QuantLinear`` modules: round-to-nearest or AWQ.

AWQ's scales are folded into what produces each linear's input before quantizing, so the quantized
model runs exactly the modules an RTN one does::

    input_layernorm.weight / s_qkv          -> qkv_proj.weight * s_qkv       (columns)
    post_attention_layernorm.weight / s_gu  -> gate_up_proj.weight * s_gu
    up rows of gate_up_proj / s_down        -> down_proj.weight * s_down     (silu(gate) * up is linear in up)

The tied embedding / LM head is quantized once (clipped, never scaled) and both uses read it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from ..kernels.cpu_linear import use_fastest_linears
from ..model.llama import LlamaModel
from ..model.loader import load_weights
from .awq import clip_max_val, clip_ratios, load_awq_params
from .linear import QuantEmbedding, QuantLinear
from .rtn import check_quant_args

METHODS = ("rtn", "awq")


def layer_linears(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """``("layers.{i}.{qkv_proj|o_proj|gate_up_proj|down_proj}", module)`` for
    every decoder layer, in order."""
    for i, layer in enumerate(model.layers):
        yield f"layers.{i}.qkv_proj", layer.self_attn.qkv_proj
        yield f"layers.{i}.o_proj", layer.self_attn.o_proj
        yield f"layers.{i}.gate_up_proj", layer.mlp.gate_up_proj
        yield f"layers.{i}.down_proj", layer.mlp.down_proj


def _set(model: nn.Module, name: str, module: nn.Module) -> None:
    i, leaf = name.removeprefix("layers.").split(".")
    parent = (
        model.layers[int(i)].mlp if leaf in ("gate_up_proj", "down_proj") else model.layers[int(i)].self_attn
    )
    setattr(parent, leaf, module)


def apply_awq_scales(model: nn.Module, params: dict[str, torch.Tensor]) -> None:
    """Fold AWQ's per-channel scales into the float model in place;
    its outputs stay the same up to rounding."""
    for i, layer in enumerate(model.layers):
        s = params[f"layers.{i}.qkv_proj.scales"].to(layer.input_layernorm.weight)
        layer.input_layernorm.weight.div_(s)
        layer.self_attn.qkv_proj.weight.mul_(s)
        s = params[f"layers.{i}.gate_up_proj.scales"].to(layer.post_attention_layernorm.weight)
        layer.post_attention_layernorm.weight.div_(s)
        layer.mlp.gate_up_proj.weight.mul_(s)
        s = params[f"layers.{i}.down_proj.scales"].to(layer.mlp.down_proj.weight)
        layer.mlp.gate_up_proj.weight[s.numel() :].div_(s[:, None])
        layer.mlp.down_proj.weight.mul_(s)


def _max_val(weight: torch.Tensor, group_size: int, params: dict[str, torch.Tensor] | None, name: str):
    if params is None:
        return None
    ratio = clip_ratios().to(weight.device)[params[f"{name}.clip"].long().to(weight.device)]
    return clip_max_val(weight, group_size, ratio)


@torch.no_grad()
def quantize_model(
    model: nn.Module,
    method: str,
    w_bit: int,
    group_size: int,
    awq_params: dict[str, torch.Tensor] | None = None,
) -> nn.Module:
    """Replace every decoder linear and the LM head of ``model`` (in place) by
    ``QuantLinear``; returns ``model``.

    ``method`` "rtn" is plain round-to-nearest; "awq" needs ``awq_params`` (``quant.awq.load_awq_params``).
    A tied embedding then reads the quantized LM head; an untied one stays as it is.
    """
    if method not in METHODS:
        raise ValueError(f"quantization method must be one of {METHODS}, got {method!r}")
    if method == "awq" and awq_params is None:
        raise ValueError("AWQ needs its calibrated scales: pass awq_params (see quant.awq.load_awq_params)")
    params = awq_params if method == "awq" else None
    linears = [*layer_linears(model), ("lm_head", model.lm_head)]
    for name, module in linears:
        check_quant_args(module.in_features, w_bit, group_size, name)
    if params is not None:
        apply_awq_scales(model, params)
    for name, module in layer_linears(model):
        _set(
            model,
            name,
            QuantLinear.from_float(
                module.weight, w_bit, group_size, _max_val(module.weight, group_size, params, name)
            ),
        )
    tied = model.lm_head.weight is model.embed_tokens.weight
    head = model.lm_head.weight
    model.lm_head = QuantLinear.from_float(
        head, w_bit, group_size, _max_val(head, group_size, params, "lm_head")
    )
    if tied:
        model.embed_tokens = QuantEmbedding(model.lm_head)
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer the model holds, each tensor counted once (tied ones too).

    RoPE tables are plain attributes, not buffers, and are not counted: they are not weights.
    """
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def quantize_named_model(
    model: nn.Module, model_name: str, method: str, w_bit: int, group_size: int
) -> nn.Module:
    """``quantize_model``, reading AWQ's cached scales for ``model_name``
    (its weights file's stem) when needed."""
    if method not in METHODS:
        raise ValueError(f"quantization method must be one of {METHODS}, got {method!r}")
    params = load_awq_params(model_name, w_bit, group_size) if method == "awq" else None
    return quantize_model(model, method, w_bit, group_size, params)


def build_model(
    quantization: str | None = None, w_bit: int = 4, group_size: int = 64, model: str | None = None
) -> tuple[nn.Module, object]:
    """A float32 CPU ``LlamaModel`` of ``model`` (default: bundled), quantized as asked, its float linears on
    the CPU paths measured fastest; returns it and its tokenizer (``python -m solutions perplexity``)."""
    weights = load_weights(model)
    net = LlamaModel.from_state_dict(weights.config, weights.state_dict, "cpu", torch.float32)
    if quantization is not None:
        quantize_named_model(net, weights.source.stem, quantization, w_bit, group_size)
    use_fastest_linears(net)  # the float linears left (all of them unquantized) run the fastest CPU path
    return net, weights.tokenizer
