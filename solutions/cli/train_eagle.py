"""``python -m solutions train-eagle``: train the EAGLE draft head by self-distillation
(``speculative/train_eagle.py``) and write it, with a manifest of the run, to ``data/spec/``."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..bench.machine import machine_name
from ..kernels.blocks import cdiv
from ..llm import LLM
from ..paths import REPO_DIR
from ..sampling_params import SamplingParams
from ..speculative.eagle import SPEC_DIR, EagleHead, most_frequent_tokens, save_head
from ..speculative.train_eagle import features_and_labels, head_loss


def read_prompts(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    bad = [r for r in rows if not {"kind", "prompt"} <= r.keys()]
    if bad:
        raise ValueError(f"{path}: every line needs 'kind' and 'prompt', got {bad[0]}")
    return rows


def generate_responses(
    llm: LLM,
    prompts: list[dict],
    max_tokens: int,
    samples: int = 0,
    temperature: float = 0.8,
    seed: int = 0,
    greedy: bool = True,
    first_sample: int = 0,
) -> list[dict]:
    """The target's greedy answer to every prompt (unless not ``greedy``), then ``samples`` sampled ones each:
    prompt ``i``'s completions ``first_sample ..`` seeded ``seed + 1000 * i + first_sample ..`` (so a later
    run that adds samples continues the seeds an earlier one used); each row gains ``token_ids``
    (prompt + answer), ``prompt_len`` and ``temperature``."""
    texts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}]) for r in prompts]
    runs = [(0, llm.generate(texts, SamplingParams(temperature=0, max_tokens=max_tokens)))] if greedy else []
    if samples:
        sampled = [
            SamplingParams(
                n=samples,
                temperature=temperature,
                top_p=0.95,
                max_tokens=max_tokens,
                seed=seed + 1000 * i + first_sample,
            )
            for i in range(len(texts))
        ]
        runs.append((temperature, llm.generate(texts, sampled)))
    return [
        {
            **row,
            "temperature": t,
            "prompt_len": len(out.prompt_token_ids),
            "token_ids": out.prompt_token_ids + c.token_ids,
        }
        for t, outputs in runs
        for row, out in zip(prompts, outputs)
        for c in out.outputs
    ]


def target_features(model, rows: list[dict], cache: Path | None) -> list:
    """``(ids, features, labels, prompt_len)`` of each of ``rows`` through the target ``model``: read from
    ``cache`` when it holds exactly these sequences, else computed (the slow pass) and written there."""
    if cache is not None and cache.exists():
        cached = torch.load(cache)
        if len(cached) == len(rows) and all(
            ids.tolist() == r["token_ids"] and start == r["prompt_len"]
            for (ids, _, _, start), r in zip(cached, rows)
        ):
            return cached
        print(f"{cache} holds other sequences: computing the features again")
    every = [
        (torch.tensor(r["token_ids"]), *features_and_labels(model, r["token_ids"]), r["prompt_len"])
        for r in tqdm(rows, "features")
    ]
    if cache is not None:
        torch.save(every, cache)
    return every


def _relative(path: Path) -> str:
    """A path as the command line would give it from the repository's root (no machine-specific prefix)."""
    root = REPO_DIR
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)


