"""``python -m solutions calibrate-awq``: AWQ scales and clips for a model, written where
``LLM(quantization="awq")`` reads them (``data/awq/``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..model.llama import LlamaModel
from ..model.loader import load_weights
from ..quant.awq import CLIP_GRID, CLIP_MAX_SHRINK, awq_params_path
from ..quant.calibrate import CALIBRATION_TEXT, calibrate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions calibrate-awq", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--model", default=None, help="a .gguf file or checkpoint folder (default: bundled SmolLM2)"
    )
    parser.add_argument("--w-bit", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--calibration", type=Path, default=CALIBRATION_TEXT, help="a UTF-8 text file")
    parser.add_argument("--tokens", type=int, default=2048, help="calibration tokens (windows of 512)")
    args = parser.parse_args(argv)

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
