"""AWQ (Lin et al., MLSys 2024): scale the input channels that activations say matter, then clip.

A linear ``y = x W^T`` is unchanged if input channel ``j`` of ``W`` is multiplied by ``s_j`` and of
``x`` divided by it. Quantizing ``W diag(s)`` instead of ``W`` gives channels with large activations
(large ``s_j``) finer steps relative to their weights, at the cost of coarser steps elsewhere in the
group. AWQ sets ``s = mean|x|^alpha``, searches ``alpha`` on a grid by the output error on
calibration activations, and folds ``1/s`` into whatever produced ``x`` (an RMSNorm weight, or the
rows of the previous linear), so inference pays nothing for it. Then a clipping search shrinks each
output channel's range where that lowers the output error further.

As in llm-awq, the error for ``qkv_proj`` is measured on the attention block's output and for
``gate_up_proj`` on the MLP's. Differences from it, on purpose: the clip ratio is chosen per output channel
(llm-awq: per group), which keeps the cached file small. ``o_proj`` gets no scale: with grouped-query
attention its input channels come from shared V heads, so a free per-channel scale cannot be folded
into V (llm-awq skips it too). The tied LM head gets no scale either, since folding one would change
the embedding lookups; it is clipped.

``python -m solutions.quant.awq`` calibrates the bundled model and writes the file that
``LLM(quantization="awq")`` reads.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .rtn import check_quant_args, fake_quantize

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
CALIBRATION_TEXT = DATA_DIR / "text" / "kjv_genesis_1-15.txt"
CLIP_GRID, CLIP_MAX_SHRINK = 20, 0.5


@dataclass
class ScaleSearch:
    """The chosen per-input-channel ``scales`` ``[K]`` and ``alpha``; ``errors[i]`` is the output MSE at ``alphas[i]``."""

    scales: torch.Tensor
    alpha: float
    alphas: list[float]
    errors: list[float]


def search_scale(
    weight: torch.Tensor,
    x: torch.Tensor,
    w_bit: int,
    group_size: int,
    n_grid: int = 20,
    block: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> ScaleSearch:
    """Grid-search ``alpha`` in ``[0, 1)`` for ``s = mean|x|^alpha`` minimising ``mean((x W^T - x (Q(W s)/s)^T)^2)``.

    ``weight`` ``[N, K]``; ``x`` ``[T, K]`` calibration inputs of that linear. ``block``, if given, maps
    the linear's output to the output of the block it feeds, and the error is measured there. ``alpha = 0`` is plain
    round-to-nearest (``s = 1``), so the chosen error is never above RTN's on ``x``. Scales are
    normalised by ``sqrt(max * min)`` so they straddle 1 (the product, not the ratio, is what matters).
    """
    check_quant_args(weight.shape[1], w_bit, group_size)
    weight, x = weight.float(), x.float()
    # BEGIN SOLUTION Lab 6: try each alpha of the grid: scale W's input channels by mean|x|**alpha, quantize, unscale; keep the alpha whose error after block is lowest
    # HINT: The grid is alpha = i / n_grid for i in range(n_grid), so alpha = 0 (s = 1) is plain RTN. s = x.abs().mean(0)
    #  ** alpha, clamped to >= 1e-4, divided by sqrt(s.max() * s.min()); the quantized weight is fake_quantize(W * s) / s.
    # HINT: The error is the mean of (block(x @ W_q.T) - block(x @ W.T))**2, with block the identity when None. Record each
    #  alpha and its error in grid order, and return ScaleSearch(best scales, best alpha, alphas, errors).
    block = block or (lambda y: y)
    x_mean = x.abs().mean(dim=0)
    target = block(x @ weight.T)
    alphas, errors = [], []
    best: tuple[float, float, torch.Tensor] | None = None
    for i in range(n_grid):
        alpha = i / n_grid
        scales = x_mean.pow(alpha).clamp(min=1e-4)
        scales = scales / (scales.max() * scales.min()).sqrt()
        w_q = fake_quantize(weight * scales, w_bit, group_size) / scales
        error = (block(x @ w_q.T) - target).pow(2).mean().item()
        alphas.append(alpha)
        errors.append(error)
        if best is None or error < best[0]:
            best = (error, alpha, scales)
    return ScaleSearch(best[2], best[1], alphas, errors)
    # END SOLUTION


def clip_ratios(n_grid: int = CLIP_GRID, max_shrink: float = CLIP_MAX_SHRINK) -> torch.Tensor:
    """The clip grid: ``ratio[i] = 1 - max_shrink * i / n_grid`` (index 0 means no clipping)."""
    return 1 - max_shrink * torch.arange(n_grid) / n_grid


def clip_max_val(weight: torch.Tensor, group_size: int, ratio: torch.Tensor) -> torch.Tensor:
    """Per-group clip bound ``[N, K // group_size]``: ``ratio`` ``[N]`` times each group's largest ``|w|``."""
    n, k = weight.shape
    return weight.float().abs().view(n, k // group_size, group_size).amax(dim=-1) * ratio[:, None]


def search_clip(weight: torch.Tensor, x: torch.Tensor, w_bit: int, group_size: int) -> torch.Tensor:
    """Index into ``clip_ratios()`` per output channel ``[N]`` (uint8) minimising that channel's output MSE on ``x``."""
    check_quant_args(weight.shape[1], w_bit, group_size)
    weight, x = weight.float(), x.float()
    target = x @ weight.T
    ratios = clip_ratios()
    best_error = torch.full((weight.shape[0],), float("inf"))
    best_index = torch.zeros(weight.shape[0], dtype=torch.uint8)
    for i, ratio in enumerate(ratios):
        max_val = clip_max_val(weight, group_size, ratio.expand(weight.shape[0]))
        error = (x @ fake_quantize(weight, w_bit, group_size, max_val).T - target).pow(2).mean(dim=0)
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best_index[better] = i
    return best_index


def awq_params_path(model_name: str, w_bit: int, group_size: int) -> Path:
    """Where the AWQ scales of ``model_name`` (the weights file's stem) at this bit width and group size are cached."""
    return DATA_DIR / "awq" / f"{model_name}.w{w_bit}g{group_size}.safetensors"


def load_awq_params(model_name: str, w_bit: int, group_size: int) -> dict[str, torch.Tensor]:
    """The cached ``{linear name}.scales`` (float16 ``[K]``) and ``{linear name}.clip`` (uint8 ``[N]``) tensors."""
    from safetensors.torch import load_file

    path = awq_params_path(model_name, w_bit, group_size)
    if not path.exists():
        raise FileNotFoundError(
            f"no AWQ scales for {model_name} at w_bit={w_bit}, group_size={group_size} ({path} is missing). "
            f"Compute them (a few minutes on CPU) with:\n"
            f"    python -m solutions.quant.awq --w-bit {w_bit} --group-size {group_size}"
        )
    return load_file(str(path))


def _attention_block(
    attn, cos: torch.Tensor, sin: torch.Tensor, window: int
) -> Callable[[torch.Tensor], torch.Tensor]:
    """qkv_proj's output -> o_proj's output (float o_proj), causal within each calibration window."""
    from ..kernels.attention import gqa_attention
    from ..model.llama import apply_rope

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
    model, calibration_ids: torch.Tensor, w_bit: int, group_size: int, window: int = 512
) -> dict[str, torch.Tensor]:
    """AWQ scales and clip indices for every linear of ``model``, from one float pass over ``calibration_ids``.

    The model is left unchanged. Inputs are captured once: scaling preserves each layer's function,
    so the float model's activations, divided by the scales, are the scaled model's activations.
    """
    from tqdm import tqdm

    from .model import layer_linears

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions.quant.awq", description="Calibrate AWQ scales."
    )
    parser.add_argument(
        "--model", default=None, help="a .gguf file or checkpoint folder (default: bundled SmolLM2)"
    )
    parser.add_argument("--w-bit", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--calibration", type=Path, default=CALIBRATION_TEXT, help="a UTF-8 text file")
    parser.add_argument("--tokens", type=int, default=2048, help="calibration tokens (windows of 512)")
    args = parser.parse_args(argv)

    from safetensors.torch import save_file

    from ..model.llama import LlamaModel
    from ..model.loader import load_weights

    weights = load_weights(args.model)
    model = LlamaModel.from_state_dict(weights.config, weights.state_dict, "cpu", torch.float32)
    ids = torch.tensor(weights.tokenizer.encode(args.calibration.read_text())[: args.tokens])
    if len(ids) < args.tokens:
        print(f"note: {args.calibration} has only {len(ids)} tokens; calibrating on those", file=sys.stderr)
    params = calibrate(model, ids, args.w_bit, args.group_size)
    path = awq_params_path(weights.source.stem, args.w_bit, args.group_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        "w_bit": str(args.w_bit),
        "group_size": str(args.group_size),
        "calibration": f"{args.calibration.name}, first {len(ids)} tokens",
        "clip_ratios": f"1 - {CLIP_MAX_SHRINK} * clip / {CLIP_GRID}",
    }
    save_file({k: v.contiguous() for k, v in params.items()}, str(path), metadata=metadata)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
