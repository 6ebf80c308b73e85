"""AWQ over a whole model: capture every linear's calibration inputs in one float pass, then run ``awq.py``'s
scale and clip searches linear by linear, as a ``Recipe`` says. The result is the file
``LLM(quantization="awq")`` reads (``awq.load_awq_params``); ``python -m solutions calibrate-awq`` writes it.

The scaled pairs (what produces a linear's input -> the linear whose input channels are scaled)::

    qkv      input_layernorm            -> qkv_proj
    gate_up  post_attention_layernorm   -> gate_up_proj
    down     up rows of gate_up_proj    -> down_proj

v_proj -> o_proj is never scaled: under grouped-query attention (SmolLM2: v_proj 192 outputs, o_proj 576
inputs) each V channel feeds three o_proj input channels, so a free per-channel scale of o_proj cannot be
folded into V; AutoAWQ and llm-compressor skip the pair when the shapes differ, as here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..kernels.attention import gqa_attention
from ..model.llama import LlamaModel, apply_rope
from .awq import DATA_DIR, search_clip, search_scale
from .model import layer_linears

CALIBRATION_TEXT: Path = DATA_DIR / "text" / "awq_calibration_mix.txt"
SCALED_PAIRS = ("qkv", "gate_up", "down")
CLIP_MODES = ("all", "no_qk", "none")


@dataclass(frozen=True)
class Recipe:
    """What ``search_params`` searches.

    ``pairs``: the scaled pairs (a subset of ``SCALED_PAIRS``). ``duo_scaling``: AutoAWQ's
    ``s = mean|x|**a / mean|w|**(1 - a)`` (``mean|w|`` of each input channel after dividing every group by its
    largest ``|w|``) instead of ``s = mean|x|**a``. ``clip``: which decoder linears get a clip search ("all";
    "no_qk": all but the q and k rows of ``qkv_proj``, whose error reaches the output through a softmax that
    an output MSE does not see, as AutoAWQ; "none"). ``clip_lm_head``: search the tied LM head's clip too
    (the clip then also applies to the embedding lookups). ``clip_tokens``: at most this many calibration
    tokens, evenly spaced, for the clip searches (llm-awq uses 512).

    The defaults are the recipe the ablation supports (``data/awq/README.md``, which says whether the shipped
    files use it yet): every pair scaled, no clipping in the decoder layers, the LM head clipped.
    """

    pairs: tuple[str, ...] = SCALED_PAIRS
    duo_scaling: bool = False
    clip: str = "none"
    clip_lm_head: bool = True
    clip_tokens: int = 1024

    def __post_init__(self):
        unknown = set(self.pairs) - set(SCALED_PAIRS)
        if unknown:
            raise ValueError(f"unknown scaled pair {sorted(unknown)}: choose from {SCALED_PAIRS}")
        if self.clip not in CLIP_MODES:
            raise ValueError(f"clip must be one of {CLIP_MODES}, got {self.clip!r}")
        if self.clip_tokens < 1:
            raise ValueError(f"clip_tokens must be at least 1, got {self.clip_tokens}")


def calibration_ids(tokenizer, paths: list[Path], tokens: int) -> torch.Tensor:
    """The first ``tokens // len(paths)`` tokens of each text (``tokenizer.encode``), in order; a text shorter
    than its share is a ValueError naming it."""
    if not paths:
        raise ValueError("calibration needs at least one text")
    share, ids = tokens // len(paths), []
    for path in paths:
        text_ids = tokenizer.encode(Path(path).read_text())[:share]
        if len(text_ids) < share:
            raise ValueError(f"{path} has only {len(text_ids)} tokens, {share} asked for")
        ids += text_ids
    return torch.tensor(ids)


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
def capture_inputs(
    model: LlamaModel, calibration_ids: torch.Tensor, window: int = 512
) -> dict[str, torch.Tensor]:
    """The float input ``[T, K]`` of every decoder linear and of the LM head over ``calibration_ids``, cut
    into whole windows of ``window`` tokens (each scored from position 0), ``T`` a multiple of ``window``."""
    if len(calibration_ids) < window:
        raise ValueError(
            f"calibration needs at least one window of {window} tokens, got {len(calibration_ids)}"
        )
    calibration_ids = calibration_ids[: len(calibration_ids) // window * window]  # whole windows only
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
    return {name: torch.cat(chunks) for name, chunks in captured.items()}


def _duo_scale_search(weight, x, w_bit, group_size, block):
    """``s = mean|x|**a / mean|w|**(1 - a)`` through ``search_scale``: with ``w' = w / m`` and ``x' = x * m``
    (``m`` = normalised mean|w| per input channel; ``x' w'^T = x w^T``), ``search_scale``'s
    ``s' = mean|x'|**a`` gives ``w' s' = w (mean|x|**a m**(a - 1))``, the duo-scaled weight."""
    n, k = weight.shape
    grouped = weight.abs().view(n, k // group_size, group_size)
    m = (grouped / grouped.amax(-1, keepdim=True).clamp(min=1e-8)).view(n, k).mean(0).clamp(min=1e-4)
    scales = search_scale(weight / m, x * m, w_bit, group_size, block=block).scales / m
    return scales / (scales.max() * scales.min()).sqrt()


@torch.inference_mode()
def search_params(
    model: LlamaModel,
    inputs: dict[str, torch.Tensor],
    w_bit: int,
    group_size: int,
    window: int = 512,
    recipe: Recipe = Recipe(),
    cache: dict | None = None,
) -> dict[str, torch.Tensor]:
    """AWQ scales and clip indices for every linear of ``model`` from its captured float ``inputs``
    (``capture_inputs`` with the same ``window``), as ``recipe`` says. The model is left unchanged.

    Inputs are captured once: scaling preserves each layer's function, so the float model's activations,
    divided by the scales, are the scaled model's activations. ``cache``, if given, keeps each linear's
    searched scales and clips between calls on the same ``inputs``, ``w_bit`` and ``group_size`` (an ablation
    reuses what recipes share).
    """
    cache = {} if cache is None else cache
    positions = torch.arange(len(inputs["lm_head"])) % window
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]
    blocks = {}
    for i, layer in enumerate(model.layers):
        blocks[f"layers.{i}.qkv_proj"] = _attention_block(layer.self_attn, cos, sin, window)
        blocks[f"layers.{i}.gate_up_proj"] = _mlp_block(layer.mlp)
    attn = model.layers[0].self_attn
    qk_rows = (attn.num_heads + attn.num_kv_heads) * attn.head_dim
    clip_stride = max(1, len(inputs["lm_head"]) // recipe.clip_tokens)

    params: dict[str, torch.Tensor] = {}
    for name, module in tqdm(list(layer_linears(model)), desc="searching scales and clips", unit="linear"):
        weight, x = module.weight, inputs[name]
        pair = name.rsplit(".", 1)[1].removesuffix("_proj")
        scale_key = (name, "scales", recipe.duo_scaling) if pair in recipe.pairs else None
        if scale_key is not None:
            if scale_key not in cache:
                search = _duo_scale_search if recipe.duo_scaling else _plain_scale_search
                cache[scale_key] = search(weight, x, w_bit, group_size, blocks.get(name)).half()
            params[f"{name}.scales"] = cache[scale_key]
            weight, x = weight * cache[scale_key].float(), x / cache[scale_key].float()
        elif pair in SCALED_PAIRS:
            params[f"{name}.scales"] = torch.ones(weight.shape[1], dtype=torch.float16)
        clip_key = (name, "clip", scale_key, recipe.clip, recipe.clip_tokens)
        if clip_key not in cache:
            cache[clip_key] = _clip(weight, x[::clip_stride], w_bit, group_size, recipe.clip, pair, qk_rows)
        params[f"{name}.clip"] = cache[clip_key]
    head_key = ("lm_head", "clip", recipe.clip_lm_head, recipe.clip_tokens)
    if head_key not in cache:
        head = model.lm_head.weight
        cache[head_key] = (
            search_clip(head, inputs["lm_head"][::clip_stride], w_bit, group_size)
            if recipe.clip_lm_head
            else torch.zeros(head.shape[0], dtype=torch.uint8)
        )
    params["lm_head.clip"] = cache[head_key]
    return params


def _plain_scale_search(weight, x, w_bit, group_size, block):
    return search_scale(weight, x, w_bit, group_size, block=block).scales


def _clip(weight, x, w_bit, group_size, mode, pair, qk_rows):
    """Clip indices ``[N]``: searched on the rows ``mode`` clips, 0 (no clipping) on the others."""
    index = torch.zeros(weight.shape[0], dtype=torch.uint8)
    if mode == "none":
        return index
    first = qk_rows if mode == "no_qk" and pair == "qkv" else 0
    index[first:] = search_clip(weight[first:], x, w_bit, group_size)
    return index


def calibrate(
    model: LlamaModel,
    calibration_ids: torch.Tensor,
    w_bit: int,
    group_size: int,
    window: int = 512,
    recipe: Recipe = Recipe(),
) -> dict[str, torch.Tensor]:
    """AWQ scales and clip indices for every linear of ``model``, from one float pass over
    ``calibration_ids`` in windows of ``window`` tokens, searched as ``recipe`` says."""
    return search_params(
        model, capture_inputs(model, calibration_ids, window), w_bit, group_size, window, recipe
    )
