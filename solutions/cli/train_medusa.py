"""``python -m solutions train-medusa``: train Medusa heads (``speculative/medusa.py``) on the EAGLE head's
self-distilled data (``data/spec/responses.jsonl``: the target's own answers) and write them, with a
manifest of the run, to ``data/spec/``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..bench.machine import machine_name
from ..kernels.blocks import cdiv
from ..llm import LLM
from ..speculative.eagle import SPEC_DIR, most_frequent_tokens
from ..speculative.medusa import MEDUSA_PATH, MedusaHeads, heads_loss, save_heads
from .train_eagle import _relative, add_run_options, target_features, warmup_cosine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions train-medusa", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--responses", type=Path, default=SPEC_DIR / "responses.jsonl")
    parser.add_argument("--heldout", type=Path, default=SPEC_DIR / "heldout_responses.jsonl")
    parser.add_argument("--out", type=Path, default=MEDUSA_PATH)
    parser.add_argument(
        "--num-heads", type=int, default=4, help="K: head k drafts the token k after the root"
    )
    parser.add_argument(
        "--vocab-size", type=int, default=4096, help="draft vocabulary (most frequent tokens)"
    )
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=4, help="sequences per optimizer step")
    parser.add_argument("--decay", type=float, default=0.8, help="head k's loss weight: decay ** k")
    add_run_options(
        parser,
        0.2,
        "train on this share of the answers (a seeded random subset): the target pass that makes their "
        "features is the slow part on a CPU (about 1 s per answer on one busy core)",
    )
    args = parser.parse_args(argv)
    if not 0 < args.data_fraction <= 1:
        parser.error(f"--data-fraction must be in (0, 1], got {args.data_fraction}")
    if args.num_heads < 1 or args.epochs < 1:
        parser.error(f"--num-heads and --epochs must be >= 1, got {args.num_heads} and {args.epochs}")
    torch.manual_seed(args.seed)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()

    model = LLM(device="cpu", dtype="float32", max_model_len=1024).engine.model
    rows = [json.loads(line) for line in args.responses.read_text().splitlines()]
    chosen = torch.randperm(len(rows), generator=torch.Generator().manual_seed(args.seed))
    rows = [rows[i] for i in sorted(chosen[: max(1, round(args.data_fraction * len(rows)))].tolist())]
    heldout_rows = [json.loads(line) for line in args.heldout.read_text().splitlines()]
    every = target_features(model, rows + heldout_rows, args.features_cache)
    # head training and scoring start at the position before the answer's first token
    every = [(feats, labels, prompt_len - 1) for _, feats, labels, prompt_len in every]
    train, heldout = every[: len(rows)], every[len(rows) :]
    features_s = time.perf_counter() - started
    ranked = most_frequent_tokens([r["token_ids"] for r in rows], args.vocab_size)
    heads = MedusaHeads(model.config, args.num_heads, ranked).attach(model)

    params = [heads.weight, heads.bias]
    steps = args.epochs * cdiv(len(train), args.batch)
    optimizer, schedule = warmup_cosine(params, args.lr, steps, warmup=10)
    order_gen = torch.Generator().manual_seed(args.seed)
    progress = tqdm(total=steps, desc="training")
    log = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(train), generator=order_gen).tolist()
        for begin in range(0, len(order), args.batch):
            optimizer.zero_grad()
            for i in order[begin : begin + args.batch]:
                feats, labels, start = train[i]
                loss, hits = heads_loss(heads, feats, labels, start, args.decay)
                (loss / args.batch).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            progress.update()
            progress.set_postfix(loss=f"{float(loss.detach()):.3f}", head1=f"{float(hits[0]):.2f}")
        with torch.no_grad():
            agreement = sum(heads_loss(heads, f, lab, s, args.decay)[1] for f, lab, s in heldout) / len(
                heldout
            )
        log.append({"epoch": epoch + 1, "heldout_head_top1": [round(float(a), 4) for a in agreement]})
        progress.write(f"epoch {epoch + 1}: held-out agreement per head {log[-1]['heldout_head_top1']}")
    progress.close()

    elapsed = time.perf_counter() - started
    metadata = {
        "command": "python -m solutions train-medusa " + " ".join(argv if argv is not None else sys.argv[2:]),
        "seed": str(args.seed),
        "draft_vocab_size": str(len(ranked)),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    digest = save_heads(heads, args.out, metadata)
    manifest = {
        **metadata,
        "file": args.out.name,
        "sha256": digest,
        "data": (
            f"{len(rows)} of the {args.responses.name} answers (a seeded {args.data_fraction:.0%} share: the "
            "bundled SmolLM2-135M-Instruct's own answers to this repo's prompts, greedy and sampled, "
            f"as the EAGLE head's), {sum(len(r['token_ids']) for r in rows)} tokens; scored on "
            f"{args.heldout.name}"
        ),
        "settings": {k: _relative(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "training_log": log,
        "heldout_head_top1": log[-1]["heldout_head_top1"],
        "features_seconds": round(features_s, 1),
        "total_seconds": round(elapsed, 1),
        "machine": machine_name("cpu"),
    }
    args.out.with_suffix(".json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"held-out agreement with the target, head 1..{args.num_heads}: {log[-1]['heldout_head_top1']}")
    print(f"wrote {args.out} (sha256 {digest}) in {elapsed / 60:.1f} min")
    return 0
