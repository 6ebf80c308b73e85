"""Log-probabilities as vLLM returns them: of each sampled token (``SamplingParams.logprobs``) and of each
prompt token (``SamplingParams.prompt_logprobs``), each with the top N of its distribution.

Which distribution: ``log_softmax(logits / temperature)`` (temperature 0, greedy: the raw logits), before
min-p, top-k and top-p cut it. vLLM V1 calls this ``logprobs_mode="processed_logprobs"`` (its default,
"raw_logprobs", skips the temperature): ours is the distribution a sampled token is actually drawn from before
truncation, which is what issue 34 asks for and what a likelihood score at the request's temperature means.
Prompt logprobs use the same temperature.

Cost: nothing when no scheduled request asks (the engine calls ``record_*`` only then: no host sync, no
kernel); otherwise one log-softmax, one top-k and one device-to-host read per kind, for the rows that ask.

Where each entry comes from in a step's ``ModelOutput``:
- a drawn token: its request's last logits row (an unforked n > 1 completion: its first completion's row);
- a verified run of speculative drafts: the target's row before each accepted token, so ``span.start + i``
  for a chain's token ``i``; for a tree, the root's row then each accepted node's (``Speculator.token_rows``:
  a path's rows need not be consecutive); drafts never contribute;
- prompt token ``t`` (``t >= 1``): the hidden state of position ``t - 1`` through the LM head. A prefill
  chunk covering positions ``[s, e)`` gives tokens ``s + 1 .. min(e, P - 1)``; entries already recorded
  (a preempted request recomputing its prompt) are not recorded twice.

Prefix cache: a request asking for prompt logprobs **bypasses the prefix-cache lookup**
(``KVCacheManager.lookup_prefix``), so every prompt position is computed and its logits are at hand; its full
blocks still join the cache for other requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Logprob:
    """One token's log-probability; ``rank`` 1 is the most likely token (a sampled token's may exceed N)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


TokenLogprobs = dict[int, Logprob]


def wants_logprobs(plan) -> bool:
    """Whether any scheduled request asks for sampled-token logprobs."""
    return any(r.params.logprobs is not None for r in plan.scheduled)


def wants_prompt_logprobs(plan, advanced: bool = False) -> bool:
    """Whether any scheduled request asks for prompt logprobs and has prompt positions in this step
    (``advanced``: its ``num_computed`` already counts the step's tokens)."""
    return any(
        r.params.prompt_logprobs is not None
        and r.num_computed - advanced * plan.num_scheduled_tokens[r.request_id] < len(r.prompt_token_ids)
        for r in plan.scheduled
    )


def asks_for_logprobs(plan) -> bool:
    """Whether any scheduled request asks for log-probabilities of any kind."""
    return any(r.params.logprobs is not None or r.params.prompt_logprobs is not None for r in plan.scheduled)


def token_logprobs(
    logits: torch.Tensor, chosen: list[int], temperatures: list[float], nums: list[int], tokenizer=None
) -> list[TokenLogprobs]:
    """For each row ``i`` of ``logits`` ``[R, vocab]``: ``chosen[i]``'s log-probability and rank plus the top
    ``nums[i]`` tokens, under ``log_softmax(logits[i] / temperatures[i])`` (0: temperature 1). One read."""
    if not chosen:
        return []
    device = logits.device
    scale = torch.tensor([t if t > 0 else 1.0 for t in temperatures], dtype=torch.float32, device=device)
    logprobs = torch.log_softmax(logits.float() / scale[:, None], dim=-1)
    ids = torch.tensor(chosen, dtype=torch.int64, device=device)[:, None]
    chosen_lp = logprobs.gather(1, ids)
    rank = (logprobs > chosen_lp).sum(dim=1, keepdim=True) + 1
    top = max(nums)
    top_lp, top_ids = logprobs.topk(top, dim=-1) if top else (logprobs[:, :0], ids[:, :0])
    packed = torch.cat([chosen_lp.double(), rank.double(), top_lp.double(), top_ids.double()], dim=1)
    table = packed.tolist()  # the one read (float64 holds every token id exactly)
    decode = (lambda t: tokenizer.decode([t], skip_special_tokens=False)) if tokenizer else (lambda t: None)
    entries = []
    for token, num, row in zip(chosen, nums, table, strict=True):
        entry = {token: Logprob(row[0], int(row[1]), decode(token))}
        for j in range(num):
            token_j = int(row[2 + top + j])
            if token_j not in entry:
                entry[token_j] = Logprob(row[2 + j], j + 1, decode(token_j))
        entries.append(entry)
    return entries


def record_sampled(
    out,
    verified: dict[str, list[int]],
    new_tokens,
    tokenizer=None,
    tree_rows: dict[str, list[int]] | None = None,
) -> None:
    """Append each new token's entry to ``request.logprobs`` for the requests that ask, after the update
    path appended the tokens; entries past a stop (tokens ``append_tokens`` dropped) are cut off.
    ``tree_rows``: for a request that verified a tree, the offset in its span of each token's row."""
    asking, rows, chosen = [], [], []
    for request, tokens in new_tokens:
        if request.params.logprobs is None:
            continue
        spans = out.logits_spans  # a forked completion's first token: its group's first completion's span
        span = spans.get(request.request_id) or spans[request.group.requests[0].request_id]
        kept = len(request.output_token_ids) - len(request.logprobs)
        if request.request_id in verified:
            offsets = (tree_rows or {}).get(request.request_id, range(len(tokens)))
            picked = [span.start + i for i in offsets]
        else:
            picked = [span.stop - 1]
        picked = picked[:kept]
        asking.append((request, len(picked)))
        rows += picked
        chosen += tokens[: len(picked)]
    if not rows:
        return
    index = torch.tensor(rows, dtype=torch.int64, device=out.logits.device)
    params = [r.params for r, count in asking for _ in range(count)]
    entries = token_logprobs(
        out.logits.index_select(0, index),
        chosen,
        [p.temperature for p in params],
        [p.logprobs for p in params],
        tokenizer,
    )
    for request, count in asking:
        request.logprobs += entries[:count]
        entries = entries[count:]


def record_prompt(plan, out, model, tokenizer=None) -> None:
    """Append the prompt entries that this step's chunk of each asking request computed (see the module
    docstring), from ``out.hidden`` through ``model.logits``; the first entry (token 0) is None."""
    asking, positions, chosen = [], [], []
    offset = 0
    for request in plan.scheduled:
        count = plan.num_scheduled_tokens[request.request_id]
        first = request.num_computed - count  # the engine has already advanced num_computed
        num_prompt = len(request.prompt_token_ids)
        recorded = request.group.prompt_logprobs
        if request.params.prompt_logprobs is not None and recorded is not None and request.index == 0:
            if not recorded:
                recorded.append(None)
            targets = range(max(first + 1, len(recorded)), min(first + count, num_prompt - 1) + 1)
            asking.append((request, len(targets)))
            positions += [offset + t - 1 - first for t in targets]
            chosen += [request.prompt_token_ids[t] for t in targets]
        offset += count
    if not chosen:
        return
    index = torch.tensor(positions, dtype=torch.int64, device=out.hidden.device)
    logits = model.logits(out.hidden.index_select(0, index))
    params = [r.params for r, count in asking for _ in range(count)]
    entries = token_logprobs(
        logits, chosen, [p.temperature for p in params], [p.prompt_logprobs for p in params], tokenizer
    )
    for request, count in asking:
        request.group.prompt_logprobs += entries[:count]
        entries = entries[count:]
