"""``python -m solutions eval``: the course's multiple-choice set (``data/eval/``) scored by log-likelihood
through the engine's model at each precision (float32, RTN INT4, AWQ INT4), accuracies side by side, and the
float32 - AWQ difference with its paired standard error: the check behind "quantized, no change to what it
knows"."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..bench.machine import machine_name
from ..eval.chat_check import CHAT_ITEMS_FILE, load_chat_items, replies
from ..eval.chat_check import correct as chat_correct
from ..eval.items import ITEMS_FILE, Item, load_items
from ..eval.scoring import Scored, encode_item, paired_difference, score
from ..llm import LLM

PRECISIONS = {"float32": None, "rtn": "rtn", "awq": "awq"}
"""Each precision as ``LLM(quantization=...)`` takes it."""


@dataclass(frozen=True)
class Run:
    label: str
    activations: torch.dtype
    scored: Scored
    seconds: float


def label(precision: str, w_bit: int, group_size: int) -> str:
    return "float32" if PRECISIONS[precision] is None else f"{precision.upper()} INT{w_bit} g{group_size}"


def spread(items: list[Item], limit: int | None) -> list[Item]:
    """``limit`` items spaced evenly through the file (so every category keeps its share), or all of them."""
    if limit is None or limit >= len(items):
        return items
    if limit < 1:
        raise ValueError(f"limit must be at least 1 item, got {limit}")
    return [items[i * len(items) // limit] for i in range(limit)]


def evaluate(
    items: list[Item],
    precision: str,
    w_bit: int = 4,
    group_size: int = 64,
    device: str = "auto",
    max_tokens: int = 1024,
    dtype: str = "auto",
) -> Run:
    """Load the bundled model as the engine does at ``precision`` (its weights, quantization and activation
    dtype: bfloat16 for INT4 on a CPU with native bfloat16, unless ``dtype`` says) and score ``items``."""
    # the scorer runs the model without the paged cache: the engine's KV cache is kept at its smallest
    llm = engine_at(precision, w_bit, group_size, device, dtype, max_model_len=128, kv_cache_memory=16 << 20)
    model = llm.engine.model
    encoded = [encode_item(llm.tokenizer, item) for item in items]
    score(model, encoded[:1], [items[0].answer])  # a first forward may measure or compile a CPU path: untimed
    start = time.perf_counter()
    scored = score(model, encoded, [item.answer for item in items], max_tokens)
    seconds = time.perf_counter() - start
    return Run(label(precision, w_bit, group_size), model.norm.weight.dtype, scored, seconds)


def table(items: list[Item], runs: list[Run]) -> str:
    """Accuracy per precision side by side (overall, by sum and per token, and per category by sum), each
    accuracy with its binomial standard error, and every quantized run's difference from the first run."""
    n = len(items)
    chance = sum(1 / len(item.choices) for item in items) / n
    width = max(12, *(len(run.label) + 2 for run in runs))
    row = lambda name, cells: f"{name:<26}" + "".join(f"{cell:>{width}}" for cell in cells)
    percent = lambda p: f"{100 * p:.1f}%"
    with_error = lambda p: f"{100 * p:.1f} ± {100 * (p * (1 - p) / n) ** 0.5:.1f}"
    lines = [
        row(f"{n} items, chance {percent(chance)}", [run.label for run in runs]),
        row("activations", [str(run.activations).removeprefix("torch.") for run in runs]),
        row("accuracy % (sum logprob)", [with_error(run.scored.accuracy) for run in runs]),
        row("accuracy % (per token)", [with_error(run.scored.accuracy_norm) for run in runs]),
    ]
    categories = sorted({item.category for item in items})
    for category in categories:
        rows = torch.tensor([item.category == category for item in items])
        cells = [percent(run.scored.correct[rows].float().mean().item()) for run in runs]
        lines.append(row(f"  {category} ({int(rows.sum())})", cells))
    lines.append(row("seconds to score", [f"{run.seconds:.1f}" for run in runs]))
    base = runs[0]
    for run in runs[1:]:
        for name, a, b in (
            ("sum", base.scored.correct, run.scored.correct),
            ("per token", base.scored.correct_norm, run.scored.correct_norm),
        ):
            d = paired_difference(a, b)
            lines.append(
                f"{base.label} - {run.label} ({name}): {100 * d.difference:+.1f} points"
                f" ± {100 * d.standard_error:.1f} (paired standard error; {d.only_a + d.only_b} items differ:"
                f" {d.only_a} right in {base.label} only, {d.only_b} in {run.label} only)"
            )
    return "\n".join(lines)


