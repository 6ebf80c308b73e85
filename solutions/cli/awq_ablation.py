"""``python -m solutions calibrate-awq --ablation``: which part of AWQ's recipe keeps (or costs) the model's
accuracy. Each variant is calibrated, quantized as the engine quantizes (``quant.model.quantize_model``) and
scored on the course's multiple-choice set (every item, paired standard error against float32) and by
perplexity on held-out texts of genres that no calibration text holds; the table is printed and written to
``results/awq_ablation.json`` (notebook 06 reads it).

Activations are captured once per calibration text and sample count, and a linear's searched scales and
clips are reused by every variant that shares them (``search_params``' cache), so a variant that only changes
the clipping costs only its clip searches.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..bench.machine import machine_name
from ..eval.items import load_items
from ..eval.scoring import encode_item, paired_difference, score
from ..model.llama import LlamaModel
from ..paths import DATA_DIR, REPO_DIR
from ..quant.awq import load_awq_params
from ..quant.calibrate import Recipe, calibration_ids, capture_inputs, search_params
from ..quant.model import quantize_model
from ..quant.perplexity import perplexity

TEXT_DIR = DATA_DIR / "text"
CALIBRATION_SETS = {
    "chat+code": ("awq_calibration_mix.txt",),
    "general": ("awq_general_mix.txt",),
    "both": ("awq_calibration_mix.txt", "awq_general_mix.txt"),
}
"""Each calibration set's texts (``data/text/README.md``); a set of two takes half its tokens from each."""
HELD_OUT = {"scripture (KJV Luke)": "kjv_luke_1-12.txt", "language reference": "eval_python_reference.txt"}
"""Held-out texts, of genres no calibration set holds: archaic narrative, and formal specification prose."""
RESULTS_FILE = REPO_DIR / "results" / "awq_ablation.json"


@dataclass(frozen=True)
class Variant:
    """One row: ``method`` "float32", "rtn", "awq" (calibrated here) or "shipped" (the file in ``data/awq/``);
    AWQ's calibration set, token count and recipe."""

    label: str
    method: str
    calibration: str = "chat+code"
    tokens: int = 2048
    recipe: Recipe = field(default_factory=Recipe)
    group_size: int = 64


TODAY = Recipe(pairs=("qkv", "gate_up", "down"), duo_scaling=False, clip="all", clip_lm_head=True)
"""The recipe of the scales shipped before this ablation (``data/awq/README.md``)."""
VARIANTS = [
    Variant("float32", "float32"),
    Variant("RTN", "rtn"),
    Variant("AWQ as before (all pairs, all clips)", "awq", recipe=TODAY),
    Variant("no clip for q/k", "awq", recipe=replace(TODAY, clip="no_qk")),
    Variant("no clip for the LM head", "awq", recipe=replace(TODAY, clip_lm_head=False)),
    Variant(
        "no clip for q/k nor the LM head", "awq", recipe=replace(TODAY, clip="no_qk", clip_lm_head=False)
    ),
    Variant("no clip at all (scales only)", "awq", recipe=replace(TODAY, clip="none", clip_lm_head=False)),
    Variant("no scales (clips only)", "awq", recipe=replace(TODAY, pairs=())),
    Variant("pair norm -> q/k/v off", "awq", recipe=replace(TODAY, pairs=("gate_up", "down"))),
    Variant("pair norm -> gate/up off", "awq", recipe=replace(TODAY, pairs=("qkv", "down"))),
    Variant("pair up -> down off", "awq", recipe=replace(TODAY, pairs=("qkv", "gate_up"))),
    Variant("duo scaling", "awq", recipe=replace(TODAY, duo_scaling=True)),
    Variant("general text", "awq", calibration="general", recipe=TODAY),
    Variant("chat+code and general", "awq", calibration="both", recipe=TODAY),
    Variant("1024 tokens", "awq", tokens=1024, recipe=TODAY),
    Variant("4096 tokens", "awq", tokens=4096, recipe=TODAY),
    Variant("RTN g32", "rtn", group_size=32),
    Variant("AWQ g32", "awq", recipe=TODAY, group_size=32),
    Variant("shipped file (data/awq)", "shipped"),
]
"""The ablation: each AWQ row one change from "AWQ as before" (chat+code, 2048 tokens, INT4 g64), then the
shipped file, the recipe that combines what the single changes found (``quant.calibrate.Recipe``'s defaults).
Group size 128 cannot tile SmolLM2's 576 hidden
features (576 = 4.5 x 128), so g32 is the other group size."""


