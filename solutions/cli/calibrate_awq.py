"""``python -m solutions calibrate-awq``: AWQ scales and clips for a model, written where
``LLM(quantization="awq")`` reads them (``data/awq/``); ``--ablation`` scores the recipe's parts instead."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..eval.items import load_items
from ..model.llama import LlamaModel
from ..model.loader import load_weights
from ..quant.awq import CLIP_GRID, CLIP_MAX_SHRINK, awq_params_path
from ..quant.calibrate import (
    CALIBRATION_TEXT,
    CLIP_MODES,
    SCALED_PAIRS,
    Recipe,
    calibrate,
    calibration_ids,
)
from . import awq_ablation


def ablation(args, model, model_name, tokenizer) -> int:
    chosen = awq_ablation.VARIANTS
    if args.variants:
        wanted = {int(i) for i in args.variants.split(",")}
        bad = sorted(wanted - set(range(len(chosen))))
        if bad:
            raise SystemExit(f"--variants: no variant {bad[0]}; they are numbered 0..{len(chosen) - 1}")
        chosen = [v for i, v in enumerate(chosen) if i == 0 or i in wanted]  # float32 always first
    print(awq_ablation.header(len(load_items())), flush=True)
    rows = awq_ablation.run(
        model,
        model_name,
        tokenizer,
        chosen,
        args.w_bit,
        args.held_out_tokens,
        log=lambda line: print(line, flush=True),
    )
    awq_ablation.write(rows, args.w_bit, args.held_out_tokens)
    print(f"wrote {awq_ablation.RESULTS_FILE}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions calibrate-awq", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--model", default=None, help="a .gguf file or checkpoint folder (default: bundled SmolLM2)"
    )
    parser.add_argument("--w-bit", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument(
        "--calibration",
        type=Path,
        nargs="+",
        default=[CALIBRATION_TEXT],
        help="UTF-8 text files; each gives an equal share of the tokens",
    )
    parser.add_argument("--tokens", type=int, default=2048, help="calibration tokens (windows of 512)")
    parser.add_argument(
        "--pairs", default=",".join(SCALED_PAIRS), help=f"scaled pairs, comma-separated, of {SCALED_PAIRS}"
    )
    parser.add_argument("--duo-scaling", action="store_true", help="s = mean|x|^a / mean|w|^(1-a)")
    parser.add_argument("--clip", default=Recipe.clip, choices=CLIP_MODES, help="which linears are clipped")
    parser.add_argument("--no-clip-lm-head", action="store_true", help="leave the tied LM head unclipped")
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="score each variant of the recipe (accuracy, held-out perplexity) instead of writing scales",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="--ablation: only these rows (numbers, comma-separated; merged into the results file)",
    )
    parser.add_argument("--held-out-tokens", type=int, default=2048, help="--ablation: tokens of each text")
    args = parser.parse_args(argv)
    try:
        recipe = Recipe(
            tuple(p for p in args.pairs.split(",") if p),
            args.duo_scaling,
            args.clip,
            not args.no_clip_lm_head,
        )
    except ValueError as error:
        parser.error(str(error))

    weights = load_weights(args.model)
    model = LlamaModel.from_state_dict(weights.config, weights.state_dict, "cpu", torch.float32)
    if args.ablation:
        return ablation(args, model, weights.source.stem, weights.tokenizer)
    try:
        ids = calibration_ids(weights.tokenizer, args.calibration, args.tokens)
    except ValueError as error:
        parser.error(str(error))
    params = calibrate(model, ids, args.w_bit, args.group_size, recipe=recipe)
    path = awq_params_path(weights.source.stem, args.w_bit, args.group_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        "w_bit": str(args.w_bit),
        "group_size": str(args.group_size),
        "calibration": " + ".join(
            f"{path.name}, first {len(ids) // len(args.calibration)} tokens" for path in args.calibration
        ),
        "clip_ratios": f"1 - {CLIP_MAX_SHRINK} * clip / {CLIP_GRID}",
        "recipe": repr(recipe),
    }
    save_file({k: v.contiguous() for k, v in params.items()}, str(path), metadata=metadata)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0