def lm_eval_agreement(samples: Path, items: list[Item], run: Run) -> str:
    """Whether lm-evaluation-harness picked the same choice as ``run`` on every item: ``samples`` is the
    ``samples_<task>_*.jsonl`` that ``lm_eval --log_samples`` writes for ``data/eval/lm_eval/``'s task (each
    line's ``filtered_resps`` holds one ``[log-likelihood, is_greedy]`` per choice; its ``doc_id`` is the
    item's line number)."""
    theirs = {}
    for line in samples.read_text().splitlines():
        record = json.loads(line)
        loglik = [float(resp[0]) for resp in record["filtered_resps"]]
        theirs[record["doc_id"]] = max(range(len(loglik)), key=loglik.__getitem__)
    if sorted(theirs) != list(range(len(items))):
        raise ValueError(f"{samples} scores {len(theirs)} items, not the {len(items)} of the items file")
    ours = run.scored.picks.tolist()
    differ = [items[i].id for i in range(len(items)) if theirs[i] != ours[i]]
    right = sum(theirs[i] == item.answer for i, item in enumerate(items))
    return (
        f"lm-eval vs python -m solutions eval ({run.label}): same pick on {len(items) - len(differ)} of "
        f"{len(items)} items; accuracy lm-eval {100 * right / len(items):.1f}%, ours "
        f"{100 * run.scored.accuracy:.1f}%" + (f"; differ on {', '.join(differ)}" if differ else "")
    )


def engine_at(precision: str, w_bit: int, group_size: int, device: str, dtype: str, **sizes) -> LLM:
    """The bundled model's engine at ``precision`` (a key of ``PRECISIONS``), sized by ``sizes``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    quantization = PRECISIONS[precision]
    return LLM(
        device=device, dtype=dtype, quantization=quantization, w_bit=w_bit, group_size=group_size, **sizes
    )


def chat_check(precisions: list[str], w_bit: int, group_size: int, device: str, dtype: str) -> str:
    """The generation check (``eval.chat_check``) at each precision: exact-match accuracy with its binomial
    error, and each quantized precision's difference from the first with its paired standard error."""
    items = load_chat_items()
    results = {}
    for precision in precisions:
        llm = engine_at(
            precision, w_bit, group_size, device, dtype, max_model_len=256, kv_cache_memory=64 << 20
        )
        results[label(precision, w_bit, group_size)] = chat_correct(items, replies(llm, items))
    n = len(items)
    lines = [f"{CHAT_ITEMS_FILE.name}: {n} questions answered greedily, right when the reply says the answer"]
    for name, right in results.items():
        p = right.float().mean().item()
        lines.append(f"  {name:<16} {100 * p:5.1f}% ± {100 * (p * (1 - p) / n) ** 0.5:.1f}")
    (base, base_right), *others = results.items()
    for name, right in others:
        d = paired_difference(base_right, right)
        lines.append(
            f"{base} - {name}: {100 * d.difference:+.1f} points ± {100 * d.standard_error:.1f} (paired; "
            f"{d.only_a} right in {base} only, {d.only_b} in {name} only)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m solutions eval", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--precisions",
        default="float32,rtn,awq",
        help="comma-separated, the first is the baseline (default: float32,rtn,awq)",
    )
    parser.add_argument("--items", type=Path, default=ITEMS_FILE, help="a JSONL file of items")
    parser.add_argument("--limit", type=int, default=None, help="score N items spread through the file")
    parser.add_argument("--w-bit", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--dtype", default="auto", help="activations (default: the engine's choice per precision and device)"
    )
    parser.add_argument("--max-tokens", type=int, default=1024, help="packed tokens per forward")
    parser.add_argument(
        "--compare-lm-eval",
        type=Path,
        default=None,
        metavar="SAMPLES",
        help="lm_eval --log_samples' samples file: compare its picks with the first precision's",
    )
    parser.add_argument(
        "--chat", action="store_true", help=f"the generation check ({CHAT_ITEMS_FILE.name}) instead"
    )
    args = parser.parse_args(argv)
    precisions = args.precisions.split(",")
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        parser.error(f"unknown precision {unknown[0]!r}: choose from {', '.join(PRECISIONS)}")
    if args.chat:
        print(chat_check(precisions, args.w_bit, args.group_size, args.device, args.dtype))
        return 0
    items = spread(load_items(args.items), args.limit)
    runs = []
    for precision in precisions:
        runs.append(
            evaluate(items, precision, args.w_bit, args.group_size, args.device, args.max_tokens, args.dtype)
        )
        print(f"{runs[-1].label}: {runs[-1].seconds:.1f} s", file=sys.stderr, flush=True)
    print(f"{args.items.name} on {machine_name(args.device if args.device != 'auto' else None)}")
    print(table(items, runs))
    if args.compare_lm_eval is not None:
        print(lm_eval_agreement(args.compare_lm_eval, items, runs[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
