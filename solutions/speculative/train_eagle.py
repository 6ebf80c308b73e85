"""Train the EAGLE draft head by self-distillation: ``python -m solutions.speculative.train_eagle``.

1. The target answers every prompt of ``data/spec/prompts.jsonl`` and ``prompts_templated.jsonl`` (chat, code,
   prose; written for this repo) with our own engine: once greedily, and ``--samples`` more times at
   ``--temperature`` (seeded), for contexts the greedy answers never reach; the token ids go to
   ``data/spec/responses.jsonl``.
2. One pass of the target over each whole sequence gives its features ``f_i`` (final-norm hidden states)
   and its greedy choice at every position.
3. The head learns EAGLE's loss on the pairs ``(f_i, token_{i+1})``: SmoothL1 regression of ``f_{i+1}``
   plus ``ce_weight`` x cross-entropy of the target's choice over the draft vocabulary; a second,
   unrolled pass feeds the head its own predictions (as it will see them when drafting a chain).
The head is written in float16 to ``data/spec/eagle_head.safetensors``, with ``eagle_head.json``
describing the run (command, seed, data, sha256, held-out accuracy).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..kernels.blocks import cdiv
from ..model.llama import LlamaModel
from .eagle import DATA_DIR, DraftKV, EagleHead, most_frequent_tokens, save_head, target_features


def read_prompts(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    bad = [r for r in rows if not {"kind", "prompt"} <= r.keys()]
    if bad:
        raise ValueError(f"{path}: every line needs 'kind' and 'prompt', got {bad[0]}")
    return rows


def generate_responses(
    llm, prompts: list[dict], max_tokens: int, samples: int = 0, temperature: float = 0.8, seed: int = 0
) -> list[dict]:
    """The target's greedy answer to every prompt, then ``samples`` sampled ones each (prompt ``i``'s seeded
    ``seed + 1000 * i``); each row gains ``token_ids`` (prompt + answer), ``prompt_len`` and ``temperature``."""
    from ..engine.sampling_params import SamplingParams

    texts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}]) for r in prompts]
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
    runs = [(0, llm.generate(texts, greedy))]
    if samples:
        sampled = [
            SamplingParams(
                n=samples, temperature=temperature, top_p=0.95, max_tokens=max_tokens, seed=seed + 1000 * i
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


@torch.no_grad()  # not inference_mode: the features feed the head's autograd graph
def features_and_labels(model: LlamaModel, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's features ``[L, H]`` and greedy next-token choices ``[L]`` over one whole sequence."""
    ids = torch.tensor(token_ids)
    hidden = model(ids, torch.arange(len(ids)), _causal_attention)
    features = target_features(model, hidden)
    return features, model.lm_head(features).argmax(-1)


def _causal_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One whole sequence's causal attention, q ``[L, Hq, D]``, k/v ``[L, Hkv, D]``, by torch's fused kernel."""
    q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)[0].transpose(0, 1)


def head_loss(
    head: EagleHead,
    features: torch.Tensor,
    token_ids: torch.Tensor,
    labels: torch.Tensor,
    ce_weight: float,
    noise: float,
    unroll: int,
    score_from: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE's loss on one sequence, and how often the head's first draft matches the target's choice.

    Pair ``i`` = ``(f_i, token_{i+1})`` predicts ``f_{i+1}`` and the target's choice at ``i + 1``
    (``labels[i + 1]``, mapped into the draft vocabulary; tokens outside it do not count for the CE).
    Pass ``u > 1`` replaces ``f_i`` by the previous pass's prediction of it. The agreement counts pairs
    ``score_from ..`` only (``prompt_len - 1``: the drafts a generation makes, not the chat template's
    system prompt, which every sequence shares and which is easy to guess).
    """
    length = features.shape[0] - 1
    target = features[1:]
    index_of = torch.full((int(head.lm_head_weight.shape[0]),), -100, dtype=torch.long)
    index_of[head.vocab_ids] = torch.arange(len(head.vocab_ids))
    draft_labels = index_of[labels[1:]]
    inputs = features[:-1] + noise * (torch.rand_like(features[:-1]) - 0.5)
    positions = torch.arange(length)
    total = torch.zeros(())
    first_hits = torch.zeros(())
    for step in range(unroll):
        predicted = head(inputs, token_ids[1:], positions, DraftKV().attend(["s"], [length]))
        logits = head.draft_logits(predicted)
        loss = F.smooth_l1_loss(predicted, target) + ce_weight * F.cross_entropy(
            logits, draft_labels, ignore_index=-100
        )
        total = total + loss / (step + 1)
        if step == 0:
            first_hits = (head.vocab_ids[logits.argmax(-1)] == labels[1:])[score_from:].float().mean()
        inputs = torch.cat([features[:1], predicted[:-1]])  # the head's own predictions replace f_1..f_{L-1}
    return total, first_hits