def add_run_options(parser: argparse.ArgumentParser, data_fraction: float, data_fraction_help: str) -> None:
    """The options both drafters' training runs share: the seed, the share of the answers trained on, the
    threads, and the cache of the target's features (the slow pass on a CPU)."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-fraction", type=float, default=data_fraction, help=data_fraction_help)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--features-cache",
        type=Path,
        default=None,
        help="keep the target's features here (written once, read when its sequences match): "
        "skips the slow pass when training again",
    )


def warmup_cosine(params: list, lr: float, steps: int, warmup: int):
    """AdamW (no weight decay) over ``params``, and its learning rate: a linear warm-up over ``warmup`` steps,
    then a cosine from ``lr`` to 0 at ``steps``."""
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
    )
    return optimizer, schedule


def _more_samples(llm: LLM, rows: list[dict], args: argparse.Namespace) -> list[dict]:
    """``args.add_samples`` more sampled answers to each prompt ``rows`` answered, in the order the prompts
    first appear; every prompt must hold the same number of sampled answers, whose seeds the new ones
    continue."""
    prompts = list({r["prompt"]: {"kind": r["kind"], "prompt": r["prompt"]} for r in rows}.values())
    held = {p["prompt"]: 0 for p in prompts}
    for r in rows:
        held[r["prompt"]] += r["temperature"] > 0
    if len(set(held.values())) != 1:
        raise SystemExit(f"--add-samples: the prompts hold different numbers of sampled answers: {held}")
    print(f"answering {len(prompts)} prompts {args.add_samples} more times ({args.max_tokens} tokens max)")
    return generate_responses(
        llm,
        prompts,
        args.max_tokens,
        args.add_samples,
        args.temperature,
        args.seed,
        greedy=False,
        first_sample=next(iter(held.values())),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions train-eagle", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        nargs="+",
        default=[SPEC_DIR / "prompts.jsonl", SPEC_DIR / "prompts_templated.jsonl"],
    )
    parser.add_argument(
        "--samples", type=int, default=1, help="sampled answers per prompt, besides the greedy one"
    )
    parser.add_argument("--temperature", type=float, default=0.8, help="for the sampled answers (top-p 0.95)")
    parser.add_argument("--heldout", type=Path, default=SPEC_DIR / "heldout.jsonl")
    parser.add_argument("--out", type=Path, default=SPEC_DIR / "eagle_head.safetensors")
    parser.add_argument("--max-tokens", type=int, default=192, help="answer length per prompt")
    parser.add_argument(
        "--vocab-size", type=int, default=4096, help="draft vocabulary (most frequent tokens)"
    )
    parser.add_argument(
        "--keep-vocab", type=int, default=8192, help="ranked tokens stored, to measure other sizes"
    )
    parser.add_argument("--epochs", type=int, default=8, help="the shipped head: 8")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=2, help="sequences per optimizer step")
    parser.add_argument("--ce-weight", type=float, default=1.0)
    parser.add_argument(
        "--noise", type=float, default=0.2, help="uniform feature noise, times the feature std"
    )
    parser.add_argument("--unroll", type=int, default=2)
    add_run_options(
        parser,
        1.0,
        "train on this share of the answers (a seeded random subset; the features pass still covers "
        "them all, so --features-cache serves every share): how agreement scales with data",
    )
    parser.add_argument(
        "--reuse-responses",
        action="store_true",
        help="train on data/spec/responses.jsonl as is (and score on heldout_responses.jsonl, when present)",
    )
    parser.add_argument(
        "--add-samples",
        type=int,
        default=0,
        help="with --reuse-responses: answer every prompt this many more times at --temperature (seeds "
        "continuing the ones responses.jsonl holds) and add them to it before training",
    )
    args = parser.parse_args(argv)
    if args.vocab_size > args.keep_vocab:
        parser.error("--vocab-size must not exceed --keep-vocab")
    if not 0 < args.data_fraction <= 1:
        parser.error(f"--data-fraction must be in (0, 1], got {args.data_fraction}")
    if args.samples < 0:
        parser.error(
            f"--samples must be >= 0 (sampled answers per prompt besides the greedy one), got {args.samples}"
        )
    if args.add_samples < 0 or (args.add_samples and not args.reuse_responses):
        parser.error(f"--add-samples needs --reuse-responses and a count >= 0, got {args.add_samples}")
    torch.manual_seed(args.seed)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    llm = LLM(device="cpu", dtype="float32", max_num_seqs=32, max_model_len=1024)
    model = llm.engine.model
    responses_path = args.out.parent / "responses.jsonl"
    heldout_path = args.out.parent / "heldout_responses.jsonl"
    if args.reuse_responses:
        train_rows = [json.loads(line) for line in responses_path.read_text().splitlines()]
        if args.add_samples:
            train_rows += _more_samples(llm, train_rows, args)
            responses_path.write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    else:
        prompts = [row for path in args.prompts for row in read_prompts(path)]
        print(
            f"generating {1 + args.samples} answers to each of {len(prompts)} prompts "
            f"({args.max_tokens} tokens max)"
        )
        train_rows = generate_responses(
            llm, prompts, args.max_tokens, args.samples, args.temperature, args.seed
        )
        responses_path.write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    if args.reuse_responses and heldout_path.exists():
        heldout_rows = [json.loads(line) for line in heldout_path.read_text().splitlines()]
    else:
        heldout_rows = generate_responses(llm, read_prompts(args.heldout), args.max_tokens)
        heldout_path.write_text("".join(json.dumps(r) + "\n" for r in heldout_rows))
    generated_s = time.perf_counter() - started

    every = target_features(model, train_rows + heldout_rows, args.features_cache)
    train = [(ids, feats, labels) for ids, feats, labels, _ in every[: len(train_rows)]]
    heldout = every[len(train_rows) :]
    if args.data_fraction < 1:
        chosen = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(args.seed))
        chosen = sorted(chosen[: max(1, round(args.data_fraction * len(train_rows)))].tolist())
        train_rows, train = [train_rows[i] for i in chosen], [train[i] for i in chosen]
    ranked = most_frequent_tokens(
        [r["token_ids"] for r in train_rows] + [lab.tolist() for _, _, lab in train], args.keep_vocab
    )
    head = EagleHead(model.config, ranked).attach(model)
    head.use_vocab(min(args.vocab_size, len(ranked)))
    feature_std = float(torch.cat([f for _, f, _ in train]).std())

    params = [p for p in head.parameters() if p.requires_grad]
    steps = args.epochs * cdiv(len(train), args.batch)
    optimizer, schedule = warmup_cosine(params, args.lr, steps, warmup=20)
    order_gen = torch.Generator().manual_seed(args.seed)
    progress = tqdm(total=steps, desc="training")
    for _ in range(args.epochs):
        order = torch.randperm(len(train), generator=order_gen).tolist()
        for start in range(0, len(order), args.batch):
            optimizer.zero_grad()
            hits = []
            for i in order[start : start + args.batch]:
                ids, feats, labels = train[i]
                loss, hit = head_loss(
                    head, feats, ids, labels, args.ce_weight, args.noise * feature_std, args.unroll
                )
                (loss / args.batch).backward()
                hits.append(float(hit))
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            progress.update()
            progress.set_postfix(loss=f"{float(loss):.3f}", top1=f"{sum(hits) / len(hits):.2f}")
    progress.close()

    with torch.no_grad():
        heldout_top1 = sum(
            float(head_loss(head, f, i, lab, 0.0, 0.0, 1, score_from=start - 1)[1])
            for i, f, lab, start in heldout
        ) / len(heldout)
    elapsed = time.perf_counter() - started
    metadata = {
        "command": "python -m solutions train-eagle " + " ".join(argv if argv is not None else sys.argv[2:]),
        "seed": str(args.seed),
        "draft_vocab_size": str(min(args.vocab_size, len(ranked))),
    }
    digest = save_head(head, args.out, metadata)
    per_prompt = round(sum(r["temperature"] > 0 for r in train_rows) / len({r["prompt"] for r in train_rows}))
    manifest = {
        **metadata,
        "file": args.out.name,
        "sha256": digest,
        "data": (
            f"{len({r['prompt'] for r in train_rows})} prompts of {', '.join(p.name for p in args.prompts)} "
            "(chat, code, prose; written for this repo) answered by the bundled SmolLM2-135M-Instruct "
            f"(float32, our engine, <= {args.max_tokens} tokens), "
            f"greedily and {per_prompt}x at temperature {args.temperature}: {len(train_rows)} answers, "
            f"{sum(len(r['token_ids']) for r in train_rows)} tokens in all, kept in responses.jsonl"
        ),
        "settings": {
            k: (_relative(v) if isinstance(v, Path) else [_relative(p) for p in v] if k == "prompts" else v)
            for k, v in vars(args).items()
        },
        "heldout_answer_top1": round(heldout_top1, 4),
        "generation_seconds": round(generated_s, 1),
        "total_seconds": round(elapsed, 1),
        "machine": machine_name("cpu"),
    }
    args.out.with_suffix(".json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"held-out first-draft agreement with the target, on the answers: {heldout_top1:.3f}")
    print(f"wrote {args.out} (sha256 {digest}) in {elapsed / 60:.1f} min")
    return 0
