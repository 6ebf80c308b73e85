"""How to pick each next token and when to stop: vLLM's ``SamplingParams``, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20  # the most top alternatives a request may ask for per token (vLLM's default limit)


def check_num_logprobs(name: str, value: object) -> None:
    """Raise ValueError naming ``name`` unless ``value`` is None or an integer in ``[0, MAX_LOGPROBS]``."""
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_LOGPROBS:
        raise ValueError(f"{name} must be None or an integer in [0, {MAX_LOGPROBS}], got {value!r}")


@dataclass
class SamplingParams:
    """``temperature == 0`` means greedy decoding (top_p / top_k are then ignored).

    ``top_k == 0`` or ``-1`` disables top-k; ``top_p == 1`` disables nucleus sampling. ``stop`` strings
    end generation and are left out of the returned text; ``stop_token_ids`` end it too, like the model's own
    EOS ids, whose stop ``ignore_eos`` turns off (not these); a stop token's text is left out. ``seed`` makes
    sampling reproducible per request, whatever else shares the batch. ``n`` completions share the prompt's KV
    blocks (completion ``i`` is seeded ``seed + i``).

    ``min_p`` (vLLM's) keeps only the tokens at least that fraction as likely as the most likely one, before
    top-k and top-p (0 disables it).

    ``logprobs`` (vLLM's): return each sampled token's log-probability and the top ``logprobs`` alternatives;
    ``prompt_logprobs``: the same for every prompt token after the first (such a request bypasses the prefix
    cache). Each None (off) or an integer in [0, 20]; the distribution is the one after temperature
    (engine/logprobs.py says why).
    """

    n: int = 1

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(
                f"stop_token_ids must be a list of token ids (integers >= 0), got {self.stop_token_ids!r}"
            )
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be an integer >= -1 (0 or -1 disables it), got {self.top_k!r}")
        if not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        check_num_logprobs("logprobs", self.logprobs)
        check_num_logprobs("prompt_logprobs", self.prompt_logprobs)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