def _read_features_cache(path: Path | None, rows: list[dict]) -> list | None:
    """The cached ``(ids, features, labels, prompt_len)`` of ``rows``, or None when absent or not theirs."""
    if path is None or not path.exists():
        return None
    cached = torch.load(path)
    if len(cached) != len(rows) or any(
        ids.tolist() != r["token_ids"] or start != r["prompt_len"]
        for (ids, _, _, start), r in zip(cached, rows)
    ):
        print(f"{path} holds other sequences: computing the features again")
        return None
    return cached


def _relative(path: Path) -> str:
    """A path as the command line would give it from the repository's root (no machine-specific prefix)."""
    root = DATA_DIR.parents[1]
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(root) else str(path)


def _machine() -> str:
    names = [
        line.split(":", 1)[1].strip()
        for line in Path("/proc/cpuinfo").read_text().splitlines()
        if line.startswith("model name")
    ]
    return f"{len(names)} x {names[0]}" if names else "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions.speculative.train_eagle", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--prompts",
        type=Path,
        nargs="+",
        default=[DATA_DIR / "prompts.jsonl", DATA_DIR / "prompts_templated.jsonl"],
    )
    parser.add_argument(
        "--samples", type=int, default=1, help="sampled answers per prompt, besides the greedy one"
    )
    parser.add_argument("--temperature", type=float, default=0.8, help="for the sampled answers (top-p 0.95)")
    parser.add_argument("--heldout", type=Path, default=DATA_DIR / "heldout.jsonl")
    parser.add_argument("--out", type=Path, default=DATA_DIR / "eagle_head.safetensors")
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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--data-fraction",
        type=float,
        default=1.0,
        help="train on this share of the answers (a seeded random subset; the features pass still covers them "
        "all, so --features-cache serves every share): how agreement scales with data",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument(
        "--features-cache",
        type=Path,
        default=None,
        help="keep the target's features here (written once, read when its sequences match): skips a slow pass",
    )
    parser.add_argument(
        "--reuse-responses",
        action="store_true",
        help="train on data/spec/responses.jsonl as is (and score on heldout_responses.jsonl, when present)",
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
    torch.manual_seed(args.seed)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    from ..llm import LLM

    llm = LLM(device="cpu", dtype="float32", max_num_seqs=32, max_model_len=1024)
    model = llm.engine.model
    responses_path = args.out.parent / "responses.jsonl"
    heldout_path = args.out.parent / "heldout_responses.jsonl"
    if args.reuse_responses:
        train_rows = [json.loads(line) for line in responses_path.read_text().splitlines()]
    else:
        prompts = [row for path in args.prompts for row in read_prompts(path)]
        print(
            f"generating {1 + args.samples} answers to each of {len(prompts)} prompts ({args.max_tokens} tokens max)"
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

    cached = _read_features_cache(args.features_cache, train_rows + heldout_rows)
    if cached is None:
        every = [
            (torch.tensor(r["token_ids"]), *features_and_labels(model, r["token_ids"]), r["prompt_len"])
            for r in tqdm(train_rows + heldout_rows, "features")
        ]
        if args.features_cache is not None:
            torch.save(every, args.features_cache)
    else:
        every = cached
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
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    steps = args.epochs * cdiv(len(train), args.batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
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
        "command": "python -m solutions.speculative.train_eagle "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "seed": str(args.seed),
        "draft_vocab_size": str(min(args.vocab_size, len(ranked))),
    }
    digest = save_head(head, args.out, metadata)
    manifest = {
        **metadata,
        "file": args.out.name,
        "sha256": digest,
        "data": (
            f"{len({r['prompt'] for r in train_rows})} prompts of {', '.join(p.name for p in args.prompts)} (chat, "
            f"code, prose; written for this repo) answered by the bundled SmolLM2-135M-Instruct (float32, our "
            f"engine, <= {args.max_tokens} tokens), greedily and {args.samples}x at temperature {args.temperature}: "
            f"{len(train_rows)} answers, {sum(len(r['token_ids']) for r in train_rows)} tokens in all, kept in "
            "responses.jsonl"
        ),
        "settings": {
            k: (_relative(v) if isinstance(v, Path) else [_relative(p) for p in v] if k == "prompts" else v)
            for k, v in vars(args).items()
        },
        "heldout_answer_top1": round(heldout_top1, 4),
        "generation_seconds": round(generated_s, 1),
        "total_seconds": round(elapsed, 1),
        "machine": _machine(),
    }
    args.out.with_suffix(".json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"held-out first-draft agreement with the target, on the answers: {heldout_top1:.3f}")
    print(f"wrote {args.out} (sha256 {digest}) in {elapsed / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
