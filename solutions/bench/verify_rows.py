"""What a verify pass costs against a plain decode step: one request's step over ``rows`` tokens.

Speculative decoding pays ``S = tau / (1 + k c + v)``, where ``v`` is what a pass over the root and its ``k``
drafts costs beyond a one-token step. ``verify_step_ms`` measures it on the engine itself: a request decodes
after a prompt, and at each step a stand-in drafter (``FixedDrafter``) proposes ``rows - 1`` tokens, so every
step is a verify pass over ``rows`` rows (the drafts are the last token repeated: their acceptance does not
change a pass's cost, only how far the request moves). ``rows = 1`` proposes nothing: the plain step, on the
same engine. The passes are timed as the engine runs them: the scheduler, the step's inputs, the forward over
every row (the linears at that many rows, the chain or tree attention, the LM head at every row) and the
verify's bookkeeping; drafting costs nothing here (``bench spec`` measures it).

Rounds alternate between the row counts (this machine is shared and noisy): per row count, the median of the
rounds' mean step times and their spread.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..llm import LLM
from ..sampling_params import SamplingParams
from ..speculative.drafter import Draft
from ..speculative.tree import DraftTree
from .decode_steps import random_prompts


class FixedDrafter:
    """Proposes ``num_tokens`` drafts every step, the request's last token repeated; as a tree
    (``propose_tree``), ``num_nodes`` nodes hung below the root ``top_k`` wide (``top_k = 1``: a chain).
    A bench's stand-in: it makes every step a verify pass of a chosen size, at no drafting cost."""

    needs_features = False

    def __init__(self, num_tokens: int, top_k: int = 1):
        self.num_tokens, self.top_k = num_tokens, top_k
        self.tree_depth = num_tokens

    def propose(
        self, request_ids: list[str], token_ids: list[list[int]], limits: list[int], temperatures: list[float]
    ) -> list[Draft]:
        return [
            Draft([ids[-1]] * max(0, min(self.num_tokens, limit))) for ids, limit in zip(token_ids, limits)
        ]

    def propose_tree(self, request_id: str, token_ids: list[int], num_nodes: int) -> DraftTree:
        """``num_nodes`` drafts, node ``i`` (from 1) a child of node ``max(0, i - top_k)``."""
        parents = [-1] + [max(0, i - self.top_k) for i in range(1, num_nodes + 1)]
        return DraftTree([token_ids[-1]] * (num_nodes + 1), parents, [0.0] * (num_nodes + 1))

    def observe(self, request_id: str, features: object, first_position: int) -> None:
        pass

    def ready(self, request_id: str, num_computed: int) -> bool:
        return True

    def free(self, request_id: str) -> None:
        pass


@dataclass
class RowsTiming:
    """Per row count: the median over rounds of a step's mean milliseconds, the rounds' min and max."""

    rows: int
    median_ms: float
    low_ms: float
    high_ms: float


def verify_engine(tree: bool = False, **options: object) -> LLM:
    """A one-sequence engine whose steps the bench can make verify passes (``speculative="ngram"`` gives it a
    speculator; ``verify_step_ms`` swaps in its own drafter). ``tree``: draft trees, verified with the tree
    mask, instead of chains."""
    spec = dict(speculative="eagle", speculative_tree_nodes=1) if tree else dict(speculative="ngram")
    return LLM(max_num_seqs=1, max_model_len=1024, **spec, **options)


def _round_ms(llm: LLM, rows: int, steps: int, context: int, tree: bool) -> float:
    """Mean milliseconds of ``steps`` steps of one request verifying ``rows - 1`` drafts after ``context``
    prompt tokens (the prefill and first step excluded)."""
    engine = llm.engine
    speculator = engine.speculator
    speculator.drafter = FixedDrafter(rows - 1, top_k=1)
    speculator.tree_nodes = rows - 1 if tree else 0
    prompt = random_prompts(1, context, engine.model_config.vocab_size, seed=rows)[0]
    params = SamplingParams(temperature=0, max_tokens=steps * rows + 2, ignore_eos=True)
    (request_id,) = engine.add_requests([prompt], [params])
    while not any(out.outputs[0].token_ids for out in engine.step()):
        pass  # the prefill, up to the first token: every step after it drafts (rows > 1)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    seconds = time.perf_counter() - start
    engine.abort(request_id)
    return seconds / steps * 1e3


def verify_step_ms(
    llm: LLM, row_counts: list[int], steps: int = 16, rounds: int = 5, context: int = 256, tree: bool = False
) -> list[RowsTiming]:
    """Step time of one request verifying ``rows - 1`` drafts (``rows`` tokens a pass) for each of
    ``row_counts``, rounds alternating between them; ``llm`` from ``verify_engine``."""
    if any(r < 1 for r in row_counts):
        raise ValueError(f"row counts must be >= 1, got {row_counts}")
    if max(row_counts) + context + steps * max(row_counts) + 4 > llm.engine.config.max_model_len:
        raise ValueError("context + steps x rows exceeds the engine's max_model_len: lower steps or context")
    for rows in row_counts:  # warm-up: first-call set-up, layouts made, compiled paths loaded
        _round_ms(llm, rows, 2, context, tree)
    samples: dict[int, list[float]] = {rows: [] for rows in row_counts}
    for _ in range(rounds):
        for rows in row_counts:
            samples[rows].append(_round_ms(llm, rows, steps, context, tree))
    return [RowsTiming(r, statistics.median(s), min(s), max(s)) for r, s in samples.items()]
