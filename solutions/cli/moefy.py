"""``python -m solutions moefy --experts 8``: MoE-fy the bundled SmolLM2 (``moe/moefy.py``), score perplexity
for each top-k beside the FFN FLOPs per token, record the curve in ``data/moe/`` and write the converted model
folder that ``LLM(model=folder)`` loads."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from ..bench.machine import machine_name
from ..model.llama import LlamaModel
from ..model.loader import load_weights
from ..moe.moefy import (
    EVALUATION_TEXT,
    WINDOW,
    artefact_path,
    ffn_flops_per_token,
    load_or_compute_split,
    moefied_config,
    moefied_state_dict,
    write_folder,
)
from ..paths import REPO_DIR, cache_dir
from ..quant.perplexity import perplexity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m solutions moefy", description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument(
        "--top-k", type=int, default=None, help="experts per token in the written config (default E/2)"
    )
    parser.add_argument("--split", choices=["coactivation", "random"], default="coactivation")
    parser.add_argument(
        "--recompute", action="store_true", help="redo the split and routers (else read data/moe/)"
    )
    parser.add_argument("--calib-tokens", type=int, default=2048)
    parser.add_argument("--eval-tokens", type=int, default=2048)
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the converted model (default: the cache)"
    )
    parser.add_argument("--no-write", action="store_true", help="measure only; write no model folder")
    args = parser.parse_args(argv)
    num_experts = args.experts
    top_k = args.top_k or max(1, num_experts // 2)

    weights = load_weights()
    config = weights.config
    if config.intermediate_size % num_experts:
        raise ValueError(
            f"intermediate_size {config.intermediate_size} does not split into {num_experts} experts"
        )
    dense = LlamaModel.from_state_dict(config, weights.state_dict, "cpu", torch.float32)
    neurons, routers = load_or_compute_split(
        dense, weights.tokenizer, num_experts, args.split, args.calib_tokens, args.recompute
    )
    moe_state = moefied_state_dict(weights.state_dict, neurons, routers)
    moe_config = moefied_config(config, num_experts, top_k)
    moe = LlamaModel.from_state_dict(
        replace(moe_config, num_experts_per_tok=num_experts), moe_state, "cpu", torch.float32
    )

    eval_ids = torch.tensor(weights.tokenizer.encode(EVALUATION_TEXT.read_text())[: args.eval_tokens])
    check = eval_ids[:WINDOW]
    with torch.inference_mode():
        gap = (moe.sequence_logits(check) - dense.sequence_logits(check)).abs().max().item()
    print(f"k = E = {num_experts} against the dense model: max |logit difference| {gap:.2e} "
          f"over {len(check)} tokens", flush=True)  # fmt: skip
    dense_ppl = perplexity(dense, eval_ids, WINDOW)
    dense_flops = ffn_flops_per_token(config, num_experts, None)
    print(
        f"\nperplexity on the first {len(eval_ids)} tokens of {EVALUATION_TEXT.name} (windows of {WINDOW});"
    )
    print(f"FFN MFLOPs per token over {config.num_layers} layers (router included); split: {args.split}")
    print(f"{'model':<14}{'FFN MFLOP':>10}{'of dense':>10}{'perplexity':>12}{'vs dense':>10}")
    print(f"{'dense':<14}{dense_flops / 1e6:>10.1f}{1:>10.0%}{dense_ppl:>12.5g}{1:>9.3g}x")
    curve = {"dense": {"ffn_flops": dense_flops, "perplexity": dense_ppl}}
    for k in range(1, num_experts + 1):
        for layer in moe.layers:
            layer.mlp.top_k = k
        ppl = perplexity(moe, eval_ids, WINDOW)
        flops = ffn_flops_per_token(config, num_experts, k)
        curve[f"top-{k}"] = {"ffn_flops": flops, "perplexity": ppl}
        print(f"{f'top-{k} of {num_experts}':<14}{flops / 1e6:>10.1f}{flops / dense_flops:>10.0%}"
              f"{ppl:>12.5g}{ppl / dense_ppl:>9.3g}x", flush=True)  # fmt: skip
    if not math.isclose(gap, 0.0, abs_tol=1e-3):
        raise RuntimeError(f"k = E does not reproduce the dense model (max logit gap {gap:.2e})")
    record = {
        "command": "python -m solutions moefy " + " ".join(argv if argv is not None else sys.argv[2:]),
        "machine": machine_name(),
        "evaluation": (
            f"first {len(eval_ids)} tokens of data/text/{EVALUATION_TEXT.name}, windows of {WINDOW}"
        ),
        "split": args.split,
        "k_equals_e_max_logit_gap": gap,
        "curve": curve,
    }
    curve_path = artefact_path(num_experts, args.split).with_suffix(".curve.json")
    curve_path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"curve written to {curve_path.relative_to(REPO_DIR)}")
    if not args.no_write:
        folder = args.out or cache_dir() / f"{weights.source.stem}-moe{num_experts}"
        write_folder(folder, moe_config, moe_state, weights.tokenizer)
        print(f"\nwrote {folder} (top-{top_k} of {num_experts}); load it with LLM(model={str(folder)!r})")
    return 0