def run(
    model: LlamaModel,
    model_name: str,
    tokenizer,
    variants: list[Variant],
    w_bit: int,
    held_out_tokens: int,
    log=print,
) -> list[dict]:
    """One record per variant (accuracy, paired difference to float32, perplexities, gap to RTN's), in
    order; ``model_name`` (the weights file's stem) finds the shipped AWQ file. ``variants`` must start with
    float32; a gap ratio needs RTN at the variant's group size before it.
    """
    if not variants or variants[0].method != "float32":
        raise ValueError("the ablation's first variant must be float32: every row is compared with it")
    items = load_items()
    encoded = [encode_item(tokenizer, item) for item in items]
    answers = [item.answer for item in items]
    texts = {
        genre: torch.tensor(tokenizer.encode((TEXT_DIR / name).read_text())[:held_out_tokens])
        for genre, name in HELD_OUT.items()
    }
    inputs_key, inputs, caches = None, None, {}
    rows, base, rtn_by_group = [], None, {}
    for variant in variants:
        start = time.perf_counter()
        net = copy.deepcopy(model)
        if variant.method == "awq":
            key = (variant.calibration, variant.tokens)
            if key != inputs_key:
                inputs_key, inputs = key, None  # free the previous set's activations first
                inputs = capture_inputs(model, calibration_ids(tokenizer, *key))
            cache = caches.setdefault((*key, w_bit, variant.group_size), {})
            params = search_params(
                model, inputs, w_bit, variant.group_size, recipe=variant.recipe, cache=cache
            )
            quantize_model(net, "awq", w_bit, variant.group_size, params)
        elif variant.method == "shipped":
            quantize_model(
                net, "awq", w_bit, variant.group_size, load_awq_params(model_name, w_bit, variant.group_size)
            )
        elif variant.method == "rtn":
            quantize_model(net, "rtn", w_bit, variant.group_size)
        scored = score(net, encoded, answers)
        ppl = {genre: perplexity(net, ids) for genre, ids in texts.items()}
        row = {
            "label": variant.label,
            "method": variant.method,
            "group_size": variant.group_size,
            "calibration": variant.calibration if variant.method == "awq" else None,
            "tokens": variant.tokens if variant.method == "awq" else None,
            "recipe": asdict(variant.recipe) if variant.method == "awq" else None,
            "accuracy": scored.accuracy,
            "correct": scored.correct.tolist(),
            "perplexity": ppl,
        }
        if base is None:
            base = row
        else:
            d = paired_difference(torch.tensor(base["correct"]), scored.correct)
            row["paired"] = {"difference": d.difference, "standard_error": d.standard_error}
            row["only_float32"], row["only_this"] = d.only_a, d.only_b
            rtn = rtn_by_group.get(variant.group_size)
            if variant.method == "rtn":
                rtn_by_group[variant.group_size] = row
            elif rtn is not None:
                row["gap_vs_rtn"] = {
                    g: (ppl[g] - base["perplexity"][g]) / (rtn["perplexity"][g] - base["perplexity"][g])
                    for g in ppl
                }
        row["seconds"] = time.perf_counter() - start
        rows.append(row)
        log(format_row(row, len(items)))
    return rows


def format_row(row: dict, n: int) -> str:
    """One line of the table: accuracy ± its binomial error, float32 minus this ± the paired error, the items
    only one of the two gets right, each held-out perplexity and (AWQ) its gap as a fraction of RTN's."""
    p = row["accuracy"]
    line = f"{row['label']:<40} {100 * p:5.1f} ± {100 * (p * (1 - p) / n) ** 0.5:.1f}"
    if "paired" in row:
        d = row["paired"]
        line += f"  {100 * d['difference']:+5.1f} ± {100 * d['standard_error']:.1f}"
        line += f" ({row['only_float32']:>2}/{row['only_this']:>2})"
    else:
        line += " " * 23
    for genre, value in row["perplexity"].items():
        ratio = row.get("gap_vs_rtn", {}).get(genre)
        line += f"  {value:7.2f}" + (f" ({ratio:.2f})" if ratio is not None else " " * 7)
    return line


def header(n: int) -> str:
    genres = "".join(f"  {g[:14]:>14}" for g in HELD_OUT)
    return (
        f"{'variant (INT4 g64 unless named)':<40} {'acc % of ' + str(n):>11}  {'fp32 - this':>11}"
        f" {'(fp/q)':>8}{genres}\n"
        f"{'':<40} {'':>11}  {'paired se':>11} {'':>8}  perplexity (AWQ: gap / RTN's gap)"
    )


def write(rows: list[dict], w_bit: int, held_out_tokens: int, path: Path = RESULTS_FILE) -> None:
    """The table as JSON, with the machine, the command and the settings that produced it. Rows of a run of
    some variants (``--variants``) replace the file's rows of the same label, kept in ``VARIANTS``' order.
    """
    order = {variant.label: i for i, variant in enumerate(VARIANTS)}
    kept = json.loads(path.read_text())["rows"] if path.exists() else []
    merged = {row["label"]: row for row in kept if row["label"] in order} | {
        row["label"]: row for row in rows
    }
    record = {
        "command": "python -m solutions calibrate-awq --ablation",
        "machine": machine_name("cpu"),
        "date": time.strftime("%Y-%m-%d"),
        "w_bit": w_bit,
        "held_out": HELD_OUT,
        "held_out_tokens": held_out_tokens,
        "calibration_sets": CALIBRATION_SETS,
        "rows": sorted(merged.values(), key=lambda row: order[row["label"]]),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
